"""The engine's first passes over a batch of small downloads or uploads: many objects per round trip.

A small GET through the worker threads costs the client more CPU in thread hand-offs than in
the request itself. So, in a run without peers or bundles, the downloads of a remote object to
a local file whose backend offers :class:`~transfer.backends.base.BatchReads` (S3 and Azure, over
HTTP or HTTPS: pipelined GETs from the engine's own thread, see :mod:`transfer.http.pipeline`) are
read in one pass first, each verified body handed to the caller's ``write`` (by default
:func:`~transfer.atomic.atomic_write_bytes`: a temp name beside the destination, then a rename;
never a partial file under the final name; with a node cache, the engine's fill of the entry).

Every transfer this pass does not finish -- an error answer, a failed check, a large object,
a local write error, no answer -- goes down the engine's ordinary per-file path from scratch,
which makes its attempts, retries and reports exactly as without this pass: the pass is not
counted as an attempt, and costs such a file one request more.

Uploads likewise: in a run without peers, the uploads of a local file to an object whose
backend offers :class:`~transfer.backends.base.BatchWrites` (S3: pipelined PUTs) go in one
pass first. A stage-out of many small files at a distance otherwise costs a round trip per file
per thread; the pass keeps ``depth`` PUTs in flight on each connection.
"""

from __future__ import annotations

import time

from transfer.atomic import atomic_write_bytes
from transfer.backends.base import BatchReads, BatchWrites, ObjectInfo, batch_reads, batch_writes
from transfer.errors import TransferError
from transfer.ops import Attempt, LinkMode, Result, Transfer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

    from transfer._threads import Cancel
    from transfer.pacing import Pace, Pacer
    from transfer.retry import RetryBudget
    from transfer.backends.base import Backend
    from transfer.session import Session
    from transfer.urls import Url

    C = TypeVar("C")

    Finish = Callable[[int, Result], None]
    StandsIn = Callable[[Url], bool]
    Write = Callable[[Transfer, bytes, ObjectInfo], int]
    Stored = Callable[[Transfer, ObjectInfo], None]

__all__ = ["read_batched", "write_batched"]

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
    that file to the per-file path. Each request of the pass draws its token from ``pacer``
    (:meth:`~transfer.pacing.Pace.draw`) as a per-file request does, so a pass into a prefix
    the node already paces (the store throttled it), or one that another job's cut reaches
    midway, sends at the prefix's rate; a throttle answer ends a group's pass and is told to
    ``pacer``: no burst of pipelined requests into a store that throttles."""
    def downloaded(op: Transfer) -> bool:  # a directory path is refused by the ordinary path before any request
        source = op.sources[0]
        return not (op.dest.scheme != "file" or op.link is LinkMode.SYMLINK or source.is_local
                    or op.dest.path.endswith("/"))

    rest, groups = _grouped(session, indexed, downloaded, _source, batch_reads)
    for reader, group in groups:
        pace = pacer.pace(group[0][1].sources[0])
        if len(group) < _MIN_BATCH:
            rest.extend(group)
        else:
            rest.extend(_read_group(reader, group, connections, budget, pace, cancel, finish, stands_in, write))
    rest.sort(key=_position)
    return rest


def write_batched(session: Session, indexed: Sequence[Tuple[int, Transfer]], connections: int, budget: RetryBudget,
                  pacer: Pacer, cancel: Optional[Cancel], finish: Finish, stored: Stored) -> List[Tuple[int, Transfer]]:
    """Upload what it can of ``indexed`` (position, transfer) in one pass of pipelined PUTs
    (:class:`~transfer.backends.base.BatchWrites`), as :func:`read_batched` reads: ``finish``
    for each file the store took, the rest returned in order for the per-file path, which makes
    its own attempts (the pass is not counted as one; PUT is idempotent, so a file the pass
    sent and could not confirm is simply sent again). ``stored(op, info)`` is told of each
    upload before its ``finish`` (the node cache's write-through); what it raises is the run's
    error, as ``finish``'s. Pacing as :func:`read_batched`'s, by the destination's prefix."""
    def uploaded(op: Transfer) -> bool:
        source = op.sources[0]
        return len(op.sources) == 1 and source.scheme == "file" and not op.dest.is_local \
            and not op.dest.path.endswith("/")

    rest, groups = _grouped(session, indexed, uploaded, _dest, batch_writes)
    for writer, group in groups:
        pace = pacer.pace(group[0][1].dest)
        if len(group) < _MIN_BATCH:
            rest.extend(group)
        else:
            rest.extend(_write_group(writer, group, connections, budget, pace, cancel, finish, stored))
    rest.sort(key=_position)
    return rest


def _position(item: Tuple[int, Transfer]) -> int:
    return item[0]


def _source(op: Transfer) -> Url:
    return op.sources[0]


def _dest(op: Transfer) -> Url:
    return op.dest


def _grouped(session: Session, indexed: Sequence[Tuple[int, Transfer]], eligible: Callable[[Transfer], bool],
             remote: Callable[[Transfer], Url], capability: Callable[[Backend], Optional[C]]
             ) -> Tuple[List[Tuple[int, Transfer]], List[Tuple[C, List[Tuple[int, Transfer]]]]]:
    """(the transfers no pass takes, [(backend's ``capability``, its transfers)]) of the
    ``eligible`` transfers, grouped by the backend of their ``remote`` URL."""
    rest: List[Tuple[int, Transfer]] = []
    groups: Dict[int, Tuple[C, List[Tuple[int, Transfer]]]] = {}
    for item in indexed:
        if not eligible(item[1]):
            rest.append(item)
            continue
        try:
            able = capability(session.backend(remote(item[1])))
        except TransferError:  # the ordinary path reports it, per file
            able = None
        if able is None:
            rest.append(item)
            continue
        groups.setdefault(id(able), (able, []))[1].append(item)
    return rest, list(groups.values())


class _Done:
    """Records the files a pass finished: their results through ``finish``, once each; what
    ``finish`` raises is kept for the pass's caller (the run's error, as on the ordinary path)."""

    def __init__(self, budget: RetryBudget, pace: Pace, finish: Finish, cancel: Optional[Cancel]) -> None:
        self.budget = budget
        self.pace = pace
        self.finish = finish
        self.cancel = cancel
        self.raised: List[Exception] = []

    def draw(self) -> None:
        self.pace.draw(self.cancel)

    def record(self, position: int, op: Transfer, size: int, sent: float) -> None:
        seconds = time.monotonic() - sent
        source = op.sources[0]
        attempt = Attempt(source, op.dest, True, time.time() - seconds, seconds, size)
        self.budget.earn()
        try:  # not the request's failure: the file is done and its result recorded, once
            self.finish(position, Result(op, True, size, seconds, 1, None, source, (attempt,)))
        except Exception as err:  # noqa: BLE001 - raised from the pass below, not swallowed by the pipeline
            self.raised.append(err)

    def throttled(self, sent: float) -> None:
        self.pace.throttled(time.time() - (time.monotonic() - sent))  # the pace's clock is epoch time

    def check(self) -> None:
        if self.raised:
            raise self.raised[0]


def _read_group(reader: BatchReads, group: List[Tuple[int, Transfer]], connections: int, budget: RetryBudget,
                pace: Pace, cancel: Optional[Cancel], finish: Finish, stands_in: StandsIn,
                write: Write) -> List[Tuple[int, Transfer]]:
    done = _Done(budget, pace, finish, cancel)

    def take(k: int, body: bytes, info: ObjectInfo, sent: float) -> bool:
        if done.raised:
            return False
        position, op = group[k]
        try:
            size = write(op, body, info)
        except (TransferError, OSError):  # the ordinary path meets it again, and retries or reports it
            return False
        done.record(position, op, size, sent)
        return True

    def missing(k: int) -> bool:
        try:
            return stands_in(group[k][1].sources[0])
        except TransferError:
            return False

    left = reader.read_small([op.sources[0] for _, op in group], take, connections=connections, cancel=cancel,
                             missing=missing, throttled=done.throttled, draw=done.draw)
    done.check()
    return [group[k] for k in left]


def _write_group(writer: BatchWrites, group: List[Tuple[int, Transfer]], connections: int, budget: RetryBudget,
                 pace: Pace, cancel: Optional[Cancel], finish: Finish, stored: Stored) -> List[Tuple[int, Transfer]]:
    done = _Done(budget, pace, finish, cancel)

    def take(k: int, info: ObjectInfo, sent: float) -> bool:
        if done.raised:
            return False
        position, op = group[k]
        try:  # the object is stored: whatever follows is the run's error, not the upload's
            stored(op, info)
        except Exception as err:  # noqa: BLE001 - raised from the pass below
            done.raised.append(err)
            return True
        done.record(position, op, info.size, sent)
        return True

    left = writer.write_small([(op.sources[0].path, op.dest) for _, op in group], take, connections=connections,
                              cancel=cancel, throttled=done.throttled, draw=done.draw)
    done.check()
    return [group[k] for k in left]
