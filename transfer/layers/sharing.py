"""The end of a batch with peers: the node cache lets this node's daemon serve what the batch
stored, then the peers register it (``docs/security.md``: a registered entry must be servable).

This is the node cache's side of the peers' publish, kept on the cache's floor so that the
peer round never calls up into the cache: :meth:`~transfer.peers.PeerRound.closing` hands the
batch's entries up, the cache describes those the round has no record of and grants each its
scope's capability, and :meth:`~transfer.peers.PeerRound.publish` registers the granted ones.
Imported only where a node cache and peers are on.
"""

from __future__ import annotations

from transfer.lean import logger, replace
from transfer.peers import Replica

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List

    from transfer.cache import NodeCache
    from transfer.peers import PeerRound

__all__ = ["publish_batch"]

_log = logger("transfer.p2p")


def publish_batch(cache: NodeCache, round: PeerRound) -> None:
    """Grant and register what this batch stored in ``cache`` (an entry the cache no longer
    holds, or cannot grant, is not registered: no peer could read it)."""
    granted: List[Replica] = []
    failed = 0
    for key, scope, replica in round.closing():
        if replica is None:
            meta = cache.describe(key)
            if meta is None:
                continue
            replica = Replica(key, meta.size, meta.sha256)
        try:
            if cache.grant(key, scope.capability(key)):
                granted.append(replace(replica, scope=scope))
        except OSError as err:
            failed += 1
            if failed == 1:  # one line per batch: the cache directory is the same for all
                _log.warning("node cache: cannot share %s: %s", key, err)
    round.publish(granted)
