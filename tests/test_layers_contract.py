"""The contract suite (:mod:`pegasus_cloudio_testbed.contract`) on the read stacks of
:mod:`transfer.layers` over S3 on MinIO: the bare store reader, the bundle layer over it, the
node cache over each, and the node cache over the peer layer (over the store, and over bundles
over the store) with a real replica index (redis-server) and a second node's daemon as the peer.
Each stack is built as the engine builds it (``Stacks``), with the layer below and plain values."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, Iterator, Tuple

import boto3
import pytest
import redis

from pegasus_cloudio.p2p.serve import Daemon
from pegasus_cloudio.p2p.server import ServeConfig
from pegasus_cloudio.p2p.settings import DaemonSettings
from pegasus_cloudio_testbed import contract as c
from pegasus_cloudio_testbed.certs import TlsFiles, make_tls_files
from pegasus_cloudio_testbed.contract.base import AWKWARD_KEYS
from pegasus_cloudio_testbed.proxy import TcpProxy
from pegasus_cloudio_testbed.redis import RedisServer
from transfer import Session, Settings, parse_url
from transfer.backends.base import Backend, cache_keys, peer_scopes
from transfer.cache import NodeCache
from transfer.layers import Reader
from transfer.layers.bundles import StagerSlot
from transfer.layers.stack import Stacks
from transfer.p2p import describer
from transfer.p2p.client import PeerClient
from transfer.p2p.config import node_id
from transfer.p2p.index import PeerIndex
from transfer.p2p.source import PeerIndexSource
from transfer.pacing import Pacer
from transfer.peers import PeerRound, Replica
from transfer.ranged import PartPool
from transfer.urls import Url
from p2p_support import TOKEN, MemorySink, client_config, new_cache


class MinioStack:
    """``stack(session, url, tmp_path)``: the reader under test, over the endpoint of ``url``."""

    __test__ = False

    @pytest.fixture
    def base_url(self, store_s3: Tuple[Dict[str, str], str]) -> str:
        return store_s3[1]

    @pytest.fixture
    def url_for(self, base_url: str) -> Callable[[str], Url]:
        return lambda key: parse_url(f"{base_url}/{key}", site_label="minio")

    @pytest.fixture
    def seed(self, put_object: Callable[[str, bytes], None]) -> Callable[[str, bytes], None]:
        return put_object

    @pytest.fixture
    def put_object(self, minio: Any, base_url: str) -> Callable[[str, bytes], None]:
        """Store bytes in the bucket by MinIO's own API."""
        client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                              aws_secret_access_key=minio.secret_key, region_name="us-east-1")
        bucket = base_url.split("/")[3]
        return lambda key, data: client.put_object(Bucket=bucket, Key=key, Body=data) and None

    @pytest.fixture
    def reader(self, store_s3: Tuple[Dict[str, str], str], url_for: Callable[[str], Url],
               tmp_path: Path) -> Iterator[Reader]:
        parts = PartPool(4)
        with Session(Settings(threads=4), store_s3[0]) as session:
            yield self.stacks(parts, tmp_path, session).reader(session.backend(url_for("x")))
        parts.shutdown()

    def stacks(self, parts: PartPool, tmp_path: Path, session: Session) -> Stacks:
        raise NotImplementedError


class TestStoreReader(MinioStack, c.ReadContract, c.LayerContract):
    __test__ = True

    def stacks(self, parts: PartPool, tmp_path: Path, session: Session) -> Stacks:
        return Stacks(session, parts, 64 * 1024, Pacer())


class TestCacheOverStore(MinioStack, c.ReadContract, c.LayerContract):
    __test__ = True

    def stacks(self, parts: PartPool, tmp_path: Path, session: Session) -> Stacks:
        return Stacks(session, parts, 64 * 1024, Pacer(), new_cache(tmp_path / "cache"))


class TestBundlesOverStore(MinioStack, c.ReadContract, c.LayerContract):
    """The bundle layer over the store, as a stack without a node cache has it (every read of
    a name the store lacks loads its directory's index: the NotFound cases list it)."""

    __test__ = True

    def stacks(self, parts: PartPool, tmp_path: Path, session: Session) -> Stacks:
        return Stacks(session, parts, 64 * 1024, Pacer(), bundles=StagerSlot(session))


class TestCacheOverBundles(MinioStack, c.ReadContract, c.LayerContract):
    """The engine's whole stack without peers: node cache -> bundles -> store."""

    __test__ = True

    def stacks(self, parts: PartPool, tmp_path: Path, session: Session) -> Stacks:
        return Stacks(session, parts, 64 * 1024, Pacer(), new_cache(tmp_path / "cache"), bundles=StagerSlot(session))


# --------------------------------------------------------------------------- peers
# The peer layer sits under a node cache only (``Stacks``): these stacks are cache -> peers ->
# (bundles ->) store. Node "b" is the peer: its own cache directory and daemon (TLS, pool
# token), heartbeating into one redis-server; the node under test, "a", reads through a
# PeerIndexSource over the same index namespace.


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def peer_tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


class PeerNode:
    """Node "b": a node cache served by its daemon, announced in ``namespace`` of the index."""

    def __init__(self, cache: NodeCache, index: PeerIndex, tls: TlsFiles, redis_url: str, namespace: str) -> None:
        self.cache, self.index, self.node = cache, index, node_id("b", "alice")
        serve = ServeConfig({"alice": cache.directory}, TOKEN, ("127.0.0.1", 0),
                            cert_file=str(tls.cert), key_file=str(tls.key))
        self.daemon = Daemon(DaemonSettings(serve, "b", "", "", redis_url, False, namespace, 30.0), index).start()

    def hold(self, backend: Backend, url: Url, data: bytes) -> str:
        """Keep ``data`` as ``url``'s entry, shared with the scope ``backend`` reads it in, and
        register it in the index as this node's; the entry's key."""
        keys, scopes = cache_keys(backend), peer_scopes(backend)
        assert keys is not None and scopes is not None
        key, scope = keys.cache_key(url), scopes.peer_scope(url)
        assert scope is not None and self.cache.insert_bytes(key, data)
        assert self.cache.grant(key, scope.capability(key))
        self.index.register(self.node, [Replica(key, len(data), hashlib.sha256(data).hexdigest(), scope)])
        return key


class PeerStack(MinioStack):
    """cache -> peers (-> bundles) -> store over MinIO behind a counting proxy. ``peer_holds``:
    the peer holds every seeded object (else none). Each seeded key is then planned
    (``Stacks.prepare``), as the engine plans a batch before reading it: only then does a read
    of it ask the index (a key no batch planned is never looked up)."""

    __test__ = False
    peer_holds: ClassVar[bool] = False
    with_bundles: ClassVar[bool] = False

    @pytest.fixture
    def proxy(self, minio: Any) -> Iterator[TcpProxy]:
        with TcpProxy((minio.host, minio.port)) as proxy:
            yield proxy

    @pytest.fixture
    def store_s3(self, minio: Any, proxy: TcpProxy, bucket: str, tmp_path: Path) -> Tuple[Dict[str, str], str]:
        """The store reached through ``proxy`` (it counts the store's requests by method)."""
        creds = minio.write_pegasus_credentials(tmp_path / "proxied.conf", site="minio", user="test",
                                                endpoint=proxy.url())
        return ({"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
                 "AWS_EC2_METADATA_DISABLED": "true"}, f"s3://test@minio/{bucket}")

    @pytest.fixture
    def peer(self, tmp_path: Path, redis_server: RedisServer, peer_tls: TlsFiles) -> Iterator[PeerNode]:
        namespace = f"t{uuid.uuid4().hex[:8]}"
        index = PeerIndex(redis.Redis.from_url(redis_server.url), namespace)
        node = PeerNode(new_cache(tmp_path / "cache-b"), index, peer_tls, redis_server.url, namespace)
        yield node
        node.daemon.stop()

    @pytest.fixture
    def node(self, store_s3: Tuple[Dict[str, str], str], url_for: Callable[[str], Url], tmp_path: Path,
             peer: PeerNode, peer_tls: TlsFiles) -> Iterator["ReadingNode"]:
        """Node "a": its stacks (one peer round, as an engine has) over the endpoint's backend."""
        cache = new_cache(tmp_path / "cache-a")
        source = PeerIndexSource(peer.index, PeerClient(client_config(peer_tls, node="a")), node_id("a", "alice"),
                                 describe=describer(cache), grant=cache.grant)
        parts = PartPool(4)
        with Session(Settings(threads=4), store_s3[0]) as session:
            bundles = StagerSlot(session) if self.with_bundles else None
            stacks = Stacks(session, parts, 64 * 1024, Pacer(), cache, PeerRound(source), bundles=bundles)
            yield ReadingNode(stacks, session.backend(url_for("x")), source)
        source.close()
        parts.shutdown()

    @pytest.fixture
    def reader(self, node: "ReadingNode") -> Reader:
        return node.stacks.reader(node.backend)

    @pytest.fixture
    def seed(self, put_object: Callable[[str, bytes], None], node: "ReadingNode", peer: PeerNode,
             url_for: Callable[[str], Url]) -> Callable[[str, bytes], None]:
        def seed(key: str, data: bytes) -> None:
            put_object(key, data)
            if self.peer_holds:
                peer.hold(node.backend, url_for(key), data)
            for _ in node.stacks.prepare([url_for(key)]):
                pass
        return seed


class ReadingNode:
    """Node "a" of a :class:`PeerStack` test: its stacks, the endpoint's backend, its peer source."""

    def __init__(self, stacks: Stacks, backend: Backend, source: PeerIndexSource) -> None:
        self.stacks, self.backend, self.source = stacks, backend, source


class PeerServes:
    """The case of a stack whose peer holds every seeded object."""

    @pytest.mark.parametrize("size", [0, 1, 70_001])
    def test_a_read_the_peer_served_sent_no_get_to_the_store(
            self, reader: Reader, seed: Callable[[str, bytes], None], url_for: Callable[[str], Url],
            proxy: TcpProxy, node: ReadingNode, tmp_path: Path, size: int) -> None:
        """A fill of the node cache is the peer's: the store gets no GET for it; and a read
        into a sink that can be reset (a fill's temp file, :class:`~transfer.peers.PeerSink`)
        names the peers as the origin of its bytes."""
        data = os.urandom(size)
        seed("peer/held.bin", data)
        proxy.reset_counters()
        assert reader.fetch_to(url_for("peer/held.bin"), str(tmp_path / "held.bin")) == len(data)
        assert (tmp_path / "held.bin").read_bytes() == data
        sink = MemorySink()
        info = reader.get(url_for("peer/held.bin"), sink)  # type: ignore[arg-type]  # a PeerSink
        assert (info.origin, info.size, bytes(sink.data)) == ("peers", len(data), data)
        assert proxy.requests_by_method.get("GET", 0) == 0, proxy.requests_by_method
        assert node.source.counters["peer_hits"] == 2

    @pytest.mark.parametrize("key", AWKWARD_KEYS)
    def test_awkward_keys_come_from_the_peer(self, reader: Reader, seed: Callable[[str, bytes], None],
                                             url_for: Callable[[str], Url], proxy: TcpProxy,
                                             tmp_path: Path, key: str) -> None:
        """The contract's awkward keys read through ``get`` (the store's); here their fills."""
        seed(f"awk/{key}", key.encode())
        proxy.reset_counters()
        assert reader.fetch_to(url_for(f"awk/{key}"), str(tmp_path / "awk")) == len(key.encode())
        assert (tmp_path / "awk").read_bytes() == key.encode()
        assert proxy.requests_by_method.get("GET", 0) == 0, proxy.requests_by_method


class TestCacheOverIdlePeers(PeerStack, c.ReadContract, c.LayerContract):
    """cache -> peers -> store, no peer holding anything: every read falls through to the store."""

    __test__ = True

    def test_a_read_asks_the_index_then_the_store(self, reader: Reader, seed: Callable[[str, bytes], None],
                                                  url_for: Callable[[str], Url], proxy: TcpProxy,
                                                  node: ReadingNode, tmp_path: Path) -> None:
        seed("peer/none.bin", b"from the store")
        proxy.reset_counters()
        assert reader.fetch_to(url_for("peer/none.bin"), str(tmp_path / "none.bin")) == 14
        assert (tmp_path / "none.bin").read_bytes() == b"from the store"
        assert node.source.counters["lookups"] == 1 and node.source.counters["peer_hits"] == 0
        assert proxy.requests_by_method.get("GET", 0) == 1, proxy.requests_by_method


class TestCacheOverHoldingPeers(PeerServes, PeerStack, c.ReadContract, c.LayerContract):
    """cache -> peers -> store, the peer holding every seeded object: a fill (``fetch_to``) is
    the peer's; ``stat``, and ``get`` into a sink that cannot be reset, are the store's."""

    __test__ = True
    peer_holds = True


class TestCacheOverPeersOverBundles(PeerServes, PeerStack, c.ReadContract, c.LayerContract):
    """The engine's whole stack: cache -> peers -> bundles -> store, the peer holding every
    seeded object."""

    __test__ = True
    peer_holds = True
    with_bundles = True
