"""The bottom of every read stack: the backend of one endpoint.

:class:`StoreReader` reads large objects in parallel ranged parts where the backend can
(:class:`~transfer.backends.base.RangedReads`, :mod:`transfer.ranged`) and with one plain GET
otherwise, into a temp file beside the destination that is renamed into place
(:class:`~transfer.atomic.AtomicFile`). It holds plain values only: the backend, the part pool
all ranged reads of an engine share, the part size and the pacer of request prefixes.
"""

from __future__ import annotations

from transfer import ranged
from transfer.atomic import AtomicFile
from transfer.backends.base import ranged_reads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Optional, Sequence

    from transfer.backends.base import Backend, ByteRange, ObjectInfo
    from transfer.pacing import Pacer
    from transfer.urls import Url

__all__ = ["StoreReader"]


class StoreReader:
    """:class:`~transfer.layers.Reader` over one backend. Thread-safe as the backend is."""

    def __init__(self, backend: Backend, parts: ranged.PartPool, part_size: int, pacer: Pacer) -> None:
        self.backend = backend
        self._parts = parts
        self._part_size = part_size
        self._pacer = pacer

    def kept_under(self, url: Url) -> Optional[str]:
        """None: the store's objects are kept under their own keys."""
        return None

    def stat(self, url: Url) -> ObjectInfo:
        return self.backend.stat(url)

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        """One GET (the backend verifies the bytes)."""
        return self.backend.get(url, sink, byte_range)

    def fetch_to(self, url: Url, path: str, link: bool = False, mode: int = 0o666) -> int:
        """Ranged parts where the backend reads ranges, else one GET; ``link`` means nothing
        here (no entry to link to)."""
        with AtomicFile(path, mode=mode) as out:
            in_ranges = ranged_reads(self.backend)
            if in_ranges is not None:
                return ranged.download(in_ranges, url, out, self._parts, self._part_size, self._pacer.pace(url))
            self.backend.get(url, out.file)
            return out.commit()

    def prepare(self, batch: Sequence[Url]) -> None:
        """Nothing to plan: the engine's pipelined pass of small reads (:mod:`transfer.batched`)
        runs before the per-file reads."""
