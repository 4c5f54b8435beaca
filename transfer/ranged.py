"""Large downloads as parallel ranged GETs into one file, verified as strictly as one stream.

:func:`download` first sends the full-object GET a single-stream download would send; its head
gives the size, the ETag and the whole-object checksum the store offers. Below twice the part
size, or without an ETag to pin the version, the body is read to the end: the single-stream
path. Otherwise the object is cut into parts. The first GET keeps reading parts from the front;
helpers on the engine's :class:`PartPool` take parts from the back with ranged GETs; each part
is written in place with ``os.pwrite``. The two meet in the middle, where the first GET is
dropped (its connection closed). When the pool is busy with other files' parts, the first GET
simply reads more of the object itself.

Integrity is that of one stream:

* every ranged GET carries ``If-Match: ETag`` and must answer exactly the range asked, of an
  object of the same size and ETag, so a changed object fails the download (RemoteError, not
  retried: the input changed under the job) instead of mixing two versions;
* the whole-object checksum (MD5 ETag of a single-part object, or an ``x-amz-checksum-*``
  header) is still computed over the whole object, in order: inline over the first GET's
  bytes, then over the helpers' parts read back from the file as each completes (page cache,
  overlapping the transfers still running). Per-part checks would need per-part checksums,
  which S3 has only for objects uploaded with composite checksums;
* the byte count of every part and of the file.

The file is the caller's :class:`~transfer.atomic.AtomicFile`: renamed into place only after
all of this passes, removed on any failure. Helpers are always joined before the file closes.
Node-cache and peer sinks are not plain files and keep the single stream.
"""

from __future__ import annotations

import os

from transfer import _threads
from transfer.atomic import AtomicFile, pwrite_all
from transfer.backends.base import ObjectInfo, ObjectStream, RangedReads, RunningCheck
from transfer.errors import ChecksumMismatch
from transfer.urls import Url

from transfer._workers import Workers

TYPE_CHECKING = False
if TYPE_CHECKING:
    from concurrent.futures import Executor, Future
    from typing import Any, Callable, List, Optional, Tuple

    from transfer.pacing import Pace

_READ_BACK = 1 << 20


class PartPool:
    """The engine's one budget of part transfers: the multipart-upload parts and download
    ranges of every file share ``workers`` threads, instead of each large file starting a
    pool of its own (which let threads x threads parts queue for the endpoint's connections).

    ``executor`` replaces the threads (an inline executor in tests). Part tasks never wait on
    other tasks, so file tasks may wait on them without deadlock."""

    def __init__(self, workers: int, executor: Optional[Executor] = None) -> None:
        self.workers = max(1, workers)
        self._given = executor
        self._pool: Optional[Workers] = None
        self._lock = _threads.Lock()
        self._runs = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> "Future[Any]":
        if self._given is not None:
            return self._given.submit(fn, *args)
        with self._lock:
            if self._pool is None:
                self._pool = Workers(self.workers, thread_name_prefix="part")
            return self._pool.submit(fn, *args)

    def enter(self) -> None:
        """A run starts using the pool (runs of one engine may overlap)."""
        with self._lock:
            self._runs += 1

    def leave(self) -> None:
        """A run is done: the last one out drops the threads (never while another run's parts
        may still be queued, which once hung two threads calling ``run`` at once)."""
        with self._lock:
            self._runs -= 1
            pool = None
            if self._runs == 0:
                pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def shutdown(self) -> None:
        """Wait for running parts and drop the threads; the next submit starts new ones."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def join(futures: List["Future[Any]"]) -> None:
    """Cancel what has not started and wait for what has (nothing may outlive its file)."""
    for future in futures:
        future.cancel()
    for future in futures:
        try:
            future.result()
        except BaseException:  # noqa: B036 - the part's own outcome is its file's; this only waits
            if not future.done():
                raise  # an interrupt while waiting


class _Parts:
    """Which parts are taken: the first GET claims from the front, helpers from the back."""

    def __init__(self, size: int, part_size: int) -> None:
        self.size = size
        self.part_size = part_size
        self.count = -(-size // part_size)
        self.done = [_threads.Event() for _ in range(self.count)]
        self.failure: Optional[BaseException] = None
        self._front, self._back = 0, self.count
        self._lock = _threads.Lock()

    def span(self, index: int) -> Tuple[int, int]:
        start = index * self.part_size
        return start, min(start + self.part_size, self.size)

    def claim(self, front: bool) -> Optional[int]:
        with self._lock:
            if self.failure is not None or self._front >= self._back:
                return None
            if front:
                self._front += 1
                return self._front - 1
            self._back -= 1
            return self._back

    def fail(self, err: BaseException) -> None:
        with self._lock:
            if self.failure is None:
                self.failure = err
        for event in self.done:  # wake the waiter; it finds the failure
            event.set()


def _writer(fd: int, offset: int, check: Optional[RunningCheck] = None) -> Callable[[bytes], None]:
    """A ``write`` that puts consecutive bytes at ``offset`` onwards (and feeds ``check``)."""
    position = [offset]

    def write(data: bytes) -> None:
        if check is not None:
            check.update(data)
        pwrite_all(fd, data, position[0])
        position[0] += len(data)
    return write


def download(backend: RangedReads, url: Url, out: AtomicFile, pool: PartPool, part_size: int,
             pace: Optional[Pace] = None) -> int:
    """Fetch ``url`` into ``out`` and commit it; returns the size. See the module doc. Each
    ranged part after the first GET waits for its token from ``pace`` (:mod:`transfer.pacing`):
    no burst of parts into a prefix the store throttles."""
    stream = backend.open_read(url)
    info, check = stream.info, stream.check
    try:
        fd = out.fd
        if info.size < 2 * part_size or not info.version:
            count = stream.read(info.size, _writer(fd, 0, check))
        else:
            count = _parallel(backend, url, stream, fd, _Parts(info.size, part_size), pool, info, check, pace)
    finally:
        stream.close()
    if count != info.size:
        raise ChecksumMismatch(f"received {count} bytes, expected {info.size}", url=str(url), operation="get")
    if check is not None and not check.matches():
        raise ChecksumMismatch(f"{check.name.upper()} of received bytes differs from the store's", url=str(url),
                               operation="get")
    return out.commit_written(info.size)  # every byte of [0, size) was written at its offset and counted


def _parallel(backend: RangedReads, url: Url, stream: ObjectStream, fd: int, parts: _Parts, pool: PartPool,
              info: ObjectInfo, check: Optional[RunningCheck], pace: Optional[Pace] = None) -> int:
    assert info.version is not None
    version = info.version

    def helper() -> None:
        while (index := parts.claim(front=False)) is not None:
            start, end = parts.span(index)
            try:
                if pace is not None:
                    pace.acquire()
                backend.get_range(url, (start, end), version, info.size, _writer(fd, start))
            except BaseException as err:  # noqa: B036 - handed to the file's thread
                parts.fail(err)
                return
            parts.done[index].set()

    helpers = [pool.submit(helper) for _ in range(min(pool.workers, parts.count - 1))]
    try:
        streamed = 0
        while (index := parts.claim(front=True)) is not None:
            start, end = parts.span(index)
            if stream.read(end - start, _writer(fd, start, check)) != end - start:
                raise ChecksumMismatch(f"the body ended before byte {end}", url=str(url), operation="get")
            streamed = index + 1
        stream.close()  # the rest is the helpers'
        for index in range(streamed, parts.count):
            parts.done[index].wait()
            if parts.failure is not None:
                raise parts.failure
            if check is not None:
                _read_back(fd, parts.span(index), check)
    except BaseException as err:
        parts.fail(err)  # helpers claim nothing more
        raise
    finally:
        join(helpers)
    return info.size


def _read_back(fd: int, span: Tuple[int, int], check: RunningCheck) -> None:
    position, end = span
    while position < end:
        data = os.pread(fd, min(_READ_BACK, end - position), position)
        if not data:
            raise ChecksumMismatch(f"file ends at {position} bytes, part ends at {end}", operation="get")
        check.update(data)
        position += len(data)
