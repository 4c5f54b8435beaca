"""The remove part of an engine run (one task, as s3transfer splits its work): bundle members
first, then the rest grouped per endpoint into batch deletes, retried as a group.

A group is retried by the engine's one retry loop (``retried``, as bundle groups are), so a
throttle answer to a batch delete is what it is to a read: it spends neither attempts nor the
run's budget, waits the store's ``Retry-After``, fails only when the throttle time runs out
(:mod:`transfer.retry`), and each batch request waits for its token from the pace of its
first target's prefix, cut by the throttle answers it gets (:mod:`transfer.pacing`).

A recursive remove expands to a listing (or the backend's own tree removal); a non-recursive
remove of a target ending in ``/`` fails with InvalidInput instead of deleting nothing.
"""

from __future__ import annotations

import time

from transfer.backends.base import Namespace, TreeRemoval, cache_keys, namespace
from transfer.errors import InvalidInput, Throttled, TransferError
from transfer.lean import logger
from transfer.ops import Attempt, Remove, Result
from transfer.retry import RetryBudget, RunBudget

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Hashable, Iterator, List, Optional, Sequence, Tuple

    from transfer.bundles.staging import BundleStager
    from transfer.cache import NodeCache
    from transfer.ops import Action, Operation
    from transfer.pacing import Pacer
    from transfer.session import Session
    from transfer.urls import Url

    Retried = Callable[[Operation, RetryBudget, Action], Result]  # the engine's retry loop

_log = logger("transfer.engine")  # one logger for a run's retries, whatever the task


class RemoveTask:
    """Runs the removes of one batch; yields ``(position, result)`` for every one."""

    def __init__(self, session: Session, bundles: Optional[BundleStager], retried: Retried, pacer: Pacer,
                 cache: Optional[NodeCache] = None) -> None:
        """``bundles``: None when bundles are off (nothing of them is imported then).
        ``retried(op, budget, action)``: the engine's retry loop; ``pacer``: the engine's.
        ``cache``, the node cache, drops its entry of every object a delete was asked for
        (deleted or maybe not), so no later read on the node gets what was removed."""
        self._cache = cache
        self._session = session
        self._bundles = bundles
        self._retried = retried
        self._pacer = pacer

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
        """Removes for one endpoint: recursive ones expand to listings, then batch deletes. Each
        try sends the removes still failing with a retryable error; the group's error is a
        throttle answer when any of them got one (the store asks for fewer requests, whatever
        else failed), else the first."""
        start = time.monotonic()
        outcomes: List[Optional[TransferError]] = [None] * len(ops)
        attempts = [0] * len(ops)
        pending = list(range(len(ops)))
        pace = None if ops[0].target.is_local else self._pacer.pace(ops[0].target)
        cancel = budget.cancel if isinstance(budget, RunBudget) else None

        def action(history: List[Attempt]) -> Tuple[int, Optional[Url]]:
            if pace is not None:
                pace.acquire(cancel)
            sent = self._pacer.clock()
            errors = self._once(backend, [ops[i] for i in pending])
            for i, err in zip(pending, errors):
                attempts[i] += 1
                outcomes[i] = err
            still = [(i, err) for i, err in zip(pending, errors) if err is not None and err.retryable]
            pending[:] = [i for i, _ in still]
            failed = [err for _, err in still]
            throttled = next((err for err in failed if isinstance(err, Throttled)), None)
            if throttled is not None:
                if pace is not None:
                    pace.throttled(sent)
                raise throttled
            if failed:
                _log.debug("%d remove(s) failed: %s", len(failed), failed[0])
                raise failed[0]
            return 0, None

        final = self._retried(ops[0], budget, action)
        if not any(final.error is outcomes[i] for i in pending):  # the loop's own word: throttle time out, cancel
            for i in pending:
                outcomes[i] = final.error
        return _results(ops, outcomes, attempts, time.monotonic() - start)

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
                keys = cache_keys(self._session.backend(ops[0].target)) if self._cache is not None else None
                if keys is not None and self._cache is not None:
                    for url in urls:
                        self._cache.drop(keys.cache_key(url))
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


def _results(ops: List[Remove], outcomes: List[Optional[TransferError]], attempts: List[int],
             seconds: float) -> List[Result]:
    """One result per remove of a group: its outcome (None: done) after its attempts."""
    results = []
    for op, outcome, tries in zip(ops, outcomes, attempts):
        if outcome is not None:
            outcome.attempts = max(1, tries)
        results.append(Result(op, outcome is None, 0, seconds, max(1, tries), outcome))
    return results
