"""The peer layer: objects other nodes' caches hold, read before the store.

Only a :class:`~transfer.peers.PeerSink` (the node cache's temp file of the entry being filled,
which nothing sees until the cache publishes it) takes a peer's bytes: the peer source streams
them unverified and resets the sink when they fail their size or SHA-256. On any peer or index
failure the read goes on below. :meth:`PeerLayer.prepare` queues the batch's keys for the one
index lookup of the batch (:meth:`~transfer.peers.PeerRound.expect`); :meth:`PeerLayer.announce`
registers an entry the cache layer above has published, under the scope it was verified in.
Imported only where a node cache and peers are on.
"""

from __future__ import annotations

from transfer.backends.base import ObjectInfo
from transfer.peers import PeerSink, Replica
from transfer.layers import nothing_prepared

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Dict, Optional, Sequence, Tuple

    from transfer._threads import Cancel
    from transfer.backends.base import ByteRange, CacheKeys, PeerScopes
    from transfer.layers import Prepared, Reader
    from transfer.peers import PeerRound, Scope
    from transfer.urls import Url

__all__ = ["ORIGIN", "PeerLayer"]

ORIGIN = "peers"  # ObjectInfo.origin of the bytes a peer sent


class PeerLayer:
    """:class:`~transfer.layers.Reader` that asks the peers of ``round`` before ``below``.
    ``keys`` and ``scopes`` are the endpoint backend's capabilities (``scopes`` None: its
    reads are never shared). Thread-safe."""

    def __init__(self, below: Reader, round: PeerRound, keys: CacheKeys, scopes: Optional[PeerScopes]) -> None:
        self._below = below
        self._round = round
        self._keys = keys
        self._scopes = scopes

    def kept_under(self, url: Url) -> Optional[str]:
        """Below's answer, except that a plain object a peer holds wins over a member below."""
        below = self._below.kept_under(url)
        return None if below is None or self._round.holds(self._keys.cache_key(url)) else below

    def locate(self, batch: Sequence[Url]) -> bool:
        """Queue the keys of ``batch`` that have a scope for the batch's one index lookup, and
        locate below those no peer holds (asking that makes the lookup: what a peer holds is
        read from it, never through a bundle)."""
        keys: Dict[str, Scope] = {}
        for url in batch:
            scope = self._scope(url)
            if scope is not None:
                keys.setdefault(self._keys.cache_key(url), scope)
        self._round.expect(keys)
        rest = [url for url in batch if not self._round.holds(self._keys.cache_key(url))] if keys else batch
        return self._below.locate(rest) if rest else False

    def stat(self, url: Url) -> ObjectInfo:
        return self._below.stat(url)

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        """A verified peer body when ``sink`` can be reset (``origin`` "peers"), else below."""
        if byte_range is None and isinstance(sink, PeerSink):
            got = self._round.fetch(self._keys.cache_key(url), sink)
            if got is not None:
                return ObjectInfo(url, got, origin=ORIGIN)
        return self._below.get(url, sink, byte_range)

    def fetch_to(self, url: Url, path: str, link: bool = False, mode: int = 0o666) -> int:
        """A peer's bytes are only taken into a cache entry: this goes below."""
        return self._below.fetch_to(url, path, link, mode)

    def prepare(self, batch: Sequence[Url], cancel: Optional[Cancel] = None) -> Prepared:
        """Only the bundle members no peer holds as plain objects go below (their bundles read
        ahead); a store's read-ahead would GET what peers hold. The keys were queued for the
        batch's lookup by :meth:`locate`, which the layer above calls first."""
        members = [url for url in batch if self.kept_under(url) is not None]
        return self._below.prepare(members, cancel) if members else nothing_prepared()

    def take(self, url: Url) -> Optional[Tuple[bytes, ObjectInfo]]:
        return self._below.take(url)

    def announce(self, url: Url, info: ObjectInfo, sha256: str) -> None:
        """Register the entry of ``url`` the cache above published: under the scope a peer's
        bytes were found and verified in, else under the scope of the identity that read it
        from the store (not the one looked up for the key: another source of the batch, maybe
        of an identity the store refuses this object to); not at all when that has none."""
        key = self._keys.cache_key(url)
        replica = Replica(key, info.size, sha256)
        if info.origin == ORIGIN:
            self._round.stored(key, replica=replica)
            return
        scope = self._scope(url)
        if scope is not None:
            self._round.stored(key, scope, replica)

    def _scope(self, url: Url) -> Optional[Scope]:
        return self._scopes.peer_scope(url) if self._scopes is not None else None
