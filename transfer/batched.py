"""The engine's first pass over a batch of small uploads: many objects per round trip.

A small PUT through the worker threads costs the client more CPU in thread hand-offs than in
the request itself, and a stage-out of many small files at a distance a round trip per file
per thread. So, in a run without peers, the uploads of a local file to an object whose backend
offers :class:`~transfer.backends.base.BatchWrites` (S3: pipelined PUTs from the engine's own
thread, see :mod:`transfer.http.pipeline`) go in one pass first, ``depth`` PUTs in flight on
each connection.

Every transfer this pass does not finish -- an error answer, a file too large, no answer --
goes down the engine's ordinary per-file path from scratch, which makes its attempts, retries
and reports exactly as without this pass: the pass is not counted as an attempt, and costs
such a file one request more. (Small downloads are read ahead by the read stack's bottom,
:meth:`transfer.layers.store.StoreReader.prepare`.)
"""

from __future__ import annotations

import time

from transfer.backends.base import BatchWrites, ObjectInfo, batch_writes
from transfer.errors import TransferError
from transfer.ops import Attempt, Result, Transfer

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
    Stored = Callable[[Transfer, ObjectInfo], None]

__all__ = ["write_batched"]

_MIN_BATCH = 2  # one file gains nothing from a pass of its own


def write_batched(session: Session, indexed: Sequence[Tuple[int, Transfer]], connections: int, budget: RetryBudget,
                  pacer: Pacer, cancel: Optional[Cancel], finish: Finish, stored: Stored) -> List[Tuple[int, Transfer]]:
    """Upload what it can of ``indexed`` (position, transfer) in one pass of pipelined PUTs
    (:class:`~transfer.backends.base.BatchWrites`): ``finish``
    for each file the store took, the rest returned in order for the per-file path, which makes
    its own attempts (the pass is not counted as one; PUT is idempotent, so a file the pass
    sent and could not confirm is simply sent again). ``stored(op, info)`` is told of each
    upload before its ``finish`` (the node cache's write-through); what it raises is the run's
    error, as ``finish``'s. A group whose destination prefix ``pacer`` paces (the store
    throttled it) is left to the per-file path, which paces each request; a throttle answer
    ends a group's pass and is told to ``pacer``."""
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
