"""The node-cache layer: the top of a stack whose endpoint's objects the cache may keep.

A hit links or copies the entry to the destination without a request; a miss asks the layer
below into the entry's temp file (:meth:`~transfer.cache.NodeCache.fetch`: one filler per key
on the node), publishes it, then links it, and tells a layer below that announces entries
(:class:`~transfer.layers.Announces`: the peers) what it now holds. Imported only where a node
cache is on.
"""

from __future__ import annotations

from transfer.backends.base import ObjectInfo
from transfer.layers import Announces

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, List, Optional, Sequence

    from transfer.backends.base import ByteRange, CacheKeys
    from transfer.cache import NodeCache
    from transfer.layers import Reader
    from transfer.urls import Url

__all__ = ["CacheLayer"]


class CacheLayer:
    """:class:`~transfer.layers.Reader` over ``below`` through ``cache``, keyed by the endpoint
    backend's ``keys``. Thread-safe; any number of processes may share the cache."""

    def __init__(self, below: Reader, cache: NodeCache, keys: CacheKeys) -> None:
        self._below = below
        self._cache = cache
        self._keys = keys
        self._announces = below if isinstance(below, Announces) else None

    def stat(self, url: Url) -> ObjectInfo:
        return self._below.stat(url)

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        return self._below.get(url, sink, byte_range)

    def fetch_to(self, url: Url, path: str, link: bool = False, mode: int = 0o666) -> int:
        """The cache's entry at ``path`` (a symlink to it with ``link``), filled from below on a
        miss. ``mode`` applies to an object the cache does not key (a hit or fill gives the
        cache's own modes, as before the layers)."""
        if url.is_local:
            return self._below.fetch_to(url, path, link, mode)
        key = self._keys.cache_key(url)
        got: List[ObjectInfo] = []

        def fill(sink: BinaryIO) -> ObjectInfo:
            info = self._below.get(url, sink)
            got.append(info)
            return info

        nbytes, hit = self._cache.fetch(key, path, fill, symlink=link)
        if not hit and self._announces is not None:
            meta = self._cache.describe(key)  # None: the cache did not keep it, nothing to announce
            if meta is not None:
                self._announces.announce(url, got[0] if got else ObjectInfo(url, meta.size), meta.sha256)
        return nbytes

    def prepare(self, batch: Sequence[Url]) -> None:
        self._below.prepare(batch)
