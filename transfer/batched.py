"""The engine's first pass over a batch of small downloads: many objects per round trip.

A small GET through the worker threads costs the client more CPU in thread hand-offs than in
the request itself. So, in a run without peers or bundles, the downloads of a remote object to
a local file whose backend offers :class:`~transfer.backends.base.BatchReads` (S3, over HTTP or
HTTPS: pipelined GETs from the engine's own thread, see :mod:`transfer.http.pipeline`) are read
in one pass first, each verified body handed to the caller's ``write`` (by default
:func:`~transfer.atomic.atomic_write_bytes`: a temp name beside the destination, then a rename;
never a partial file under the final name; with a node cache, the engine's fill of the entry).

Every transfer this pass does not finish -- an error answer, a failed check, a large object,
a local write error, no answer -- goes down the engine's ordinary per-file path from scratch,
which makes its attempts, retries and reports exactly as without this pass: the pass is not
counted as an attempt, and costs such a file one request more.
"""

from __future__ import annotations

import time

from transfer.atomic import atomic_write_bytes
from transfer.backends.base import BatchReads, ObjectInfo, batch_reads
from transfer.errors import TransferError
from transfer.ops import Attempt, LinkMode, Result, Transfer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Tuple

    from transfer._threads import Cancel
    from transfer.pacing import Pace, Pacer
    from transfer.retry import RetryBudget
    from transfer.session import Session
    from transfer.urls import Url

    Finish = Callable[[int, Result], None]
    StandsIn = Callable[[Url], bool]
    Write = Callable[[Transfer, bytes, ObjectInfo], int]

__all__ = ["read_batched"]

_MIN_BATCH = 2  # one file gains nothing from a pass of its own


def write_file(op: Transfer, body: bytes, info: ObjectInfo) -> int:
    """The default ``write`` of :func:`read_batched`: ``body`` to the destination, atomically."""
    return atomic_write_bytes(op.dest.path, body)


def read_batched(session: Session, indexed: Sequence[Tuple[int, Transfer]], connections: int, budget: RetryBudget,
                 pacer: Pacer, cancel: Optional[Cancel], finish: Finish, stands_in: StandsIn,
                 write: Write = write_file) -> List[Tuple[int, Transfer]]:
    """Read what it can of ``indexed`` (position, transfer) in one pass, calling
    ``finish(position, result)`` for each file done (what ``finish`` raises leaves this call once
    the pass is over, as it leaves the engine's run on the ordinary path); returns the rest, in order.
    ``stands_in(source)``, asked of a source the store does not have, says whether a bundle
    member stands in for it (its directory's listing waited for briefly, one still under way
    counting as yes): then the pass ends, and the per-file path finds the members (one listing
    per directory, each directory's files waiting only for their own). ``write(op, body, info)``
    puts a verified body where ``op`` wants it and returns its size; whatever it raises leaves
    that file to the per-file path. A group whose prefix ``pacer`` paces (the store throttled
    it) is left to the per-file path, which paces each request; a throttle answer ends a
    group's pass and is told to ``pacer``: no burst of pipelined requests into a store that
    throttles."""
    rest: List[Tuple[int, Transfer]] = []
    groups: Dict[int, Tuple[BatchReads, List[Tuple[int, Transfer]]]] = {}
    for item in indexed:
        op = item[1]
        source = op.sources[0]
        if op.dest.scheme != "file" or op.link is LinkMode.SYMLINK or source.is_local or op.dest.path.endswith("/"):
            rest.append(item)  # a directory path: refused by the ordinary path before any request
            continue
        try:
            reader = batch_reads(session.backend(source))
        except TransferError:  # the ordinary path reports it, per file
            reader = None
        if reader is None:
            rest.append(item)
            continue
        groups.setdefault(id(reader), (reader, []))[1].append(item)
    for reader, group in groups.values():
        pace = pacer.pace(group[0][1].sources[0])
        if len(group) < _MIN_BATCH or pace.limited:
            rest.extend(group)
        else:
            rest.extend(_read_group(reader, group, connections, budget, pace, cancel, finish, stands_in, write))
    rest.sort(key=_position)
    return rest


def _position(item: Tuple[int, Transfer]) -> int:
    return item[0]


def _read_group(reader: BatchReads, group: List[Tuple[int, Transfer]], connections: int, budget: RetryBudget,
                pace: Pace, cancel: Optional[Cancel], finish: Finish, stands_in: StandsIn,
                write: Write) -> List[Tuple[int, Transfer]]:
    raised: List[Exception] = []  # what the caller's ``finish`` raised: the run's error, as on the ordinary path

    def take(k: int, body: bytes, info: ObjectInfo, sent: float) -> bool:
        if raised:
            return False
        position, op = group[k]
        try:
            size = write(op, body, info)
        except (TransferError, OSError):  # the ordinary path meets it again, and retries or reports it
            return False
        seconds = time.monotonic() - sent
        pace.count()
        source = op.sources[0]
        attempt = Attempt(source, op.dest, True, time.time() - seconds, seconds, size)
        budget.earn()
        try:  # not the read's failure: the file is written and its result recorded, once
            finish(position, Result(op, True, size, seconds, 1, None, source, (attempt,)))
        except Exception as err:  # noqa: BLE001 - raised from the pass below, not swallowed by the reader
            raised.append(err)
        return True

    def missing(k: int) -> bool:
        try:
            return stands_in(group[k][1].sources[0])
        except TransferError:
            return False

    def throttled(sent: float) -> None:
        pace.count()
        pace.throttled(time.time() - (time.monotonic() - sent))  # the pace's clock is epoch time

    left = reader.read_small([op.sources[0] for _, op in group], take, connections=connections, cancel=cancel,
                             missing=missing, throttled=throttled)
    if raised:
        raise raised[0]
    return [group[k] for k in left]
