"""Helpers of the peer-to-peer tests: node caches with entries, daemons, configs, counters."""

from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, List, Optional

from pegasus_cloudio.p2p.server import CacheServer, ServeConfig
from transfer.cache import NodeCache
from transfer.cache.config import CacheConfig
from transfer.p2p.client import PeerClient
from transfer.p2p.config import PeerConfig, parse_networks
from transfer.p2p.index import Holder, NodeInfo
from transfer.peers import Replica, derive_scope

TOKEN = "pool-token-0123456789"
SCOPE = derive_scope("alice-store-secret", "s3", "http://store", "alice", "b")


def new_cache(path) -> NodeCache:
    return NodeCache(CacheConfig(str(path), max_bytes=1 << 30, min_free_bytes=0, fsync=False))


def put(cache: NodeCache, key: str, data: bytes, scope=SCOPE) -> Replica:
    """``data`` cached under ``key`` and shared with ``scope`` (None: with nobody)."""
    assert cache.insert_bytes(key, data)
    if scope is not None:
        assert cache.grant(key, scope.capability(key))
    return Replica(key, len(data), hashlib.sha256(data).hexdigest(), scope)


def serve(cache_dir, *, tls=None, user="alice", bind="127.0.0.1", **kw) -> CacheServer:
    config = ServeConfig({user: str(cache_dir)}, TOKEN, (bind, 0),
                         cert_file=str(tls.cert) if tls else None, key_file=str(tls.key) if tls else None,
                         plain_http=tls is None, **kw)
    return CacheServer(config).start()


def auth(server: CacheServer, key: str, scope=SCOPE) -> Dict[str, str]:
    """The headers a reader of ``scope`` sends ``server`` for ``key``: token and proof."""
    from transfer.cache.layout import digest_of
    from transfer.p2p.client import PROOF_HEADER
    from transfer.peers import proof
    return {"Authorization": f"Bearer {TOKEN}",
            PROOF_HEADER: proof(scope.capability(key), server._server.binding, digest_of(key))}


def url_of(server: CacheServer, tls=True, user="alice", port: Optional[int] = None) -> str:
    host, real = server.address
    return f"{'https' if tls else 'http'}://{host}:{port or real}/v1/{user}"


def client_config(tls=None, **kw: Any) -> PeerConfig:
    values: Dict[str, Any] = dict(redis_url="redis://unused", token=TOKEN, ca_file=str(tls.ca_cert) if tls else None,
                                  plain_http=tls is None, networks=parse_networks("127.0.0.0/8"), node="n0",
                                  user="alice", connect_timeout=1.0, first_byte_timeout=2.0, read_timeout=2.0)
    values.update(kw)
    return PeerConfig(**values)


def holder(node: str, url: str, replica: Replica, host: str = "", rack: str = "") -> Holder:
    return Holder(NodeInfo(node, url, host, rack), replica.size, replica.sha256)


class MemorySink:
    """A PeerSink in memory that records resets."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.resets = 0

    def write(self, data) -> int:
        self.data += bytes(data)
        return len(data)

    def reset(self) -> None:
        self.data.clear()
        self.resets += 1


def fetch(config: PeerConfig, key: str, holders: List[Holder], scope=SCOPE):
    client = PeerClient(config)
    sink = MemorySink()
    try:
        return client.fetch(key, holders, sink, scope), sink
    finally:
        client.close()


def corrupt_in_place(cache: NodeCache, key: str) -> None:
    """Flip a byte of the entry keeping size and mtime (the cache's cheap check still passes)."""
    with cache.pin(key) as path:
        assert path is not None
        st = os.stat(path)
        os.chmod(path, 0o644)
        with open(path, "r+b") as fh:
            first = fh.read(1)
            fh.seek(0)
            fh.write(bytes([first[0] ^ 0xFF]))
        os.chmod(path, 0o444)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
