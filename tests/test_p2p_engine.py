"""The engine with the real peer stack on loopback: MinIO behind a counting proxy, one
redis-server, three nodes each with its own cache directory and daemon (TLS, pool token).
The network-namespace version of the pool is tests/test_p2p_netns.py."""

from __future__ import annotations

import logging
import os
import threading
import uuid

import pytest
import redis

from pegasus_cloudio.p2p.serve import Daemon
from pegasus_cloudio.p2p.server import ServeConfig
from pegasus_cloudio.p2p.settings import DaemonSettings
from pegasus_cloudio_testbed.certs import make_tls_files
from pegasus_cloudio_testbed.redis import RedisServer
from transfer import Engine, Session, Settings, Transfer, parse_url
from transfer.p2p import describer
from transfer.p2p.client import PeerClient
from transfer.p2p.config import node_id
from transfer.p2p.index import NodeInfo, PeerIndex
from transfer.p2p.source import PeerIndexSource
from p2p_support import TOKEN, client_config, new_cache


@pytest.fixture(scope="module")
def redis_server():
    with RedisServer() as server:
        yield server


class Node:
    """One worker: a cache directory, its daemon (heartbeating into Redis) and peer sources."""

    def __init__(self, name, tmp_path, redis_url, tls, namespace):
        self.name, self.tls = name, tls
        self.cache = new_cache(tmp_path / f"cache-{name}")
        self.index = PeerIndex(redis.Redis.from_url(redis_url), namespace)
        serve = ServeConfig({"alice": self.cache.directory}, TOKEN, ("127.0.0.1", 0),
                            cert_file=str(tls.cert), key_file=str(tls.key))
        self.daemon = Daemon(DaemonSettings(serve, name, "", "", redis_url, False, namespace, 30.0),
                             self.index).start()

    def source(self, claim_seconds=0.0, index=None, **kw):
        return PeerIndexSource(index or self.index, PeerClient(client_config(self.tls, node=self.name, **kw)),
                               node_id(self.name, "alice"), claim_seconds=claim_seconds,
                               describe=describer(self.cache), grant=self.cache.grant)

    def run(self, env, ops, source=None, **settings):
        source = source or self.source()
        try:
            with Session(Settings(threads=4, **settings), env) as session:
                return Engine(session, cache=self.cache, peers=source).run(ops)
        finally:
            source.close()


@pytest.fixture
def pool(tmp_path, redis_server):
    tls = make_tls_files(tmp_path / "tls")
    namespace = f"t{uuid.uuid4().hex[:8]}"
    nodes = [Node(n, tmp_path, redis_server.url, tls, namespace) for n in "abc"]
    yield nodes
    for node in nodes:
        node.daemon.stop()


def s3(bucket, key):
    return parse_url(f"s3://test@minio/{bucket}/{key}", site_label="minio")


def reads(tmp_path, bucket, job, names):
    return [Transfer((s3(bucket, f"in/{n}"),), parse_url(f"file://{tmp_path}/{job}/{n}")) for n in names]


def upload(env, tmp_path, bucket, names, size=5000):
    (tmp_path / "src").mkdir(exist_ok=True)
    ops = []
    for n in names:
        (tmp_path / "src" / n).write_bytes(os.urandom(size))
        ops.append(Transfer((parse_url(f"file://{tmp_path}/src/{n}"),), s3(bucket, f"in/{n}")))
    with Session(Settings(), env) as session:
        assert all(r.ok for r in Engine(session).run(ops))


def test_a_file_read_on_a_then_b_and_c_costs_one_store_get(pool, proxied, bucket, tmp_path):
    proxy, env = proxied
    names = ["f1.fits", "f2.fits", "f3.fits"]
    upload(env, tmp_path, bucket, names)
    proxy.reset_counters()
    a, b, c = pool
    assert all(r.ok for r in a.run(env, reads(tmp_path, bucket, "ja", names)))
    assert all(r.ok for r in b.run(env, reads(tmp_path, bucket, "jb", names)))
    assert all(r.ok for r in c.run(env, reads(tmp_path, bucket, "jc", names)))
    assert proxy.requests_by_method == {"GET": len(names)}  # one store GET per file, by A
    for job in ("jb", "jc"):
        for n in names:
            assert (tmp_path / job / n).read_bytes() == (tmp_path / "src" / n).read_bytes()


def test_a_file_produced_on_a_is_read_on_b_and_c_without_store_requests(pool, proxied, bucket, tmp_path):
    proxy, env = proxied
    a, b, c = pool
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "p.dat").write_bytes(os.urandom(70_000))
    up = Transfer((parse_url(f"file://{tmp_path}/out/p.dat"),), s3(bucket, "in/p.dat"))
    assert a.run(env, [up])[0].ok  # the upload writes through A's cache and registers it
    proxy.reset_counters()
    assert b.run(env, reads(tmp_path, bucket, "jb", ["p.dat"]))[0].ok
    assert c.run(env, reads(tmp_path, bucket, "jc", ["p.dat"]))[0].ok
    assert proxy.snapshot()["requests"] == 0
    assert (tmp_path / "jc" / "p.dat").read_bytes() == (tmp_path / "out" / "p.dat").read_bytes()


def test_nodes_starting_together_read_each_file_from_the_store_once(pool, proxied, bucket, tmp_path):
    proxy, env = proxied
    names = [f"s{i:02d}" for i in range(24)]
    upload(env, tmp_path, bucket, names)
    proxy.reset_counters()
    outcomes = {}
    barrier = threading.Barrier(len(pool))

    def job(node):
        barrier.wait()
        outcomes[node.name] = node.run(env, reads(tmp_path, bucket, f"j{node.name}", names),
                                       node.source(claim_seconds=10))
    threads = [threading.Thread(target=job, args=(n,)) for n in pool]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.ok for rs in outcomes.values() for r in rs)
    assert proxy.requests_by_method.get("GET", 0) <= len(names) * 1.05
    for n in names:
        assert (tmp_path / "jc" / n).read_bytes() == (tmp_path / "src" / n).read_bytes()


def test_redis_down_falls_back_to_the_store_with_one_warning(pool, proxied, bucket, tmp_path, caplog):
    proxy, env = proxied
    names = ["r1", "r2", "r3", "r4"]
    upload(env, tmp_path, bucket, names)
    a, b, _ = pool
    assert all(r.ok for r in a.run(env, reads(tmp_path, bucket, "ja", names)))
    with RedisServer() as doomed:
        index = PeerIndex(redis.Redis.from_url(doomed.url, socket_connect_timeout=0.5, socket_timeout=0.5), "x")
    proxy.reset_counters()
    with caplog.at_level(logging.WARNING):
        results = b.run(env, reads(tmp_path, bucket, "jb", names), b.source(claim_seconds=5, index=index))
    assert all(r.ok for r in results)
    assert proxy.requests_by_method == {"GET": len(names)}
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "peer index unavailable" in warnings[0], warnings


def test_a_node_whose_heartbeat_expired_is_never_asked(pool, proxied, bucket, tmp_path):
    proxy, env = proxied
    upload(env, tmp_path, bucket, ["h1"])
    a, b, _ = pool
    assert a.run(env, reads(tmp_path, bucket, "ja", ["h1"]))[0].ok
    a.daemon._stop.set()  # the heartbeat thread ends; the entry then expires
    a.index.heartbeat(a.daemon.nodes, -1)  # as if 30 s had passed without a beat
    proxy.reset_counters()
    source = b.source()
    assert b.run(env, reads(tmp_path, bucket, "jb", ["h1"]), source)[0].ok
    assert proxy.requests_by_method == {"GET": 1}
    assert source.counters["peer_failures"] == 0 and source.counters["peer_hits"] == 0


def test_malformed_entries_and_peers_outside_the_networks_fall_back_to_the_store(pool, proxied, bucket, tmp_path,
                                                                                caplog):
    proxy, env = proxied
    names = ["m1", "m2"]
    upload(env, tmp_path, bucket, names)
    a, b, _ = pool
    assert all(r.ok for r in a.run(env, reads(tmp_path, bucket, "ja", names)))
    key1, key2 = (a.cache.entries()[i].key for i in range(2))
    with Session(Settings(), env) as session:  # the scope the engine reads these keys under
        url = s3(bucket, "in/m1")
        scope = session.backend(url).peer_scope(url)
    a.index._redis.hset(a.index.entry_key(key1, scope), "a/alice", "not a size and digest")
    a.index.heartbeat([NodeInfo("far/alice", "https://203.0.113.9:8470/v1/alice")], 30)
    a.index._redis.hdel(a.index.entry_key(key2, scope), "a/alice")
    a.index._redis.hset(a.index.entry_key(key2, scope), "far/alice",  # the only holder
                        scope.seal("far/alice", key2, 5000, "0" * 64))
    proxy.reset_counters()
    with caplog.at_level(logging.WARNING):
        results = b.run(env, reads(tmp_path, bucket, "jb", names))
    assert all(r.ok for r in results)
    for n in names:
        assert (tmp_path / "jb" / n).read_bytes() == (tmp_path / "src" / n).read_bytes()
    assert proxy.requests_by_method == {"GET": 2}
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "malformed replica entry 'a/alice'" in text
    assert "outside the pool's networks (203.0.113.9)" in text
