"""The node cache's part in the engine's pipelined pass of small downloads (:mod:`transfer.batched`).

With the node cache on, the pass leaves the cache's hits to the engine's per-file path (served
from their entries, without a request), and each body the pass reads fills the object's cache
entry and the destination, as a per-file miss does (:meth:`~transfer.cache.NodeCache.fetch`
with ``missed=True``).
"""

from __future__ import annotations

from transfer.batched import write_file
from transfer.errors import TransferError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Callable, List, Optional, Sequence, Tuple

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

    def split(self, indexed: Sequence[Item]) -> Tuple[List[Item], List[Item]]:
        """(hits, misses) of ``indexed`` (position, transfer), each in the given order: a hit is
        a transfer whose first source the cache holds."""
        hits: List[Item] = []
        misses: List[Item] = []
        for item in indexed:
            (hits if self.hit(item[1].sources[0]) else misses).append(item)
        return hits, misses

    def hit(self, url: Url) -> bool:
        """The cache holds ``url``'s object; False where asking fails (its backend cannot be
        made: the per-file path meets the same error and reports it for that file alone)."""
        try:
            key = self._cache_key(url)
            return key is not None and self._cache.contains(key)
        except TransferError:
            return False

    def write(self, op: Transfer, body: bytes, info: ObjectInfo) -> int:
        """The pipelined pass's ``write`` with the node cache: ``body`` (verified, of the object
        ``op`` reads) fills the cache entry and the destination, as the engine's per-file fill
        does; an object the cache does not take is written to the destination alone. An entry of
        another version found at the fill (another job's, of the object before it was replaced)
        is replaced by ``body``, not handed out."""
        key = self._cache_key(op.sources[0])
        if key is None:
            return write_file(op, body, info)

        def received(sink: BinaryIO) -> ObjectInfo:
            sink.write(body)
            return info

        return self._cache.fetch(key, op.dest.path, received, missed=True, fresh=info.version)[0]
