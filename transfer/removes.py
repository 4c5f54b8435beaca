"""The remove part of an engine run (one task, as s3transfer splits its work): bundle members
first, then the rest grouped per endpoint into batch deletes, retried as a group.

A recursive remove expands to a listing (or the backend's own tree removal); a non-recursive
remove of a target ending in ``/`` fails with InvalidInput instead of deleting nothing.
"""

from __future__ import annotations

import itertools
import time

from transfer._lean import logger
from transfer.backends.base import Namespace, TreeRemoval, namespace
from transfer.errors import Cancelled, InvalidInput, TransferError
from transfer.ops import Remove, Result
from transfer.retry import RetryBudget, RetryPolicy, check_cancel

TYPE_CHECKING = False
if TYPE_CHECKING:
    import random
    from typing import Callable, Dict, Hashable, Iterator, List, Optional, Sequence, Tuple

    from transfer.bundles.staging import BundleStager
    from transfer.session import Session
    from transfer.urls import Url

    Wait = Callable[[float, RetryBudget], None]

_log = logger("transfer.engine")  # one logger for a run's retries, whatever the task


class RemoveTask:
    """Runs the removes of one batch; yields ``(position, result)`` for every one."""

    def __init__(self, session: Session, bundles: Optional[BundleStager], retry: RetryPolicy, rng: random.Random,
                 wait: Wait, removed: Optional[Callable[[Url], None]] = None) -> None:
        """``bundles``: None when bundles are off (nothing of them is imported then).
        ``removed(url)`` is told of every object a delete was asked for (deleted or maybe not):
        the node cache drops its entry, so no later read on the node gets what was removed."""
        self._removed = removed
        self._session = session
        self._bundles = bundles
        self._retry = retry
        self._rng = rng
        self._wait = wait

    def run(self, removes: Sequence[Tuple[int, Remove]], budget: RetryBudget) -> Iterator[Tuple[int, Result]]:
        groups: Dict[Hashable, List[Tuple[int, Remove]]] = {}
        bundles = self._bundles
        failed = bundles.remove_members(removes) if bundles is not None and bundles.enabled else {}
        by_position = dict(removes)
        for i, err in failed.items():
            yield i, Result(by_position[i], False, attempts=1, error=err)
        for i, op in removes:
            if i in failed:
                continue
            try:
                backend = namespace(self._session.backend(op.target), op.target, "remove")
            except TransferError as err:
                yield i, Result(op, False, attempts=1, error=err)
                continue
            groups.setdefault(id(backend), []).append((i, op))
        for items in groups.values():
            backend = namespace(self._session.backend(items[0][1].target), items[0][1].target, "remove")
            yield from zip([i for i, _ in items], self._group(backend, [op for _, op in items], budget))

    def _group(self, backend: Namespace, ops: List[Remove], budget: RetryBudget) -> List[Result]:
        """Removes for one endpoint: recursive ones expand to listings, then batch deletes."""
        start = time.monotonic()
        outcomes: List[Optional[TransferError]] = [None] * len(ops)
        attempts = [0] * len(ops)
        pending = list(range(len(ops)))
        for attempt in itertools.count(1):
            try:
                check_cancel(budget)
            except Cancelled as stop:
                for i in pending:
                    outcomes[i], attempts[i] = stop, attempt
                break
            errors = self._once(backend, [ops[i] for i in pending])
            retry: List[int] = []
            for i, err in zip(pending, errors):
                attempts[i] = attempt
                outcomes[i] = err
                if err is not None and self._retry.should_retry(err, attempt) and budget.try_spend():
                    retry.append(i)
            if not retry:
                break
            delay = self._retry.delay(attempt, outcomes[retry[0]], self._rng)
            _log.debug("retrying %d remove(s) in %.2f s: %s", len(retry), delay, outcomes[retry[0]])
            self._wait(delay, budget)
            pending = retry
        seconds = time.monotonic() - start
        results = []
        for i, op in enumerate(ops):
            outcome = outcomes[i]
            if outcome is not None:
                outcome.attempts = attempts[i]
            results.append(Result(op, outcome is None, 0, seconds, attempts[i], outcome))
        return results

    def _once(self, backend: Namespace, ops: List[Remove]) -> List[Optional[TransferError]]:
        urls: List[Url] = []
        owners: List[int] = []
        errors: List[Optional[TransferError]] = [None] * len(ops)
        for index, op in enumerate(ops):
            try:
                expanded = _expand(backend, op)
            except TransferError as err:
                errors[index] = err
                continue
            urls.extend(expanded)
            owners.extend([index] * len(expanded))
        if urls:
            try:
                for owner, failure in zip(owners, backend.delete(urls)):
                    if failure is not None and errors[owner] is None:
                        errors[owner] = failure
            finally:
                removed = self._removed
                if removed is not None:
                    for url in urls:
                        removed(url)
        return errors


def _expand(backend: Namespace, op: Remove) -> List[Url]:
    if not op.recursive:
        if op.target.path.endswith("/"):
            raise InvalidInput("is a directory (ends in '/'): a remove without recursive would delete nothing",
                               url=str(op.target), operation="remove")
        return [op.target]
    if isinstance(backend, TreeRemoval):
        failure = backend.delete_tree(op.target)
        if failure is not None:
            raise failure
        return []
    prefix = op.target.with_path(op.target.path.rstrip("/").removesuffix("/*"))
    return [info.url for info in backend.list(prefix)]
