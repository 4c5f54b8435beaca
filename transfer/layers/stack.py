"""Builds the read stack of each endpoint once: node cache -> peers -> bundles -> store.

A layer that is off is absent: without a node cache, or for a backend whose objects the cache
does not key (:class:`~transfer.backends.base.CacheKeys`), there is no cache layer; peers sit
under the cache only (they fill its entries). The bundle layer sits in every stack given a
:class:`~transfer.layers.bundles.StagerSlot` (a store's 404 may be a member's, whatever the settings) and costs a read
one attribute check until bundles are used. The cache and peer layers are imported only when a
stack needs them.
"""

from __future__ import annotations

from transfer.backends.base import cache_keys, peer_scopes
from transfer.layers.store import StoreReader

TYPE_CHECKING = False
if TYPE_CHECKING:
    from concurrent.futures import Executor
    from typing import Dict, Generator, List, Optional, Sequence

    from transfer._threads import Cancel
    from transfer.backends.base import Backend
    from transfer.session import Session
    from transfer.cache import NodeCache
    from transfer.layers import Reader
    from transfer.layers.bundles import StagerSlot
    from transfer.pacing import Pacer
    from transfer.peers import PeerRound
    from transfer.ranged import PartPool
    from transfer.urls import Url

__all__ = ["Stacks"]


class Stacks:
    """One read stack per backend (endpoint) of ``session``, made on first use and kept.
    ``peers`` (one round shared by every endpoint: one index lookup per batch) is used only
    with ``cache``; ``bundles`` puts a bundle layer over each store; ``connections``: what a
    store's read-ahead may use; ``executor``: an engine's injected one, for the bundle layers'
    reads (tests), else None."""

    def __init__(self, session: Session, parts: PartPool, part_size: int, pacer: Pacer,
                 cache: Optional[NodeCache] = None, peers: Optional[PeerRound] = None,
                 bundles: Optional[StagerSlot] = None, connections: int = 2,
                 executor: Optional[Executor] = None) -> None:
        self._session = session
        self._connections = connections
        self._parts = parts
        self._part_size = part_size
        self._pacer = pacer
        self._cache = cache
        self._peers = peers if cache is not None else None
        self._bundles = bundles
        self._executor = executor
        self._stacks: Dict[int, Reader] = {}

    def reader(self, backend: Backend) -> Reader:
        """The top of ``backend``'s stack (a stack holds its backend: the id stays its own)."""
        found = self._stacks.get(id(backend))
        if found is None:
            found = self._stacks.setdefault(id(backend), self._build(backend))
        return found

    def reader_of(self, url: Url) -> Reader:
        """The top of the stack of ``url``'s endpoint; the TransferError of a backend that
        cannot be made."""
        backend = self._session.backend(url)
        found = self._stacks.get(id(backend))  # :meth:`reader`'s look-up, a call less per read
        return found if found is not None else self.reader(backend)

    def prepare(self, batch: Sequence[Url], cancel: Optional[Cancel] = None) -> Generator[List[Url], None, None]:
        """Each endpoint's stack plans its part of ``batch`` (:meth:`~transfer.layers.Reader.prepare`),
        one after the other; yields the URLs whose bodies a layer now holds, as they come. A
        URL whose backend cannot be made is left to its read, which reports it. Close the
        generator to end a read-ahead early."""
        for backend, urls in self._session.by_backend(batch):
            yield from self.reader(backend).prepare(urls, cancel)

    def _build(self, backend: Backend) -> Reader:
        below: Reader = StoreReader(backend, self._parts, self._part_size, self._pacer, self._connections)
        if self._bundles is not None:
            from transfer.layers.bundles import BundleLayer
            below = BundleLayer(below, self._bundles, self._pacer, self._connections, self._executor)
        keys = cache_keys(backend)
        if self._cache is None or keys is None:
            return below
        if self._peers is not None:
            from transfer.layers.peers import PeerLayer
            below = PeerLayer(below, self._peers, keys, peer_scopes(backend))
        from transfer.layers.cache import CacheLayer
        return CacheLayer(below, self._cache, keys)
