"""What the jobs of one node share, opened from settings: the node cache, peer sharing and the
request rate per prefix the store allows (:func:`open_pacer`).

The front ends (drop-in, HTCondor plugin, stager) and library users open both the same way:
``open_node_cache(env)`` then ``open_peers(env, cache)``, and pass them to
:class:`~transfer.engine.Engine`. A job never fails for its cache: an unusable cache or bad
peer settings are one warning and the transfer goes on without them.
"""

from __future__ import annotations

from transfer.lean import logger

# A job step imports this module: the cache, P2P code, logging and typing only when used.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Iterable, Mapping, Optional

    from transfer.cache import NodeCache
    from transfer.ops import Operation
    from transfer.pacing import Pacer
    from transfer.p2p.source import PeerIndexSource
    from transfer.peers import Scope
    from transfer.session import Session

    Warn = Callable[[str], None]

__all__ = ["cache_needed", "open_node_cache", "open_pacer", "open_peers", "session_scopes"]

_log = logger(__name__)


def open_node_cache(env: "Mapping[str, str]", warn: "Optional[Warn]" = None) -> "Optional[NodeCache]":
    """The node cache ``PEGASUS_CLOUDIO_CACHE_*`` in ``env`` configures, or None when it is off
    or unusable (one warning, to ``warn`` if given, else this module's logger)."""
    if env.get("PEGASUS_CLOUDIO_CACHE_DIR", "").strip().lower() == "off":
        return None  # what cache_from_settings says too, without importing the cache
    from transfer.cache import cache_from_settings
    from transfer.errors import TransferError
    try:
        return cache_from_settings(env)
    except (TransferError, OSError) as err:
        (warn or _log.warning)(f"Node cache disabled: {err}")
        return None


def cache_needed(ops: "Iterable[Operation]", env: "Mapping[str, str]") -> bool:
    """Whether a batch of ``ops`` uses the node cache: it reads a remote object, or it uploads
    and ``PEGASUS_CLOUDIO_CACHE_UPLOADS`` writes uploads through (``auto``: when peer sharing
    is configured). A batch of uploads alone then opens no cache (nor imports it). True when
    the setting is malformed, so that opening the cache reports it."""
    from transfer.ops import Transfer  # loaded already: the batch is made of its operations
    if any(not source.is_local for op in ops if isinstance(op, Transfer) for source in op.sources):
        return True
    from transfer.cache.config import uploads_setting
    from transfer.errors import TransferError
    try:
        uploads = uploads_setting(env)
    except TransferError:
        return True
    return uploads if uploads is not None else bool(env.get("PEGASUS_CLOUDIO_P2P_REDIS", "").strip())


def open_peers(env: "Mapping[str, str]", cache: "Optional[NodeCache]",
               warn: "Optional[Warn]" = None) -> "Optional[PeerIndexSource]":
    """Peer sharing when ``PEGASUS_CLOUDIO_P2P_*`` configures it and there is a node cache;
    None otherwise, or (one warning) when its settings are bad or the redis package is missing."""
    if cache is None or not env.get("PEGASUS_CLOUDIO_P2P_REDIS", "").strip():
        return None  # the P2P code is imported only when the run's settings name an index
    from transfer.p2p import peer_source_from_env  # redis and the index client: only when asked
    from transfer.errors import TransferError
    say = warn or _log.warning
    try:
        return peer_source_from_env(env, cache, warn=say)
    except TransferError as err:
        say(f"Peer sharing disabled: {err}")
        return None


def open_pacer(env: "Mapping[str, str]", fraction: float = 0.0,
               scope_of: "Optional[Callable[[str], Optional[Scope]]]" = None, warn: "Optional[Warn]" = None) -> "Pacer":
    """A pacer whose prefix rates the user's jobs on this node share, in the node's rate file
    (:mod:`transfer.pacing_node`; nothing is opened until a prefix is used, nothing created
    until one is throttled); with a ``fraction`` above 0 (``Settings.pool_rate_fraction``),
    the peer index's Redis (``PEGASUS_CLOUDIO_P2P_REDIS``) and ``scope_of`` (prefix key -> the
    reader's peer scope), the rates of the whole pool (:mod:`transfer.pacing_pool`). A
    missing redis package is one warning and the node's rate."""
    import time

    from transfer.pacing import Pacer
    from transfer.pacing_node import NodeStates, node_rate_dir
    node = NodeStates(node_rate_dir(env), time.time)
    trace = None
    if env.get("PEGASUS_CLOUDIO_PACE_TRACE"):  # (a debugging knob: no import unless asked)
        from transfer.pacing_trace import open_trace
        trace = open_trace(env)
    redis_url = env.get("PEGASUS_CLOUDIO_P2P_REDIS", "").strip()
    if not fraction or not redis_url or scope_of is None:
        return Pacer(node, trace=trace)
    try:
        from transfer.p2p import connect_redis
        client = connect_redis(redis_url, cluster=env.get("PEGASUS_CLOUDIO_P2P_CLUSTER", "").strip() == "1")
    except ImportError:
        (warn or _log.warning)("the pool rate limiter needs the redis package (pegasus-cloudio[p2p]); "
                               "pacing by this node's rate")
        return Pacer(node, trace=trace)
    from transfer.pacing_pool import DOCUMENTED_RATE, PoolStates
    namespace = env.get("PEGASUS_CLOUDIO_P2P_NAMESPACE", "").strip() or "pcio"

    def ceiling(key: str) -> float:
        return fraction * DOCUMENTED_RATE.get(key.partition(":")[0], 3500.0)

    return Pacer(PoolStates(client, namespace, scope_of, node, time.time), ceiling=ceiling, trace=trace)


def session_scopes(session: "Session") -> "Callable[[str], Optional[Scope]]":
    """``prefix key -> peer scope`` of ``session``'s backends (None: anonymous reads, which
    nothing proves: such a prefix is paced by the node's rate)."""
    def scope_of(key: str) -> "Optional[Scope]":
        from transfer.backends.base import peer_scopes
        from transfer.urls import parse_url
        url = parse_url(key)
        scopes = peer_scopes(session.backend(url))
        return scopes.peer_scope(url) if scopes is not None else None
    return scope_of
