"""The engine's read order with peers: node cache, then peers, then bundles, then the store.

Nodes here are separate node-cache directories in one process; a small in-test PeerSource
stands in for the replica index and the peers' daemons (those are tested with Redis and real
daemons in the p2p tests). It serves bytes straight from the publishing node's cache entry and
verifies them against the registered SHA-256, as the PeerSource contract requires.
"""

import hashlib
import logging
import os
import threading

from transfer import Engine, Session, Settings, Transfer, parse_url
from transfer.cache import cache_from_settings
from transfer.peers import PeerSource, Replica


def s3(bucket, key):
    return parse_url(f"s3://test@minio/{bucket}/{key}", site_label="minio")


class Pool:
    """The shared replica index: key -> (replica, the node cache that holds it)."""

    def __init__(self):
        self.entries = {}
        self.lock = threading.Lock()


class Node(PeerSource):
    def __init__(self, pool, cache, corrupt=False, broken=False):
        self.pool, self.cache, self.corrupt, self.broken = pool, cache, corrupt, broken
        self.known = {}
        self.lookups, self.fetches, self.published = [], [], []

    def lookup(self, keys):
        if self.broken:
            raise ConnectionError("index down")
        self.lookups.append(list(keys))
        with self.pool.lock:
            self.known = {k: self.pool.entries[k] for k in keys if k in self.pool.entries}

    def holds(self, key):
        return key in self.known

    def fetch(self, key, sink):
        self.fetches.append(key)
        replica, owner = self.known[key]
        with owner.pin(key) as path:
            data = open(path, "rb").read()
        if self.corrupt:
            data = bytes([data[0] ^ 1]) + data[1:]
        digest = hashlib.sha256()
        for i in range(0, len(data), 7):  # streamed in pieces, as a real peer would
            sink.write(data[i:i + 7])
            digest.update(data[i:i + 7])
        if len(data) != replica.size or digest.hexdigest() != replica.sha256:
            sink.reset()
            return None
        return len(data)

    def publish(self, replicas):
        self.published.append(list(replicas))
        with self.pool.lock:
            for r in replicas:
                self.pool.entries[r.key] = (r, self.cache)


def run(env, ops, cache, peers, **settings):
    with Session(Settings(threads=3, **settings), env) as session:
        return Engine(session, cache=cache, peers=peers).run(ops)


def new_cache(env, path):
    return cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(path), "HOME": env["HOME"]})


def produce(env, tmp_path, bucket, pool, names, **settings):
    """Node A uploads ``names`` (write-through into its cache) and publishes them."""
    cache = new_cache(env, tmp_path / "cache-a")
    node = Node(pool, cache)
    (tmp_path / "out").mkdir(exist_ok=True)
    ops = []
    for name in names:
        (tmp_path / "out" / name).write_bytes(os.urandom(3000) + name.encode())
        ops.append(Transfer((parse_url(f"file://{tmp_path}/out/{name}"),), s3(bucket, f"run/{name}")))
    assert all(r.ok for r in run(env, ops, cache, node, **settings))
    return cache, node


def reads(tmp_path, bucket, job, names):
    return [Transfer((s3(bucket, f"run/{n}"),), parse_url(f"file://{tmp_path}/{job}/{n}")) for n in names]


def test_producer_publishes_what_it_uploaded_with_the_sha256_the_cache_computed(proxied, bucket, tmp_path):
    proxy, env = proxied
    pool = Pool()
    cache, node = produce(env, tmp_path, bucket, pool, ["a.fits", "b.fits"])
    [batch] = node.published  # one registration round trip for the batch
    by_key = {r.key: r for r in batch}
    assert len(by_key) == 2
    for name in ("a.fits", "b.fits"):
        data = (tmp_path / "out" / name).read_bytes()
        [replica] = [r for r in batch if r.key.endswith(name)]
        assert replica == Replica(replica.key, len(data), hashlib.sha256(data).hexdigest())


def test_consumer_on_another_node_reads_from_the_peer_without_a_store_request(proxied, bucket, tmp_path):
    proxy, env = proxied
    pool = Pool()
    names = [f"f{i}.fits" for i in range(6)]
    produce(env, tmp_path, bucket, pool, names)
    proxy.reset_counters()
    node_b = Node(pool, new_cache(env, tmp_path / "cache-b"))
    results = run(env, reads(tmp_path, bucket, "job-b", names), node_b.cache, node_b)
    assert all(r.ok for r in results)
    assert proxy.snapshot()["requests"] == 0
    assert len(node_b.lookups) == 1 and sorted(node_b.fetches) == sorted(node_b.lookups[0])
    for n in names:
        assert (tmp_path / "job-b" / n).read_bytes() == (tmp_path / "out" / n).read_bytes()
    # B's cache now holds them and B registered them: a third node may fetch from B as well.
    assert len(node_b.published) == 1 and len(node_b.published[0]) == len(names)


def test_wrong_bytes_from_a_peer_are_never_delivered_the_store_serves_them(proxied, bucket, tmp_path):
    proxy, env = proxied
    pool = Pool()
    produce(env, tmp_path, bucket, pool, ["x.fits"])
    proxy.reset_counters()
    node_b = Node(pool, new_cache(env, tmp_path / "cache-b"), corrupt=True)
    [result] = run(env, reads(tmp_path, bucket, "job-b", ["x.fits"]), node_b.cache, node_b)
    assert result.ok
    assert (tmp_path / "job-b" / "x.fits").read_bytes() == (tmp_path / "out" / "x.fits").read_bytes()
    assert node_b.fetches and proxy.snapshot()["requests"] == 1
    # The entry B's cache kept is the store's bytes, not the peer's.
    [replica] = node_b.published[0]
    assert replica.sha256 == hashlib.sha256((tmp_path / "out" / "x.fits").read_bytes()).hexdigest()


def test_an_index_failure_falls_back_to_the_store_with_one_warning(proxied, bucket, tmp_path, caplog):
    proxy, env = proxied
    pool = Pool()
    names = ["p.fits", "q.fits", "r.fits"]
    produce(env, tmp_path, bucket, pool, names)
    node_b = Node(pool, new_cache(env, tmp_path / "cache-b"), broken=True)
    with caplog.at_level(logging.WARNING, logger="transfer.peers"):
        results = run(env, reads(tmp_path, bucket, "job-b", names), node_b.cache, node_b)
    assert all(r.ok for r in results)
    warnings = [r for r in caplog.records if r.name == "transfer.peers"]
    assert len(warnings) == 1 and "index down" in warnings[0].getMessage()
    assert node_b.published == []  # a broken source is not called again in the batch


def test_peer_held_files_are_not_fetched_through_bundles(proxied, bucket, tmp_path):
    proxy, env = proxied
    pool = Pool()
    names = [f"m{i:02d}" for i in range(10)]
    produce(env, tmp_path, bucket, pool, names, bundle=True)
    proxy.reset_counters()
    node_b = Node(pool, new_cache(env, tmp_path / "cache-b"))
    results = run(env, reads(tmp_path, bucket, "job-b", names), node_b.cache, node_b, bundle=True)
    assert all(r.ok for r in results)
    assert proxy.snapshot()["requests"] == 0  # peers come before bundles
    assert sorted(node_b.fetches) == sorted(node_b.lookups[0])


def test_without_a_node_cache_peers_are_never_asked(proxied, bucket, tmp_path):
    proxy, env = proxied
    pool = Pool()
    produce(env, tmp_path, bucket, pool, ["solo.fits"])
    node_b = Node(pool, None)
    [result] = run(env, reads(tmp_path, bucket, "job-b", ["solo.fits"]), None, node_b)
    assert result.ok and node_b.lookups == [] and node_b.fetches == []
