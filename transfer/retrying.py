"""The per-file retry loop: one operation's attempts under a :class:`~transfer.retry.RetryPolicy`.

:class:`Retrier` runs an action (one attempt of one operation, appending its
:class:`~transfer.ops.Attempt` records) until it succeeds or its error is final, and makes the
operation's :class:`~transfer.ops.Result`. The engine, its bundle groups and its removes share
one per engine: a plain value they are given, not a step of the engine's they call back.
"""

from __future__ import annotations

import itertools
import time

from transfer import _threads
from transfer.errors import Throttled, TransferError
from transfer.lean import logger
from transfer.ops import Result, Transfer
from transfer.retry import RunBudget, check_cancel

TYPE_CHECKING = False
if TYPE_CHECKING:
    import random
    from typing import Callable, List, Optional, Tuple

    from transfer.ops import Action, Attempt, Operation
    from transfer.pacing import Pacer
    from transfer.retry import RetryBudget, RetryPolicy
    from transfer.urls import Url

_log = logger("transfer.engine")  # a run's retries log as one, as transfer.removes; logging loads at a retry

__all__ = ["Retrier"]


def _contained(action: Action, history: List[Attempt]) -> Tuple[int, Optional[Url]]:
    """Run ``action``; an exception outside the tree (a bug) becomes a non-retryable
    TransferError for this operation instead of aborting the whole batch."""
    try:
        return action(history)
    except TransferError:
        raise
    except Exception as err:  # noqa: BLE001 - reported per file, cause kept
        raise TransferError(f"internal error: {type(err).__name__}: {err}", operation="transfer") from err


def _failed(op: Operation, err: TransferError, attempt: int, start: float, history: List[Attempt]) -> Result:
    err.attempts = attempt
    return Result(op, False, 0, time.monotonic() - start, attempt, err, None, tuple(history))


class Retrier:
    """Retries under ``policy``, sleeping with ``sleep`` (a cancelled run wakes at once),
    jittered by ``rng`` (made when first needed); ``pacer`` says what rate a throttled prefix
    got. Thread-safe."""

    def __init__(self, policy: RetryPolicy, pacer: Pacer, sleep: Callable[[float], None],
                 rng: Optional[random.Random] = None) -> None:
        self.policy = policy
        self._pacer = pacer
        self._sleep = sleep
        self._rng = rng
        self._lock = _threads.Lock()

    def random(self) -> random.Random:
        if self._rng is None:
            import random
            with self._lock:
                if self._rng is None:
                    self._rng = random.Random()
        return self._rng

    def run(self, op: Operation, budget: RetryBudget, action: Action) -> Result:
        """Run ``action`` until it succeeds or its error is final: a retryable one after
        ``max_attempts`` or with the budget spent; a throttle answer only once the throttle time
        is up (:mod:`transfer.retry`: throttling spends neither attempts nor budget)."""
        history: List[Attempt] = []
        start = time.monotonic()
        tries, throttles, first_throttle = 0, 0, 0.0
        for attempt in itertools.count(1):
            try:
                check_cancel(budget)
                nbytes, source = _contained(action, history)
            except Throttled as err:
                throttles += 1
                first_throttle = first_throttle or time.monotonic()
                left = self.policy.throttle_timeout - (time.monotonic() - first_throttle)
                delay = self.policy.throttle_delay(throttles, err, self.random(), left)
                if delay is None:
                    final = self._throttled_out(op, err, throttles, time.monotonic() - first_throttle)
                    return _failed(op, final, attempt, start, history)
                _log.debug("retrying in %.2f s (throttled, %d 'slow down' answers so far): %s", delay, throttles, err)
                self._wait(delay, budget)
                continue
            except TransferError as err:
                tries += 1
                if self.policy.should_retry(err, tries) and budget.try_spend():
                    delay = self.policy.delay(tries, err, self.random())
                    _log.debug("retrying in %.2f s (attempt %d failed): %s", delay, attempt, err)
                    self._wait(delay, budget)
                    continue
                return _failed(op, err, attempt, start, history)
            budget.earn()
            return Result(op, True, nbytes, time.monotonic() - start, attempt, None, source, tuple(history))
        raise AssertionError("unreachable")

    def _throttled_out(self, op: Operation, last: Throttled, throttles: int, seconds: float) -> Throttled:
        """The final error of a file the store throttled for the whole throttle time: what it
        says and the rate this job achieved to that prefix (a Throttled: callers may retry later)."""
        achieved = ""
        source = op.sources[0] if isinstance(op, Transfer) else op.target
        if not source.is_local:
            pace = self._pacer.pace(source)
            achieved = (f"; this job got {pace.requests - pace.throttles} of {pace.requests} requests to "
                        f"{pace.key} answered, {pace.achieved():.1f}/s")
        final = Throttled(f"the store throttled it for {seconds:.0f} s ({throttles} 'slow down' answers, "
                          f"the last: {last.message}) and PEGASUS_CLOUDIO_THROTTLE_TIMEOUT "
                          f"({self.policy.throttle_timeout:g} s) ran out{achieved}",
                          url=last.url, operation=last.operation, status=last.status, retry_after=last.retry_after)
        final.__cause__ = last
        return final

    def _wait(self, seconds: float, budget: RetryBudget) -> None:
        """Sleep before a retry; a cancelled run wakes at once."""
        cancel = budget.cancel if isinstance(budget, RunBudget) else None
        if cancel is None:
            self._sleep(seconds)
        else:
            cancel.wait(seconds)
