"""What the jobs of one node share, opened from settings: the node cache and peer sharing.

The front ends (drop-in, HTCondor plugin, stager) and library users open both the same way:
``open_node_cache(env)`` then ``open_peers(env, cache)``, and pass them to
:class:`~transfer.engine.Engine`. A job never fails for its cache: an unusable cache or bad
peer settings are one warning and the transfer goes on without them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Mapping, Optional

from transfer.cache import NodeCache, cache_from_settings
from transfer.errors import TransferError

if TYPE_CHECKING:
    from transfer.p2p.source import PeerIndexSource

__all__ = ["open_node_cache", "open_peers"]

_log = logging.getLogger(__name__)


def open_node_cache(env: Mapping[str, str]) -> Optional[NodeCache]:
    """The node cache ``PEGASUS_CLOUDIO_CACHE_*`` in ``env`` configures, or None when it is off
    or unusable (one warning)."""
    try:
        return cache_from_settings(env)
    except (TransferError, OSError) as err:
        _log.warning("Node cache disabled: %s", err)
        return None


def open_peers(env: Mapping[str, str], cache: Optional[NodeCache]) -> Optional["PeerIndexSource"]:
    """Peer sharing when ``PEGASUS_CLOUDIO_P2P_*`` configures it and there is a node cache;
    None otherwise, or (one warning) when its settings are bad or the redis package is missing."""
    if cache is None:
        return None
    from transfer.p2p import peer_source_from_env  # redis and the index client: only when asked
    try:
        return peer_source_from_env(env, cache, warn=_log.warning)
    except TransferError as err:
        _log.warning("Peer sharing disabled: %s", err)
        return None
