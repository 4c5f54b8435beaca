"""The node cache's part in the engine's pipelined pass of small downloads (:mod:`transfer.batched`).

With the node cache on, the pass leaves the cache's hits to the engine's per-file path (served
from their entries, without a request). When the process collects inserts
(:mod:`transfer.cache.behind`: the drop-in and the node stager do), each body the pass reads is
written once, into a file in the cache linked at the destination, which the insert after the
job's answer renames into the entry; else it fills the object's cache entry and the destination
at once, as a per-file miss does (:meth:`~transfer.cache.NodeCache.fetch` with ``missed=True``).
A miss then costs the job what no cache costs, one file made (and a link): the entry's lock and
metadata files are made by the process that fills the cache after the job has its files.
"""

from __future__ import annotations

from transfer._digests import sha256_hex
from transfer.batched import write_file
from transfer.cache import behind
from transfer.errors import TransferError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Callable, Dict, List, Optional, Sequence, Set, Tuple

    from transfer.backends.base import ObjectInfo
    from transfer.cache import NodeCache
    from transfer.ops import Transfer
    from transfer.urls import Url

    Item = Tuple[int, Transfer]

__all__ = ["CachedReads"]


class CachedReads:
    """``cache`` as the pipelined pass sees it; ``cache_key(url)`` is the engine's node-cache
    name of a remote object (None: not cached), which may raise the TransferError of a backend
    that cannot be made."""

    def __init__(self, cache: NodeCache, cache_key: Callable[[Url], Optional[str]]) -> None:
        self._cache = cache
        self._cache_key = cache_key
        self._unlinked: Set[str] = set()  # destination directories the cache cannot hard-link into
        self._keys: Dict[int, str] = {}  # id of a miss's transfer (alive for the pass) -> its key, from split

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

    def split(self, indexed: Sequence[Item]) -> Tuple[List[Item], List[Item]]:
        """(hits, misses) of ``indexed`` (position, transfer), each in the given order: a hit is
        a transfer whose first source the cache holds (asked for the batch at once:
        :meth:`~transfer.cache.NodeCache.holds`)."""
        keys = [self._key(item[1].sources[0]) for item in indexed]
        hits: List[Item] = []
        misses: List[Item] = []
        for item, key, hit in zip(indexed, keys, self._cache.holds(keys)):
            if hit:
                hits.append(item)
            else:
                misses.append(item)
                if key is not None:  # for write: each file's key made once (None: write asks again)
                    self._keys[id(item[1])] = key
        return hits, misses

    def _key(self, url: Url) -> Optional[str]:
        """``url``'s cache key; None where it is not cached, or asking fails (its backend cannot
        be made: the per-file path meets the same error and reports it for that file alone)."""
        try:
            return self._cache_key(url)
        except TransferError:
            return None

    def write(self, op: Transfer, body: bytes, info: ObjectInfo) -> int:
        """The pipelined pass's ``write`` with the node cache: when the process collects inserts,
        ``body`` (verified, of the object ``op`` reads) is written once, into a temp file in the
        cache hard-linked at the destination (:meth:`~transfer.cache.NodeCache.stage_linked`;
        where the cache cannot link there, the destination is written as without the cache),
        and queued for the cache behind the job's answer, which renames that file into the entry;
        when the queue has no room, inserted now. Else it fills the cache entry and the
        destination, as the engine's per-file fill does (an object the cache does not take is
        written to the destination alone). Either way, an entry of another version (another
        job's, of the object before it was replaced) is replaced by ``body``, not handed out."""
        key = self._keys.pop(id(op), None) or self._cache_key(op.sources[0])
        if key is None:
            return write_file(op, body, info)
        if behind.collecting():
            member = (key, body, sha256_hex(body))
            temp = self._stage(key, body, op.dest.path)
            if temp is None:
                write_file(op, body, info)
            if not behind.offer(self._cache, [member], info.version, "download", [temp]):
                self._cache.insert_members([member], info.version, source="download", temps=[temp])
            return len(body)  # the entry: made after the job's answer

        def received(sink: BinaryIO) -> ObjectInfo:
            sink.write(body)
            return info

        return self._cache.fetch(key, op.dest.path, received, missed=True, fresh=info.version)[0]
