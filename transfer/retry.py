"""When to try a file again, and how long to wait first.

The decision is made from the error's class (:attr:`TransferError.retryable`), never its
text. Waits use full jitter on an exponential schedule. A :class:`RetryBudget` shared by a
whole batch stops a failing endpoint from being hammered: every retry spends a token, every
success earns a fraction back.

:class:`Throttled` is not failure: the store is up and asks for fewer requests. Such errors
are retried for ``throttle_timeout`` seconds from the file's first throttle answer, not for a
count of attempts, draw nothing from the budget, and wait what the store's ``Retry-After``
says when it says (at most ``max_retry_after``, plus up to 20% jitter so that the jobs it
told at once do not come back at once), else the ordinary backoff. The request rate itself
is paced by :mod:`transfer.pacing`.
"""

from __future__ import annotations

from transfer import _threads
from transfer.lean import record

from transfer.errors import Cancelled, Throttled, TransferError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import random
    from typing import Optional

    from transfer._threads import Cancel


@record(frozen=True)
class RetryPolicy:
    """``max_attempts`` tries per file; waits drawn from [0, min(max_delay, base*2^(n-1))]."""

    max_attempts: int = 3
    base_delay: float = 0.5
    max_delay: float = 20.0
    throttle_factor: float = 4.0
    throttle_timeout: float = 300.0
    max_retry_after: float = 60.0

    def should_retry(self, error: Optional[TransferError], attempt: int) -> bool:
        return error is not None and error.retryable and attempt < self.max_attempts

    def throttle_delay(self, throttles: int, error: Throttled, rng: random.Random, left: float) -> Optional[float]:
        """The wait before trying again after the ``throttles``-th throttle answer for a file,
        with ``left`` seconds of its throttle time left; None when the time is up (no wait
        could end before it)."""
        if error.retry_after is not None:
            wait = min(self.max_retry_after, error.retry_after) * rng.uniform(1.0, 1.2)
        else:  # the ordinary backoff: the pace of the prefix (transfer.pacing) is what slows the job
            ceiling = min(self.max_delay, self.base_delay * (2 ** (min(throttles, 30) - 1)))
            wait = rng.uniform(ceiling / 2, ceiling)
        if left <= 0:
            return None
        return min(wait, left)

    def delay(self, attempt: int, error: Optional[TransferError], rng: random.Random) -> float:
        ceiling = min(self.max_delay, self.base_delay * (2 ** (attempt - 1)))
        if isinstance(error, Throttled):
            ceiling = min(self.max_delay, ceiling * self.throttle_factor)
        return rng.uniform(ceiling / 2, ceiling)


class RetryBudget:
    """A token bucket shared by the transfers of one batch.

    Starts with ``capacity`` tokens; a retry takes one, a success returns ``refill``. When
    the bucket is empty further retries are refused, so a dead endpoint fails fast.
    """

    def __init__(self, capacity: float = 100.0, refill: float = 0.1) -> None:
        self._capacity = capacity
        self._tokens = capacity
        self._refill = refill
        self._lock = _threads.Lock()

    def try_spend(self) -> bool:
        with self._lock:
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True

    def earn(self) -> None:
        if self._tokens >= self._capacity:  # full (the usual case): as if this came before any spend
            return
        with self._lock:
            self._tokens = min(self._capacity, self._tokens + self._refill)


class RunBudget(RetryBudget):
    """The retry budget of one engine run, which also carries the run's cancel event: what the
    tasks of a run share travels with them, so concurrent runs of one engine never mix."""

    def __init__(self, capacity: float, cancel: Optional[Cancel] = None) -> None:
        super().__init__(capacity=capacity)
        self.cancel = cancel

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()


def check_cancel(budget: RetryBudget) -> None:
    """Raise :class:`~transfer.errors.Cancelled` once the run of ``budget`` is cancelled."""
    if isinstance(budget, RunBudget) and budget.cancelled():
        raise Cancelled("cancelled before it finished", operation="transfer")
