"""What the jobs of one node share, opened from settings: the node cache, peer sharing and the
request rate per prefix the store allows (:func:`open_pacer`).

The front ends (drop-in, HTCondor plugin, stager) and library users open both the same way:
``open_node_cache(env)`` then ``open_peers(env, cache)``, and pass them to
:class:`~transfer.engine.Engine`. A job never fails for its cache: an unusable cache or bad
peer settings are one warning and the transfer goes on without them.
"""

from __future__ import annotations

from transfer._lean import logger

# A job step imports this module: the cache, P2P code, logging and typing only when used.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Iterable, Mapping, Optional

    from transfer.cache import NodeCache
    from transfer.ops import Operation
    from transfer.pacing import Pacer
    from transfer.p2p.source import PeerIndexSource

    Warn = Callable[[str], None]

__all__ = ["cache_needed", "open_node_cache", "open_pacer", "open_peers"]

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


def open_pacer(env: "Mapping[str, str]") -> "Pacer":
    """A pacer whose prefix rates the user's jobs on this node share, in the node's rate file
    (:mod:`transfer.pacing_node`; nothing is opened until a prefix is used, nothing created
    until one is throttled)."""
    from transfer.pacing import Pacer
    from transfer.pacing_node import NodeStates, node_rate_dir
    import time
    return Pacer(NodeStates(node_rate_dir(env), time.time))
