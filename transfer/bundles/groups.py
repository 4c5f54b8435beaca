"""The packed uploads of an engine run (one task, as :mod:`transfer.removes` is the remove part).

:meth:`GroupTask.upload`: a group of small files packed into one new bundle, uploaded under
the engine's retries, then each member written through to the node cache. Each file of a group
gets its own :class:`~transfer.ops.Result` with one :class:`~transfer.ops.Attempt` naming its
own source, never the bundle. Reads of members are the read stack's
(:class:`~transfer.layers.bundles.BundleLayer`: its ``prepare`` reads a batch's bundles ahead).

:class:`GroupRun` is one run's groups: planned, started on a pool of their own, their outcomes
handed back in turn. The task owns no transfers or uploads: it takes the engine's retrier,
bundle stager and writes (:class:`~transfer.writes.Writes`: uploads and their write-through)
as values; nothing calls the engine back. Imported only when a batch uses bundles.
"""

from __future__ import annotations

import os
import time

from transfer._workers import Workers
from transfer.ops import Attempt, Result, Transfer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from concurrent.futures import Executor, Future
    from typing import Iterator, List, Optional, Tuple

    from transfer.bundles.staging import BundleStager, UploadGroup
    from transfer.retry import RetryBudget
    from transfer.retrying import Retrier
    from transfer.urls import Url
    from transfer.writes import Writes

    # (one result per file done; the transfers left for the engine's per-file path)
    Outcome = Tuple[List[Tuple[int, Result]], List[Tuple[int, Transfer]]]


class GroupTask:
    """Runs packed uploads for one engine; any number of threads may use one task."""

    def __init__(self, stager: BundleStager, retrier: Retrier, writes: Writes) -> None:
        self.stager = stager
        self._retrier = retrier
        self._writes = writes

    def upload(self, group: UploadGroup, budget: RetryBudget) -> Outcome:
        """Pack and upload one group; once it is stored, each member is written through (and,
        with peers on, told to them: :meth:`~transfer.writes.Writes.write_through`)."""
        started = time.time()

        def put(path: str, bundle_url: Url) -> int:
            return self._writes.upload(path, bundle_url, write_through=False)  # the bundle is no cache entry

        def action(history: List[Attempt]) -> Tuple[int, Optional[Url]]:
            self.stager.upload_group(group, put)
            return sum(size for _, _, size in group.items), None

        outcome = self._retrier.run(group.items[0][1], budget, action)
        if outcome.ok:  # the members, not the bundle, are what later reads ask for
            for _, op, _ in group.items:
                self._writes.write_through(op.dest, op.sources[0].path, None)
        return [(i, _file_result(op, outcome, size, started)) for i, op, size in group.items], []


def _file_result(op: Transfer, outcome: Result, size: int, started: float) -> Result:
    """One file's result out of its group's outcome, with one attempt naming its own source."""
    source = op.sources[0]
    attempt = Attempt(source, op.dest, outcome.ok, started, outcome.seconds, size if outcome.ok else 0,
                      outcome.error)
    return Result(op, outcome.ok, size if outcome.ok else 0, outcome.seconds, outcome.attempts,
                  outcome.error, source if outcome.ok else None, (attempt,))


class GroupRun:
    """The packed uploads of one engine run: planned, started on a pool of their own, their
    outcomes handed back in turn. ``threads`` is the engine's; ``executor`` an injected one
    (tests: runs everything), else None."""

    def __init__(self, task: GroupTask, threads: int, executor: Optional[Executor]) -> None:
        self._task = task
        self._threads = threads
        self._executor = executor
        self._started: List[Future[Outcome]] = []
        self._pool: Optional[Executor] = None

    def start(self, indexed: List[Tuple[int, Transfer]], budget: RetryBudget) -> List[Tuple[int, Transfer]]:
        """Plan the batch's packed uploads and start them; the other transfers."""
        bundled_up, indexed = self._task.stager.plan_uploads(indexed)
        if bundled_up:
            # Packing a bundle is local CPU and file-system work: more threads than cores
            # only fight over the interpreter lock.
            pool = self._pool = self._executor if self._executor is not None else Workers(
                max(1, min(self._threads, os.cpu_count() or 1, len(bundled_up))), thread_name_prefix="bundle")
            self._started = [pool.submit(self._task.upload, g, budget) for g in bundled_up]
        return indexed

    def outcomes(self, budget: RetryBudget) -> Iterator[Outcome]:
        """The started groups' outcomes, in order."""
        for future in self._started:
            yield future.result()

    def close(self) -> None:
        if self._pool is not None and self._pool is not self._executor:
            self._pool.shutdown(wait=True)
