"""The node-cache layer: the top of a stack whose endpoint's objects the cache may keep.

Each read fills the object's cache key, or the one the layer below names
(:meth:`~transfer.layers.Reader.kept_under`: a bundle member's own key) unless the node holds
the plain object, which wins. A hit
links or copies the entry to the destination without a request; a miss asks the layer
below into the entry's temp file (:meth:`~transfer.cache.NodeCache.fetch`: one filler per key
on the node), publishes it, then links it, and tells a layer below that announces entries
(:class:`~transfer.layers.Announces`: the peers) what it now holds. Imported only where a node
cache is on.
"""

from __future__ import annotations

from transfer.backends.base import ObjectInfo
from transfer.cached_reads import CachedReads
from transfer.errors import TransferError, TransientError
from transfer.layers import Announces
from transfer.layers.bundles import ORIGIN as BUNDLES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Dict, List, Optional, Sequence, Tuple

    from transfer._threads import Cancel
    from transfer.backends.base import ByteRange, CacheKeys
    from transfer.cache import NodeCache
    from transfer.layers import Prepared, Reader
    from transfer.urls import Url

__all__ = ["CacheLayer"]

_OWN_MODE = 0o666  # fetch_to's default: the cache hands out its entry its own way
_MISSED_KEPT = 1 << 16  # keys of misses kept for the reads that take their bodies, at most


# A miss's key is found by (url.host, url.path) (a Url hashes all its fields, slowly), spelt out
# where it is used: a call per use costs a small GET 1% of CPU.


class _Refill(Exception):
    """What a fill read is kept under another key (``key``; None: not kept)."""

    def __init__(self, key: Optional[str]) -> None:
        super().__init__(key)
        self.key = key


class CacheLayer:
    """:class:`~transfer.layers.Reader` over ``below`` through ``cache``, keyed by the endpoint
    backend's ``keys``. Thread-safe; any number of processes may share the cache."""

    def __init__(self, below: Reader, cache: NodeCache, keys: CacheKeys) -> None:
        self._below = below
        self._cache = cache
        self._keys = keys
        self._announces = below if isinstance(below, Announces) else None
        self._ahead = CachedReads(cache)
        self._missed: Dict[Tuple[str, str], str] = {}  # (host, path) of a miss at prepare -> its key

    def kept_under(self, url: Url) -> Optional[str]:
        return self._below.kept_under(url)

    def locate(self, batch: Sequence[Url]) -> bool:
        return self._below.locate(batch)

    def stat(self, url: Url) -> ObjectInfo:
        return self._below.stat(url)

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        return self._below.get(url, sink, byte_range)

    def fetch_to(self, url: Url, path: str, link: bool = False, mode: int = 0o666) -> int:
        """The cache's entry at ``path`` (a symlink to it with ``link``), filled from below on a
        miss. The default ``mode`` leaves the cache its own way (a read-only hard link of the
        entry where it can); any other makes ``path`` a copy of its own with that mode (before
        the umask), leaving the entry's as it is."""
        if url.is_local:
            return self._below.fetch_to(url, path, link, mode)
        held = self._below.take(url) if not link and mode == _OWN_MODE else None
        if held is not None:  # read ahead, a miss at prepare: a member under its own key, else the object's
            # (a link or a mode of its own goes the fill's way below, which takes the held body as well)
            missed = self._missed.pop((url.host, url.path), "")
            info = held[1]
            if info.origin == BUNDLES and info.version is not None:
                return self._ahead.write(info.version, path, held[0], ObjectInfo(url, info.size), "bundle")
            return self._ahead.write(missed or self._keys.cache_key(url), path, held[0], info)
        member = self._below.kept_under(url)
        plain = self._keys.cache_key(url)
        key = plain if member is None or self._cache.contains(plain) else member  # the plain object wins
        try:
            return self._fetch(url, key, plain, path, (link, None if mode == _OWN_MODE else mode))
        except _Refill as moved:  # a 404 met in the fill found a member, kept under its own key
            if moved.key is None:
                return self._below.fetch_to(url, path, link, mode)
            return self._fetch(url, moved.key, plain, path, (link, None if mode == _OWN_MODE else mode), last=True)

    def _fetch(self, url: Url, key: str, plain: str, path: str, how: Tuple[bool, Optional[int]],
               last: bool = False) -> int:
        """One fill of ``key``, whose bytes must be what ``key`` names: a member's key
        (``ObjectInfo.version`` of a read bundles served) or the plain object's. ``how``: link,
        and the mode of a copy of its own (None: the cache's way)."""
        got: List[ObjectInfo] = []

        def fill(sink: BinaryIO) -> ObjectInfo:
            info = self._below.get(url, sink)
            kept = info.version if info.origin == BUNDLES else plain
            if kept != key:  # raised inside the fill: the cache keeps nothing of it
                if last:
                    raise TransientError("the object moved between the store and a bundle while it was read",
                                         url=str(url), operation="get")
                raise _Refill(kept)
            got.append(info)
            return info

        nbytes, hit = self._cache.fetch(key, path, fill, symlink=how[0], mode=how[1])
        if not hit and key == plain and self._announces is not None:
            meta = self._cache.describe(key)  # None: the cache did not keep it, nothing to announce
            if meta is not None:
                self._announces.announce(url, got[0] if got else ObjectInfo(url, meta.size), meta.sha256)
        return nbytes

    def prepare(self, batch: Sequence[Url], cancel: Optional[Cancel] = None) -> Prepared:
        """The misses of ``batch`` go below (a hit costs no request: nothing to plan), the
        cache asked for the batch at once (:meth:`~transfer.cache.NodeCache.holds`); each
        miss's key is kept for the read that takes its body (made once per file)."""
        remote = [url for url in batch if not url.is_local]
        keys = [self._key(url) for url in remote]
        misses: List[Url] = []
        if len(self._missed) > _MISSED_KEPT:  # reads cancelled before taking theirs
            self._missed.clear()
        for url, key, hit in zip(remote, keys, self._cache.holds(keys)):
            if not hit:
                misses.append(url)
                if key is not None:
                    self._missed[url.host, url.path] = key
        if misses and self._below.locate(misses):
            misses = self._member_misses(misses)
        return self._below.prepare(misses, cancel)  # the generator below, as it is

    def _member_misses(self, misses: List[Url]) -> List[Url]:
        """``misses`` but those a member serves whose entry the cache holds under the
        member's own key (:meth:`~transfer.layers.Reader.kept_under`, now that below located them)."""
        members = [(url, key) for url, key in ((url, self._below.kept_under(url)) for url in misses) if key is not None]
        if not members:
            return misses
        hits = {id(url) for (url, _), hit in zip(members, self._cache.holds([key for _, key in members])) if hit}
        return [url for url in misses if id(url) not in hits] if hits else misses

    def take(self, url: Url) -> Optional[Tuple[bytes, ObjectInfo]]:
        return self._below.take(url)

    def _key(self, url: Url) -> Optional[str]:
        """``url``'s cache key; None where asking fails (the read reports it)."""
        try:
            return self._keys.cache_key(url)
        except TransferError:
            return None
