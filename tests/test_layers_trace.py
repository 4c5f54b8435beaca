"""Reads walk the layer stack one way (issue 36): a trace of every call into ``transfer``
modules, taken while real reads run (MinIO, redis-server, a peer daemon over TLS), shows each
call stack going down Engine -> cache -> peers -> bundles -> store -> backend -> http and never
back up.

The engine runs inline (one thread), so a stack seen at a request is the whole way down. A
stack is read down to its first ``transfer.http`` frame: below it, http's resumable send calls
the backend's own request function back (a backend/http seam, not a read layer).
"""

from __future__ import annotations

import sys
import threading
import uuid
from typing import Iterator, List, Optional, Set, Tuple

import boto3
import pytest
import redis

from pegasus_cloudio.p2p.serve import Daemon
from pegasus_cloudio.p2p.server import ServeConfig
from pegasus_cloudio.p2p.settings import DaemonSettings
from pegasus_cloudio_testbed.certs import make_tls_files
from pegasus_cloudio_testbed.redis import RedisServer
from transfer import Engine, InlineExecutor, Session, Settings, Transfer, parse_url
from transfer.p2p import describer
from transfer.p2p.client import PeerClient
from transfer.p2p.config import node_id
from transfer.p2p.index import PeerIndex
from transfer.p2p.source import PeerIndexSource
from p2p_support import TOKEN, client_config, new_cache


class CountingExecutor(InlineExecutor):
    """Runs tasks inline and counts them: each per-file transfer is one task."""

    submitted = 0

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)

# The floors, top down. A module of none of them (errors, urls, locks, ...) is a tool any floor uses.
FLOORS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("engine", ("transfer.engine",)),
    ("cache", ("transfer.layers.cache", "transfer.layers.sharing", "transfer.cache.")),
    ("peers", ("transfer.layers.peers", "transfer.peers", "transfer.p2p.")),
    ("bundles", ("transfer.layers.bundles", "transfer.bundles.")),
    ("store", ("transfer.layers.store", "transfer.ranged", "transfer.atomic")),
    ("backend", ("transfer.backends.",)),
    ("http", ("transfer.http.",)),
)


# What a layer hands down as ``get``'s sink (the cache entry's temp file) is written by the layers
# below it as a file is: data passed down, not a call up.
SINKS = ("transfer.cache.sink",)


def floor(module: str) -> Optional[int]:
    if module in SINKS:
        return None
    for rank, (_, prefixes) in enumerate(FLOORS):
        if any(module == p or (p.endswith(".") and module.startswith(p)) for p in prefixes):
            return rank
    return None


class Trace:
    """Every distinct stack of floors (outermost first, repeats collapsed) seen at a call."""

    def __init__(self) -> None:
        self.stacks: Set[Tuple[int, ...]] = set()

    def _profile(self, frame, event, arg):  # type: ignore[no-untyped-def]
        if event != "call":
            return
        ranks: List[int] = []
        f = frame
        while f is not None:
            rank = floor(f.f_globals.get("__name__", ""))
            if rank is not None and (not ranks or ranks[-1] != rank):
                ranks.append(rank)
            f = f.f_back
        if ranks:
            down = list(reversed(ranks))
            http = len(FLOORS) - 1
            # transfer.http is the floor the stack ends on; its retry helper calls back the
            # backend's request function (transfer.http.resume), a seam below the read layers
            self.stacks.add(tuple(down[:down.index(http) + 1] if http in down else down))

    def __enter__(self) -> "Trace":
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)

    def back_arrows(self) -> List[str]:
        """Stacks in which a floor calls one above it."""
        names = [name for name, _ in FLOORS]
        return [" -> ".join(names[r] for r in s) for s in self.stacks if list(s) != sorted(s)]

    def walked(self, *floors: str) -> bool:
        """Some stack went through ``floors`` in this order (and maybe others between)."""
        wanted = [next(i for i, (n, _) in enumerate(FLOORS) if n == f) for f in floors]
        return any(_subsequence(wanted, list(s)) for s in self.stacks)


def _subsequence(wanted: List[int], stack: List[int]) -> bool:
    it = iter(stack)
    return all(any(w == r for r in it) for w in wanted)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def objects(minio, bucket: str) -> List[str]:
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    names = ["a.dat", "b.dat"]
    for n in names:
        client.put_object(Bucket=bucket, Key=f"in/{n}", Body=n.encode() * 1000)
    return names


def reads(tmp_path, bucket: str, job: str, names: List[str]) -> List[Transfer]:
    return [Transfer((parse_url(f"s3://test@minio/{bucket}/in/{n}", site_label="minio"),),
                     parse_url(f"file://{tmp_path}/{job}/{n}")) for n in names]


def test_an_s3_read_without_a_cache_walks_engine_store_backend_http(s3_env, bucket, objects, tmp_path):
    with Session(Settings(threads=2), s3_env) as session, Trace() as trace:
        results = Engine(session, executor=InlineExecutor()).run(reads(tmp_path, bucket, "j", objects[:1]))
    assert [r.ok for r in results] == [True]
    assert trace.walked("engine", "store", "backend", "http")
    assert trace.back_arrows() == []


def test_small_reads_read_ahead_walk_engine_cache_store_one_way(s3_env, bucket, tmp_path):
    """A batch of small objects is read ahead by the bottom of the stack (pipelined GETs in the
    store reader's prepare) and each body taken up by the node cache's fill: the plan goes
    down engine -> cache -> bundles -> store -> backend -> http, and the bodies come back up
    as return values, not calls."""
    names = [f"s{i}.dat" for i in range(6)]
    sources = _uploaded(s3_env, bucket, tmp_path, names, 50, Settings(threads=2))
    cache = new_cache(tmp_path / "cache")
    with Session(Settings(threads=2), s3_env) as session, Trace() as trace:
        executor = CountingExecutor()
        results = Engine(session, executor=executor, cache=cache).run(reads(tmp_path, bucket, "j", names))
    assert [r.ok for r in results] == [True] * len(names)
    assert executor.submitted == 0  # every file read ahead, none handed to a worker
    assert all((tmp_path / "j" / n).read_bytes() == (sources / n).read_bytes() for n in names)
    # the plan and the fills go down from the engine's thread; the pass itself runs from the
    # store reader on the read-ahead's thread (a stack of its own, which starts at the store)
    assert trace.walked("engine", "cache", "bundles", "store")
    assert trace.walked("store", "backend", "http")
    assert trace.back_arrows() == []


def test_member_reads_walk_engine_cache_bundles_store_one_way(s3_env, bucket, tmp_path):
    """A name the store does not have, but a bundle of its directory does: the store's 404
    loads the index and the member is kept under its own key; the next member is known."""
    names = [f"m{i}.dat" for i in range(10)]
    sources = _uploaded(s3_env, bucket, tmp_path, names, 100, Settings(threads=2, bundle=True))
    cache = new_cache(tmp_path / "cache")
    with Session(Settings(threads=2), s3_env) as session, Trace() as trace:
        engine = Engine(session, executor=InlineExecutor(), cache=cache)
        first = engine.run(reads(tmp_path, bucket, "j1", names[3:4]))  # 404, then the index
        second = engine.run(reads(tmp_path, bucket, "j2", names[4:5]))  # a member known by then
        member = parse_url(f"s3://test@minio/{bucket}/in/{names[3]}", site_label="minio")
        plain = session.backend(member).cache_key(member)  # type: ignore[attr-defined]
    assert [r.ok for r in first + second] == [True, True]
    assert (tmp_path / "j1" / names[3]).read_bytes() == (sources / names[3]).read_bytes()
    assert (tmp_path / "j2" / names[4]).read_bytes() == (sources / names[4]).read_bytes()
    assert not cache.contains(plain)  # kept under the member's key, never the name's
    assert trace.walked("engine", "cache", "bundles", "store", "backend", "http")
    assert trace.back_arrows() == []


def test_a_batch_of_members_is_read_a_bundle_at_a_time_one_way(s3_env, bucket, tmp_path):
    """Bundles on: the batch's members are located (the directory's index) and read a bundle
    at a time by the bundle layer's plan, their bodies taken up by the node cache's fill as
    return values: no file goes to a worker, no stack runs back up (before, a batch's bundle
    groups ran beside the stacks and their member fill called the node cache)."""
    names = [f"g{i}.dat" for i in range(12)]
    sources = _uploaded(s3_env, bucket, tmp_path, names, 2000, Settings(threads=2, bundle=True))
    cache = new_cache(tmp_path / "cache")
    with Session(Settings(threads=2, bundle=True), s3_env) as session, Trace() as trace:
        executor = CountingExecutor()
        results = Engine(session, executor=executor, cache=cache).run(reads(tmp_path, bucket, "j", names))
        member = parse_url(f"s3://test@minio/{bucket}/in/{names[0]}", site_label="minio")
        plain = session.backend(member).cache_key(member)  # type: ignore[attr-defined]
    assert [r.ok for r in results] == [True] * len(names)
    assert all((tmp_path / "j" / n).read_bytes() == (sources / n).read_bytes() for n in names)
    assert executor.submitted <= 1  # the bundle's one read (a bundle not brought whole by its head), no file
    assert not cache.contains(plain) and len(list(cache.entries())) == len(names)  # under the members' keys
    assert trace.walked("engine", "bundles", "backend", "http")
    assert trace.walked("engine", "cache", "bundles")  # the cache's misses located below
    assert trace.back_arrows() == []


def test_store_and_peer_reads_walk_engine_cache_peers_store_one_way(s3_env, bucket, objects, tmp_path, redis_server):
    tls = make_tls_files(tmp_path / "tls")
    namespace = f"t{uuid.uuid4().hex[:8]}"
    caches, daemons = {}, []
    for name in "ab":
        caches[name] = new_cache(tmp_path / f"cache-{name}")
        index = PeerIndex(redis.Redis.from_url(redis_server.url), namespace)
        serve = ServeConfig({"alice": caches[name].directory}, TOKEN, ("127.0.0.1", 0),
                            cert_file=str(tls.cert), key_file=str(tls.key))
        daemons.append(Daemon(DaemonSettings(serve, name, "", "", redis_server.url, False, namespace, 30.0),
                              index).start())
    try:
        traces = {}
        for name in "ab":  # a reads from the store and registers; b then reads from a
            index = PeerIndex(redis.Redis.from_url(redis_server.url), namespace)
            source = PeerIndexSource(index, PeerClient(client_config(tls, node=name)), node_id(name, "alice"),
                                     describe=describer(caches[name]), grant=caches[name].grant)
            try:
                with Session(Settings(threads=2), s3_env) as session, Trace() as traces[name]:
                    engine = Engine(session, executor=InlineExecutor(), cache=caches[name], peers=source)
                    results = engine.run(reads(tmp_path, bucket, f"j{name}", objects))
            finally:
                source.close()
            assert [r.ok for r in results] == [True, True]
            assert (tmp_path / f"j{name}" / objects[0]).read_bytes() == objects[0].encode() * 1000
        assert caches["b"].stats().hits == 0  # b's bytes came from a, not from its own cache
        assert traces["a"].walked("engine", "cache", "peers", "store", "backend", "http")
        assert traces["b"].walked("engine", "cache", "peers")
        assert not traces["b"].walked("engine", "cache", "peers", "store", "backend", "http")
        # No arrow up: at the batch's end the node cache grants what the batch stored and hands
        # it down for the peers to register (transfer.layers.sharing), and the peer client names
        # an entry with transfer._digests.digest_of, a tool below both, not the cache's layout.
        assert traces["a"].back_arrows() == []
        assert traces["b"].back_arrows() == []
        assert traces["a"].walked("engine", "cache", "peers")  # the batch's grant, then register
    finally:
        for daemon in daemons:
            daemon.stop()


def _uploaded(s3_env, bucket, tmp_path, names, times, settings):
    """Local files ``names`` (each its name's bytes ``times`` over) uploaded to ``in/`` of
    ``bucket`` with ``settings``; their directory."""
    sources = tmp_path / "src"
    sources.mkdir()
    for n in names:
        (sources / n).write_bytes(n.encode() * times)
    ups = [Transfer((parse_url(str(sources / n)),), parse_url(f"s3://test@minio/{bucket}/in/{n}", site_label="minio"))
           for n in names]
    with Session(settings, s3_env) as session:
        assert all(r.ok for r in Engine(session).run(ups))
    return sources
