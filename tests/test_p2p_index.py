"""The replica index on a real redis-server (one node and a three-master cluster)."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Iterator

import pytest
import redis
import redis.cluster

from pegasus_cloudio_testbed.redis import RedisCluster, RedisServer
from transfer.p2p.index import Claim, NodeInfo, PeerIndex
from transfer.peers import Replica, derive_scope

SHA = "ab" * 32
SCOPE = derive_scope("alice-secret-key", "s3", "http://store", "alice", "bucket")
OTHER = derive_scope("mallory-secret-key", "s3", "http://store", "mallory", "bucket")


def R(key, size, sha=SHA, scope=SCOPE):
    return Replica(key, size, sha, scope)


def scoped(*keys, scope=SCOPE):
    return {k: scope for k in keys}


@pytest.fixture(scope="module")
def redis_single() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as cluster:
        yield cluster


@pytest.fixture(params=["single", "cluster"])
def client(request):
    if request.param == "single":
        c = redis.Redis.from_url(request.getfixturevalue("redis_single").url)
    else:
        c = redis.cluster.RedisCluster.from_url(request.getfixturevalue("redis_cluster").url)
    c.flushall() if request.param == "single" else c.flushall(target_nodes=redis.cluster.RedisCluster.ALL_NODES)
    yield c
    c.close()


class CountingClient:
    """Counts pipelines executed and direct commands (each one round trip, or one per master)."""

    def __init__(self, inner):
        self.inner, self.pipelines, self.direct = inner, 0, 0

    def pipeline(self, **kw):
        pipe = self.inner.pipeline(**kw)
        real = pipe.execute

        def execute(*a, **k):
            self.pipelines += 1
            return real(*a, **k)
        pipe.execute = execute
        return pipe

    def __getattr__(self, name):
        self.direct += 1
        return getattr(self.inner, name)


def nodes(index, *names, ttl=30.0):
    index.heartbeat([NodeInfo(n, f"https://10.0.0.{i + 1}:8470/v1/alice", n, "r1") for i, n in enumerate(names)], ttl)


def test_a_batch_of_a_thousand_keys_is_one_lookup_and_one_registration(client):
    counting = CountingClient(client)
    index = PeerIndex(counting, "t")
    nodes(index, "a/alice")
    keys = [f"s3://bucket/run/f{i:04d}#etag{i}" for i in range(1000)]
    index.register("a/alice", [R(k, i) for i, k in enumerate(keys)])
    found = index.lookup(scoped(*keys, "s3://bucket/missing#x"))
    assert counting.pipelines == 2
    assert set(found.holders) == set(keys) and not found.problems
    h = found.holders[keys[7]]
    assert [(x.info.node, x.info.url, x.size, x.sha256) for x in h] == [
        ("a/alice", "https://10.0.0.1:8470/v1/alice", 7, SHA)]


def test_keys_spread_over_every_master_of_the_cluster(redis_cluster):
    c = redis.cluster.RedisCluster.from_url(redis_cluster.url)
    index = PeerIndex(c, "spread")
    slots = {c.keyslot(index.entry_key(f"k{i}", SCOPE)) for i in range(200)}
    owners = {c.get_node_from_key(index.entry_key(f"k{i}", SCOPE)).port for i in range(200)}
    assert len(slots) == 16 and owners == set(redis_cluster.ports)


def test_a_node_whose_heartbeat_expired_is_not_returned(client):
    index = PeerIndex(client, "t")
    nodes(index, "a/alice", "b/alice", ttl=60)
    index.register("a/alice", [R("k", 3)])
    index.register("b/alice", [R("k", 3)])
    assert [h.info.node for h in index.lookup(scoped("k")).holders["k"]] == ["a/alice", "b/alice"]
    nodes(index, "a/alice", ttl=0.3)  # a's last heartbeat: its entry outlives it in the table
    # expiry is judged by the Redis server's clock, not this process's: wait for it, bounded
    # (a fixed sleep failed under load when the lookup itself came late)
    deadline = time.monotonic() + 30
    while [h.info.node for h in index.lookup(scoped("k")).holders["k"]] != ["b/alice"]:
        assert time.monotonic() < deadline, "a/alice's heartbeat never expired"
        time.sleep(0.05)
    assert client.hget(index.nodes_key, "a/alice") is not None  # ignored by its time, not deleted
    index.retire(["b/alice"])
    assert index.lookup(scoped("k")).holders == {} and index.live_nodes() == {}


def test_malformed_and_conflicting_entries_are_reported_and_ignored(client):
    index = PeerIndex(client, "t")
    nodes(index, "a/alice", "b/alice", "c/alice", "d/alice")
    client.hset(index.nodes_key, "bad/alice", "9999999999 {not json")
    def value(node, sha=SHA):
        return SCOPE.seal(node, "k", 5, sha)
    client.hset(index.entry_key("k", SCOPE), mapping={
        "a/alice": value("a/alice"), "b/alice": value("b/alice"), "c/alice": value("c/alice", "cd" * 32),
        "d/alice": "five bytes", "bad/alice": value("bad/alice")})
    found = index.lookup(scoped("k"))
    assert [h.info.node for h in found.holders["k"]] == ["a/alice", "b/alice"]
    text = "\n".join(found.problems)
    assert "malformed node entry 'bad/alice'" in text
    assert "malformed replica entry 'd/alice' for 'k'" in text
    assert "disagree" in text


def test_the_first_claim_wins_and_registration_ends_it(client):
    index = PeerIndex(client, "t")
    nodes(index, "a/alice", "b/alice")
    first = index.lookup(scoped("k1", "k2"), Claim("a/alice", 5, ["k1", "k2"]))
    second = index.lookup(scoped("k1", "k2"), Claim("b/alice", 5, ["k1", "k2"]))
    assert first.won == ["k1", "k2"] and first.in_flight == {}
    assert second.won == [] and second.in_flight == {"k1": "a/alice", "k2": "a/alice"}
    index.register("a/alice", [R("k1", 1)])
    index.release("k2", SCOPE, "a/alice")
    third = index.lookup(scoped("k1", "k2"), Claim("b/alice", 5, ["k2"]))
    assert [h.info.node for h in third.holders["k1"]] == ["a/alice"]
    assert third.won == ["k2"] and third.in_flight == {}


def test_unregister_drops_one_nodes_entry(client):
    index = PeerIndex(client, "t")
    nodes(index, "a/alice", "b/alice")
    index.register("a/alice", [R("k", 1)])
    index.register("b/alice", [R("k", 1)])
    index.unregister("a/alice", scoped("k"))
    assert [h.info.node for h in index.lookup(scoped("k")).holders["k"]] == ["b/alice"]
    expires, _, text = client.hget(index.nodes_key, "a/alice").decode().partition(" ")
    assert json.loads(text)["url"].endswith("/v1/alice") and float(expires) > time.time() - 60


def test_an_entry_forged_by_another_identity_is_ignored(client):
    """Mallory (another store identity) registers her own bytes under alice's key: in her
    own scope's entry (which alice never reads), in alice's entry with a tag she cannot
    compute, and in the entry today's index used (the key's plain SHA-256)."""
    index = PeerIndex(client, "t")
    nodes(index, "a/alice", "m/mallory")
    index.register("a/alice", [R("k", 5)])
    index.register("m/mallory", [R("k", 5, "cd" * 32, OTHER)])
    import hashlib
    plain = hashlib.sha256(b"k").hexdigest()[:32]
    for name in (index.entry_key("k", SCOPE), f"t:{{{plain[0]}}}:r:{plain}"):
        client.hset(name, "m/mallory", f"{'0' * 16} {'cd' * 32} {'0' * 32}")
    found = index.lookup(scoped("k"))
    assert [(h.info.node, h.sha256) for h in found.holders["k"]] == [("a/alice", SHA)]
    assert "unauthenticated replica entry 'm/mallory'" in "\n".join(found.problems)
    assert [(h.info.node, h.sha256) for h in index.lookup(scoped("k", scope=OTHER)).holders["k"]] == [
        ("m/mallory", "cd" * 32)]  # and mallory's own entry is hers alone


def test_junk_written_into_the_index_is_not_read_whole_by_jobs(client):
    """Anyone who can write Redis (every job) floods the node table and alice's entry with
    huge values and many fields: a job's lookup still finds alice's holder and reads a
    bounded reply (a denial of sharing at most, never of memory)."""
    import tracemalloc
    index = PeerIndex(client, "t")
    nodes(index, "a/alice")
    index.register("a/alice", [R("k", 5)])
    huge = "9999999999 " + "x" * (24 << 20)
    client.hset(index.nodes_key, "m/mallory", huge)
    client.hset(index.entry_key("k", SCOPE), "m/huge", huge)
    client.set(index.claim_key("k2", SCOPE), huge)
    client.hset(index.entry_key("k3", SCOPE), mapping={f"m/{i}": "1" for i in range(20000)})  # may hide holders
    tracemalloc.start()
    try:
        found = index.lookup(scoped("k", "k2", "k3"), Claim("a/alice", 5, ["k2"]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [h.info.node for h in found.holders["k"]] == ["a/alice"]
    assert found.won == [] and "k2" not in found.in_flight  # a junk claim is no claim
    assert peak < 4 << 20, f"a lookup read {peak >> 20} MiB"
    assert sum("oversized" in p for p in found.problems) == 4  # node table, k, k2's claim, k3


def test_the_index_holds_no_checksum_or_size_of_a_users_file(client):
    """Every job can read Redis: what it holds of alice's files must be meaningless without
    her scope (a SHA-256 in clear would tell anyone whether alice holds a known file)."""
    index = PeerIndex(client, "t")
    nodes(index, "a/alice")
    sha = hashlib.sha256(b"alice's private data").hexdigest()
    index.register("a/alice", [R("k", 20, sha)])
    raw = client.hgetall(index.entry_key("k", SCOPE))
    assert list(raw) == [b"a/alice"]
    value = raw[b"a/alice"].decode()
    assert sha not in value and "20" not in value.split(" ")
    assert [(h.size, h.sha256) for h in index.lookup(scoped("k")).holders["k"]] == [(20, sha)]


def test_sealed_values_and_names_are_those_earlier_versions_made():
    """Nodes of two versions share one index: names, seals and tags must not change."""
    from transfer.peers import Scope
    scope = Scope(bytes(range(32)))
    sealed = ("06e2e6fa34ad4dea 36d37780ea68149b8564b4b22eadae00e271de7b84145fd59972f830ac807d8f "
              "69638531ad519bf5e3f21f55bd2b99ae")
    assert scope.seal("n0/alice", "s3://b/k", 123456789, "ab" * 32) == sealed
    assert scope.unseal("n0/alice", "s3://b/k", sealed) == (123456789, "ab" * 32)
    assert scope.open_sealed("n0/alice", "s3://b/k", sealed) == (123456789, "ab" * 32)
    assert scope.index_name("s3://b/k") == "22f93c943d1721645f67eb1f8b2936a0"
    assert scope.capability("s3://b/k") == "494bced2295ba5fddc7587aaeb19d8bea9f8eadee23ad9fe01ef0084ce491d51"
    assert scope.entry_mac("n0/alice", "s3://b/k", 1, "cd" * 32) == "8532e4884e92c344798b3aad122ab83f"


@pytest.mark.parametrize("change", ["upper", "0x", "underscore", "plus", "blank", "non-ascii", "longer", "tag"])
def test_a_lone_entry_in_any_other_form_is_reported_and_not_used(client, change):
    """The one-holder short path of a lookup takes only the exact form a seal has; anything
    else (even the same numbers written otherwise) is reported as the long path reports it."""
    index = PeerIndex(client, "t")
    nodes(index, "a/alice")
    good = SCOPE.seal("a/alice", "k", 5, SHA)
    bad = {"upper": good[:16].upper() + good[16:], "0x": "0x" + good[2:], "underscore": good[:7] + "_" + good[8:],
           "plus": "+" + good[1:], "blank": good[:16] + "  " + good[18:], "non-ascii": good[:-1] + "\u00e9",
           "longer": good + "0", "tag": good[:-1] + ("0" if good[-1] != "0" else "1")}[change]
    client.hset(index.entry_key("k", SCOPE), "a/alice", bad)
    found = index.lookup(scoped("k"))
    assert found.holders == {} and len(found.problems) == 1, found.problems
    expected = "unauthenticated replica entry" if change == "tag" else "malformed replica entry"
    assert found.problems[0].startswith(f"{expected} 'a/alice' for 'k'"), found.problems
    client.hset(index.entry_key("k", SCOPE), "a/alice", good)
    assert [(h.size, h.sha256) for h in index.lookup(scoped("k")).holders["k"]] == [(5, SHA)]
