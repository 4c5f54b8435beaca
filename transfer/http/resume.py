"""Bodies that survive a broken connection, inside one request of one file attempt.

A reset, a stall past the read timeout or a connection closed before Content-Length was
reached (a :class:`~transfer.errors.TransientError` raised while the body is read) costs the
whole file attempt when the engine is the only one to retry: with 1 request in 7 reset by a
proxy, 300 files over 3 attempts lost about one file per run. So, as s3transfer does, the
body is resumed from the byte it reached: ``reopen(offset)`` sends a ranged GET of the rest
pinned to the first answer's version (S3: ``If-Match`` on the ETag; the backend checks the
answer's status, ``Content-Range`` and ETag and raises if the object changed), at most
:data:`RESUMES` times per body. The bytes already written stay written and a running checksum
keeps its state, so the caller sees one body.

A request whose answer never started (a reset before any byte, a refused or timed-out
connect) is sent again by :func:`send_idempotent`, for idempotent requests only (GET, HEAD),
at most :data:`RESUMES` times. Error answers (503 ``SlowDown``, 500) are answers, not
failures here: they go back to the engine, whose per-file retries back off.
"""

from __future__ import annotations

from transfer.errors import ChecksumMismatch, TransientError
from transfer.lean import logger

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional, TypeVar

    from transfer.http.pool import PooledResponse

    T = TypeVar("T")

RESUMES = 3  # per body (and per request that never got an answer); the file's attempt follows
_log = logger(__name__)  # logging is imported at the first line (a job step without a cut never does)


def send_idempotent(send: Callable[[], T], url: str, tries: int = RESUMES + 1) -> T:
    """``send()``, sent again (at most ``tries`` in all) while it raises TransientError before
    any answer. Only for requests that may be repeated (GET, HEAD)."""
    for left in range(tries - 1, -1, -1):
        try:
            return send()
        except TransientError as err:
            if not left:
                raise
            _log.debug("%s: %s; sending it again (%d more at most)", url, err, left - 1)
    raise AssertionError("unreachable")


class ResumingBody:
    """The body of ``response`` (bytes ``start`` .. ``end`` of the object, ``end`` exclusive),
    read through cuts: a TransientError mid-body is followed by ``reopen(offset)``, the answer
    for bytes ``offset`` .. ``end`` (checked by the caller), at most ``resumes`` times.
    Not thread-safe; one reader."""

    __slots__ = ("_response", "_reopen", "_position", "_end", "_url", "_resumes")

    def __init__(self, response: PooledResponse, reopen: Optional[Callable[[int], PooledResponse]],
                 start: int, end: int, url: str, resumes: int = RESUMES) -> None:
        """``reopen`` None: no resume (no version to pin it to), failures go to the caller."""
        self._response = response
        self._reopen = reopen
        self._position = start
        self._end = end
        self._url = url
        self._resumes = resumes if reopen is not None else 0

    @property
    def complete(self) -> bool:
        return self._position >= self._end

    def read_into(self, write: Callable[[bytes], object]) -> int:
        """The rest of the body to ``write``; the byte count written by this call."""
        return self.read_part(self._end - self._position, write)

    def read_part(self, length: int, write: Callable[[bytes], object]) -> int:
        """The next ``length`` bytes (fewer if the body ends first) to ``write``."""
        target = min(self._end, self._position + length)
        first = self._position

        def counted(data: bytes) -> None:
            write(data)
            self._position += len(data)

        while self._position < target:
            before = self._position
            try:
                self._response.read_part(target - before, counted, self._url)
            except TransientError as err:
                self._resume(err)
                continue
            if self._position == before:
                break  # the body ended early without an error: the caller's count check says so
        return self._position - first

    def _resume(self, err: TransientError) -> None:
        """A new answer for the rest, or ``err`` once the resumes are spent."""
        reopen, offset = self._reopen, self._position
        if self._resumes <= 0 or reopen is None:
            raise err
        self._resumes -= 1
        _log.debug("%s: %s; resuming at byte %d (%d more at most)", self._url, err, offset, self._resumes)
        self._response.discard()
        self._response = send_idempotent(lambda: reopen(offset), self._url)

    def discard(self) -> None:
        self._response.discard()

    def __enter__(self) -> "ResumingBody":
        return self

    def __exit__(self, *exc: object) -> None:
        self._response.__exit__(*exc)


def read_range(reopen: "Callable[[int], PooledResponse]", first: int, end: int, url: str,
               write: "Callable[[bytes], object]") -> int:
    """Bytes ``[first, end)`` of one object into ``write``: ``reopen(offset)`` asks for the rest
    from ``offset`` pinned to the version read (the backend checks the answer), a cut resumed
    as in :class:`ResumingBody`; ChecksumMismatch when fewer bytes came. Returns the count."""
    with ResumingBody(send_idempotent(lambda: reopen(first), url), reopen, first, end, url) as body:
        count = body.read_into(write)
    if count != end - first:
        raise ChecksumMismatch(f"received {count} bytes of range {first}-{end - 1}, expected {end - first}",
                               url=url, operation="get")
    return count
