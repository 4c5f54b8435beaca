"""The mkdir part of an engine run (one task, as :mod:`transfer.removes` is the remove part):
each distinct directory made once, on the engine's workers and under its retries, before any
transfer starts; every mkdir of a batch gets the result of its directory's one try.
"""

from __future__ import annotations

import time

from transfer.backends.base import namespace
from transfer.errors import TransferError
from transfer.ops import Attempt, Mkdir, Result

TYPE_CHECKING = False
if TYPE_CHECKING:
    from concurrent.futures import Executor, Future
    from typing import Dict, Iterator, List, Optional, Sequence, Tuple

    from transfer.retry import RetryBudget
    from transfer.retrying import Retrier
    from transfer.session import Session
    from transfer.urls import Url

__all__ = ["MkdirTask"]


class MkdirTask:
    """Makes the directories of one batch over ``session``'s backends, each try under ``retrier``."""

    def __init__(self, session: Session, retrier: Retrier) -> None:
        self._session = session
        self._retrier = retrier

    def run(self, mkdirs: Sequence[Tuple[int, Mkdir]], budget: RetryBudget,
            executor: Executor) -> Iterator[Tuple[int, Result]]:
        """``(position, result)`` of every mkdir, in order; duplicates (the same directory, with
        or without a trailing ``/``) share one try."""
        done: Dict[Tuple[str, str, str], Future[Result]] = {}
        for _, op in mkdirs:
            key = _directory(op)
            if key not in done:
                done[key] = executor.submit(self._mkdir, op, budget)
        for i, op in mkdirs:
            outcome = done[_directory(op)].result()
            yield i, Result(op, outcome.ok, 0, outcome.seconds, outcome.attempts, outcome.error, None,
                            outcome.history)

    def _mkdir(self, op: Mkdir, budget: RetryBudget) -> Result:
        def action(history: List[Attempt]) -> Tuple[int, Optional[Url]]:
            started, clock = time.time(), time.monotonic()
            try:
                namespace(self._session.backend(op.target), op.target, "mkdir").make_dirs(op.target)
            except TransferError as err:
                history.append(Attempt(None, op.target, False, started, time.monotonic() - clock, 0, err))
                raise
            history.append(Attempt(None, op.target, True, started, time.monotonic() - clock))
            return 0, None

        return self._retrier.run(op, budget, action)


def _directory(op: Mkdir) -> Tuple[str, str, str]:
    return op.target.scheme, op.target.host, op.target.path.rstrip("/")
