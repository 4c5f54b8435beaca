"""The two streams of an fsspec file: reads ahead in blocks, and writes parts as they fill.

Memory is bounded by the block size times the blocks (or parts) in flight, and neither
direction writes a local file. Both overlap requests with the caller's own work, since one
request at a time leaves a sequential reader or writer at the speed of one round trip per block
(issue 33: ``open(..., "rb")`` and ``"wb"`` against ``read_bytes`` and ``copy``).
"""

from __future__ import annotations

import contextlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Deque, Dict, List, Optional

from fsspec.caching import BaseCache

from transfer.backends.base import MultipartUploads
from transfer.errors import TransferError
from transfer.urls import Url

__all__ = ["PartStream", "ReadAhead"]


class ReadAhead(BaseCache):  # type: ignore[misc]  # fsspec is untyped
    """A block cache for sequential reads: ``ahead`` blocks after the last one read are fetched
    in the background (only while reads are sequential: a seek elsewhere fetches just what it
    reads), and blocks behind the reader are dropped, so at most ``ahead + 1`` blocks are held.
    A fetch's error is raised by the read that needs its block; reading it again fetches again."""

    name = "cloudio-readahead"

    def __init__(self, blocksize: int, fetcher: Callable[[int, int], bytes], size: int, ahead: int = 2) -> None:
        super().__init__(blocksize, fetcher, size)
        self.ahead = max(0, ahead)
        self._blocks: Dict[int, "Future[bytes]"] = {}
        self._pool: Optional[ThreadPoolExecutor] = None
        self._last = -1  # the last block read; the next read is sequential if it starts there or after it

    def _fetch(self, start: Optional[int], stop: Optional[int]) -> bytes:
        start = 0 if start is None else start
        stop = self.size if stop is None else min(stop, self.size)
        if start >= stop:
            return b""
        first, last = start // self.blocksize, (stop - 1) // self.blocksize
        sequential = self._last <= first <= self._last + 1
        wanted = range(first, last + 1 + (self.ahead if sequential else 0))
        for index in [i for i in self._blocks if i not in wanted]:
            self._blocks.pop(index).cancel()
        for index in wanted:
            if index not in self._blocks and index * self.blocksize < self.size:
                self._blocks[index] = self._executor().submit(self._block, index)
        try:
            blocks = [memoryview(self._blocks[i].result()) for i in range(first, last + 1)]
        except BaseException:
            self._forget_failed()
            raise
        offset = first * self.blocksize
        blocks[-1] = blocks[-1][:stop - last * self.blocksize]  # cut the last before the first:
        blocks[0] = blocks[0][start - offset:]  # they may be one block
        for index in range(first, last):  # read past: only the last block may be read again
            del self._blocks[index]
        self._last = last
        return b"".join(blocks)  # the one copy: exactly the bytes asked for

    def _forget_failed(self) -> None:
        """Drop the blocks whose fetch failed, so that reading them again fetches them again
        rather than raising the same error for ever."""
        for index in [i for i, f in self._blocks.items() if f.done() and not f.cancelled() and f.exception()]:
            del self._blocks[index]

    def _block(self, index: int) -> bytes:
        begin = index * self.blocksize
        data: bytes = self.fetcher(begin, min(begin + self.blocksize, self.size))
        return data

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.ahead + 1, thread_name_prefix="cloudio-read-ahead")
        return self._pool

    def close(self) -> None:
        """Cancel what is not yet fetched and wait for the fetches under way (fsspec calls
        this when the file closes)."""
        for future in self._blocks.values():
            future.cancel()
        self._blocks.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class PartStream:
    """The parts of one object, sent as a file written to it fills them: a multipart upload
    started with the first full part; each part sent from memory (no local file), up to
    ``in_flight`` at once, so the writer fills the next while earlier ones travel (memory: the
    parts in flight plus the one filling). One attempt per part: a failure aborts the upload
    and is raised by the write (or close) that next waits for a part."""

    def __init__(self, backend: MultipartUploads, url: Url, in_flight: int = 12) -> None:
        self.backend = backend
        self.url = url
        self.in_flight = max(1, in_flight)
        self.upload_id: Optional[str] = None
        self.receipts: List[str] = []
        self._sending: Deque["Future[str]"] = deque()
        self._pool: Optional[ThreadPoolExecutor] = None

    def send(self, data: bytes) -> None:
        """Queue ``data`` as the next part, first waiting for the oldest part while
        ``in_flight`` are travelling."""
        if self.upload_id is None:
            self.upload_id = self.backend.start_upload(self.url)
            self._pool = ThreadPoolExecutor(self.in_flight, thread_name_prefix="cloudio-part")
        while len(self._sending) >= self.in_flight:
            self.receipts.append(self._sending.popleft().result())
        assert self._pool is not None
        number = len(self.receipts) + len(self._sending) + 1
        self._sending.append(self._pool.submit(self.backend.upload_part, self.url, self.upload_id, number, data))

    def finish(self) -> None:
        """Wait for every part, then assemble them."""
        if self.upload_id is None:
            return
        while self._sending:
            self.receipts.append(self._sending.popleft().result())
        self._stop()
        self.backend.complete_upload(self.url, self.upload_id, self.receipts)

    def abort(self) -> None:
        """Cancel the parts not yet sent, wait for those travelling, discard the upload."""
        if self.upload_id is None:
            return
        for future in self._sending:
            future.cancel()
        self._stop()
        self._sending.clear()
        with contextlib.suppress(TransferError):
            self.backend.abort_upload(self.url, self.upload_id)
        self.upload_id = None

    def _stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
