"""A body read ahead (:meth:`transfer.layers.store.StoreReader.prepare`) into the node cache
and its destination: the cache layer's fill when the bytes are in memory already.

When the process collects inserts (:mod:`transfer.cache.behind`: the drop-in and the node
stager do), the body is written once, into a file in the cache linked at the destination,
which the insert after the job's answer renames into the entry; else it fills the object's
cache entry and the destination at once, as a miss does (:meth:`~transfer.cache.NodeCache.fetch`
with ``missed=True``). A miss then costs the job what no cache costs, one file made (and a
link): the entry's lock and metadata files are made by the process that fills the cache after
the job has its files.
"""

from __future__ import annotations

from transfer._digests import sha256_hex
from transfer.atomic import atomic_write_bytes
from transfer.cache import behind

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Optional, Set

    from transfer.backends.base import ObjectInfo
    from transfer.cache import NodeCache

__all__ = ["CachedReads"]


class CachedReads:
    """``cache`` as bodies read ahead reach it. Thread-safe."""

    def __init__(self, cache: NodeCache) -> None:
        self._cache = cache
        self._unlinked: Set[str] = set()  # destination directories the cache cannot hard-link into

    def _stage(self, key: str, body: bytes, dest: str) -> Optional[str]:
        """:meth:`~transfer.cache.NodeCache.stage_linked`, not tried again in a directory where
        it could not link (another filesystem: each try costs a file made in the cache)."""
        directory = dest[:dest.rfind("/") + 1]
        config = self._cache.config
        if directory in self._unlinked or not (config.hardlink and config.verifies(len(body))):
            return None
        temp = self._cache.stage_linked(key, body, dest)
        if temp is None:
            self._unlinked.add(directory)
        return temp

    def write(self, key: str, path: str, body: bytes, info: ObjectInfo, source: str = "download") -> int:
        """``body`` (verified, of the object kept under ``key``) at ``path``: when the process
        collects inserts, written once, into a temp file in the cache hard-linked at ``path``
        (:meth:`~transfer.cache.NodeCache.stage_linked`; where the cache cannot link there,
        ``path`` is written as without the cache), and queued for the cache behind the job's
        answer, which renames that file into the entry; when the queue has no room, inserted
        now. Else it fills the cache entry and ``path``, as a miss does (an object the cache
        does not take is written to ``path`` alone). Either way, an entry of another version
        (another job's, of the object before it was replaced) is replaced by ``body``, not
        handed out. ``source``: what the entry's metadata records, when inserted behind
        ("download"; "bundle" for a bundle member's body)."""
        if behind.collecting():
            member = (key, body, sha256_hex(body))
            temp = self._stage(key, body, path)
            if temp is None:
                atomic_write_bytes(path, body)
            if not behind.offer(self._cache, [member], info.version, source, [temp]):
                self._cache.insert_members([member], info.version, source=source, temps=[temp])
            return len(body)  # the entry: made after the job's answer

        def received(sink: BinaryIO) -> ObjectInfo:
            sink.write(body)
            return info

        return self._cache.fetch(key, path, received, missed=True, fresh=info.version)[0]
