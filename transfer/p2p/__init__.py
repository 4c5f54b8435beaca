"""Peer-to-peer sharing of node caches: a replica index on Redis, a verified peer client and
the engine's peer source (see :mod:`transfer.peers` for the seam).

``import transfer.p2p`` needs no Redis client; :func:`peer_source_from_env` returns None when
peer sharing is not configured or the ``redis`` package (extra ``[p2p]``) is missing, and
everything then runs as on a single node.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Optional

from transfer.cache import NodeCache
from transfer.peers import Replica

from transfer.p2p.client import PeerClient
from transfer.p2p.config import PeerConfig, peer_config_from_env
from transfer.p2p.index import Holder, Lookup, NodeInfo, PeerIndex
from transfer.p2p.source import PeerIndexSource

__all__ = ["Holder", "Lookup", "NodeInfo", "PeerClient", "PeerConfig", "PeerIndex", "PeerIndexSource",
           "connect_redis", "peer_source", "peer_source_from_env"]

_log = logging.getLogger("transfer.p2p")


def connect_redis(url: str, *, cluster: bool = False, timeout: float = 1.0) -> Any:
    """A Redis (or Redis Cluster) client for ``url`` with short timeouts and no retries:
    a down index must cost a job about ``timeout`` seconds, not minutes. Raises ImportError
    without the ``redis`` package."""
    import redis
    import redis.cluster
    if cluster:
        return redis.cluster.RedisCluster.from_url(url, socket_connect_timeout=timeout,
                                                   socket_timeout=timeout)
    return redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout,
                                retry_on_timeout=False)


def peer_source(config: PeerConfig, cache: Optional[NodeCache] = None,
                warn: Optional[Callable[[str], None]] = None) -> PeerIndexSource:
    """The engine's peer source for ``config`` and this node's ``cache`` (which enables
    claims); connects lazily. ImportError without the redis package."""
    index = PeerIndex(connect_redis(config.redis_url, cluster=config.cluster,
                                    timeout=max(config.connect_timeout, 0.5)),
                      config.namespace)
    return PeerIndexSource(index, PeerClient(config), config.node_id,
                           claim_seconds=config.claim_seconds,
                           describe=describer(cache) if cache is not None else None,
                           grant=cache.grant if cache is not None else None, warn=warn)


def describer(cache: NodeCache) -> Callable[[str], Optional[Replica]]:
    """``key -> Replica`` of ``cache``'s valid entry (None when absent)."""
    def describe(key: str) -> Optional[Replica]:
        meta = cache.describe(key)
        return Replica(key, meta.size, meta.sha256) if meta is not None else None
    return describe


def peer_source_from_env(env: Optional[Mapping[str, str]] = None, cache: Optional[NodeCache] = None,
                         warn: Optional[Callable[[str], None]] = None) -> Optional[PeerIndexSource]:
    """The peer source ``PEGASUS_CLOUDIO_P2P_*`` describes; None when unset, or (one warning)
    when the ``redis`` package is missing. A malformed setting raises InvalidInput/ConfigError."""
    config = peer_config_from_env(env)
    if config is None:
        return None
    try:
        return peer_source(config, cache, warn)
    except ImportError:
        (warn or _log.warning)("peer sharing is configured but the redis package is missing "
                               "(install pegasus-cloudio[p2p]); reading from the store")
        return None
