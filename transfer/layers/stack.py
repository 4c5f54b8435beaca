"""Builds the read stack of each endpoint once: node cache -> peers -> bundles -> store.

A layer that is off is absent: without a node cache, or for a backend whose objects the cache
does not key (:class:`~transfer.backends.base.CacheKeys`), there is no cache layer; peers sit
under the cache only (they fill its entries). The bundle layer sits in every stack given a
:class:`StagerSlot` (a store's 404 may be a member's, whatever the settings) and costs a read
one attribute check until bundles are used. The cache and peer layers are imported only when a
stack needs them.
"""

from __future__ import annotations

from transfer import _threads
from transfer.backends.base import cache_keys, peer_scopes
from transfer.layers.store import StoreReader

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Optional

    from transfer.backends.base import Backend
    from transfer.bundles.staging import BundleStager
    from transfer.session import Session
    from transfer.cache import NodeCache
    from transfer.layers import Reader
    from transfer.pacing import Pacer
    from transfer.peers import PeerRound
    from transfer.ranged import PartPool

__all__ = ["StagerSlot", "Stacks"]


class StagerSlot:
    """The one bundle stager of an engine (its directory indexes load once per process), made
    on first use: the bundle code is imported only when bundles are used or a read found
    nothing. Shared by the engine's bundle groups and removes and the stacks' bundle layers."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._lock = _threads.Lock()
        self.made: Optional[BundleStager] = None

    def get(self) -> BundleStager:
        if self.made is None:
            from transfer.bundles.staging import BundleStager
            with self._lock:
                if self.made is None:
                    self.made = BundleStager(self._session)
        return self.made


class Stacks:
    """One read stack per backend (endpoint), made on first use and kept. ``peers`` (one
    round shared by every endpoint: one index lookup per batch) is used only with ``cache``;
    ``bundles`` puts a bundle layer over each store."""

    def __init__(self, parts: PartPool, part_size: int, pacer: Pacer, cache: Optional[NodeCache] = None,
                 peers: Optional[PeerRound] = None, bundles: Optional[StagerSlot] = None) -> None:
        self._parts = parts
        self._part_size = part_size
        self._pacer = pacer
        self._cache = cache
        self._peers = peers if cache is not None else None
        self._bundles = bundles
        self._stacks: Dict[int, Reader] = {}

    def reader(self, backend: Backend) -> Reader:
        """The top of ``backend``'s stack (a stack holds its backend: the id stays its own)."""
        found = self._stacks.get(id(backend))
        if found is None:
            found = self._stacks.setdefault(id(backend), self._build(backend))
        return found

    def _build(self, backend: Backend) -> Reader:
        below: Reader = StoreReader(backend, self._parts, self._part_size, self._pacer)
        if self._bundles is not None:
            from transfer.layers.bundles import BundleLayer
            below = BundleLayer(below, self._bundles)
        keys = cache_keys(backend)
        if self._cache is None or keys is None:
            return below
        if self._peers is not None:
            from transfer.layers.peers import PeerLayer
            below = PeerLayer(below, self._peers, keys, peer_scopes(backend))
        from transfer.layers.cache import CacheLayer
        return CacheLayer(below, self._cache, keys)
