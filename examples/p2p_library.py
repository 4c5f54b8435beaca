"""Peer-to-peer sharing from a custom engine, with the ``transfer`` library and no Pegasus.

    python examples/p2p_library.py --redis redis://HOST:6379/0 --store s3://joe@mysite/bucket/dir --work DIR

Two "nodes" in one process, each with its own node cache: node A's cache daemon serves its
cache (plain HTTP on loopback, configured explicitly here; pools use HTTPS with a pool CA);
A uploads a result, which writes through A's cache and registers it in the replica index on
Redis; node B then reads it through its engine, and the peer source finds it on A. The end
shows the lower-level calls: one batch lookup, and a verified fetch from a peer into any sink,
both under the scope of the store identity that reads the URL (docs/security.md: only holders
of the same store credentials share). Store credentials as for pegasus-transfer
($PEGASUS_CREDENTIALS).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

from pegasus_cloudio.p2p.serve import Daemon
from pegasus_cloudio.p2p.server import ServeConfig
from pegasus_cloudio.p2p.settings import DaemonSettings
from transfer import Engine, Session, Settings, Transfer, parse_url
from transfer.cache import CacheConfig, NodeCache
from transfer.p2p import PeerClient, PeerConfig, PeerIndex, PeerIndexSource, connect_redis, describer
from transfer.p2p.config import node_id, parse_networks

TOKEN = "example-pool-token"  # a pool: each user's own copy in PEGASUS_CLOUDIO_P2P_TOKEN_FILE (0600)


def node_cache(path: str) -> NodeCache:
    return NodeCache(CacheConfig(path, max_bytes=1 << 30, min_free_bytes=0))


def peer_source(name: str, cache: NodeCache, index: PeerIndex, redis_url: str) -> PeerIndexSource:
    """What the drop-in builds from PEGASUS_CLOUDIO_P2P_*: index + verified client + claims."""
    config = PeerConfig(redis_url, TOKEN, plain_http=True, networks=parse_networks("127.0.0.0/8"),
                        node=name, user="example")
    return PeerIndexSource(index, PeerClient(config), node_id(name, "example"), claim_seconds=5,
                           describe=describer(cache), grant=cache.grant)


def run(session: Session, cache: NodeCache, peers: PeerIndexSource, ops: list) -> None:
    try:
        results = Engine(session, cache=cache, peers=peers).run(ops)
    finally:
        peers.close()
    for r in results:
        if not r.ok:
            raise SystemExit(f"failed: {r.error}")


class Digest:
    """A sink that only hashes: any object with write() and reset() will do."""

    def __init__(self) -> None:
        self.hash = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        return len(data)

    def reset(self) -> None:
        self.hash = hashlib.sha256()


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", required=True)
    parser.add_argument("--store", required=True, help="object-store directory URL")
    parser.add_argument("--work", required=True)
    args = parser.parse_args(argv)
    index = PeerIndex(connect_redis(args.redis), "example")
    cache_a = node_cache(os.path.join(args.work, "cache-a"))
    cache_b = node_cache(os.path.join(args.work, "cache-b"))
    serve = ServeConfig({"example": cache_a.directory}, TOKEN, ("127.0.0.1", 0), plain_http=True)
    daemon = Daemon(DaemonSettings(serve, "a", "", "", args.redis, False, "example", 30), index).start()
    try:
        with Session(Settings()) as session:
            result = os.path.join(args.work, "a", "result.dat")
            os.makedirs(os.path.dirname(result), exist_ok=True)
            with open(result, "wb") as fh:
                fh.write(os.urandom(1 << 20))
            url = f"{args.store.rstrip('/')}/result.dat"
            run(session, cache_a, peer_source("a", cache_a, index, args.redis),
                [Transfer((parse_url(result),), parse_url(url))])
            print(f"node a uploaded {url} and registered it")
            peers_b = peer_source("b", cache_b, index, args.redis)
            run(session, cache_b, peers_b, [Transfer((parse_url(url),), parse_url(os.path.join(args.work, "b", "result.dat")))])
            print(f"node b: peer hits: {peers_b.counters['peer_hits']}, bytes from peers: {peers_b.counters['peer_bytes']}")
            backend = session.backend(parse_url(url))
            key = backend.cache_key(parse_url(url))  # type: ignore[attr-defined]
            scope = backend.peer_scope(parse_url(url))  # type: ignore[attr-defined]
        # b registered its copy as well, but runs no daemon (no heartbeat): only a is alive.
        found = index.lookup({key: scope})  # one round trip for any number of keys
        holders = found.holders.get(key, [])
        print("holders:", ", ".join(sorted(h.info.node for h in holders)))
        sink = Digest()
        client = PeerClient(PeerConfig(args.redis, TOKEN, plain_http=True, networks=parse_networks("127.0.0.0/8"),
                                       node="c", user="example"))
        report = client.fetch(key, holders, sink, scope)
        client.close()
        print(f"direct fetch: {report.size} bytes, sha256 verified: {sink.hash.hexdigest() == holders[0].sha256}")
    finally:
        daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
