"""Builds the read stack of each endpoint once: node cache -> peers -> store.

A layer that is off is absent: without a node cache, or for a backend whose objects the cache
does not key (:class:`~transfer.backends.base.CacheKeys`), the stack is the bare
:class:`~transfer.layers.store.StoreReader`; peers sit under the cache only (they fill its
entries). The cache and peer layers are imported only when a stack needs them.
"""

from __future__ import annotations

from transfer.backends.base import cache_keys, peer_scopes
from transfer.layers.store import StoreReader

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Optional

    from transfer.backends.base import Backend
    from transfer.cache import NodeCache
    from transfer.layers import Reader
    from transfer.pacing import Pacer
    from transfer.peers import PeerRound
    from transfer.ranged import PartPool

__all__ = ["Stacks"]


class Stacks:
    """One read stack per backend (endpoint), made on first use and kept. ``peers`` (one
    round shared by every endpoint: one index lookup per batch) is used only with ``cache``."""

    def __init__(self, parts: PartPool, part_size: int, pacer: Pacer, cache: Optional[NodeCache] = None,
                 peers: Optional[PeerRound] = None) -> None:
        self._parts = parts
        self._part_size = part_size
        self._pacer = pacer
        self._cache = cache
        self._peers = peers if cache is not None else None
        self._stacks: Dict[int, Reader] = {}

    def reader(self, backend: Backend) -> Reader:
        """The top of ``backend``'s stack (a stack holds its backend: the id stays its own)."""
        found = self._stacks.get(id(backend))
        if found is None:
            found = self._stacks.setdefault(id(backend), self._build(backend))
        return found

    def _build(self, backend: Backend) -> Reader:
        store = StoreReader(backend, self._parts, self._part_size, self._pacer)
        keys = cache_keys(backend)
        if self._cache is None or keys is None:
            return store
        below: Reader = store
        if self._peers is not None:
            from transfer.layers.peers import PeerLayer
            below = PeerLayer(store, self._peers, keys, peer_scopes(backend))
        from transfer.layers.cache import CacheLayer
        return CacheLayer(below, self._cache, keys)
