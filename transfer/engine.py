"""The orchestration layer: every byte the library moves goes through :class:`Engine`.

``Engine.run(ops)`` takes transfers, mkdirs and removes and returns one :class:`Result` per
operation, in input order. It

* runs mkdirs first (duplicates collapsed), then transfers on a bounded pool of
  ``threads`` workers, then removes grouped per endpoint into batch deletes;
* tries a transfer's sources in order within an attempt, and retries attempts for
  retryable errors only, with jittered exponential backoff and a batch-wide retry budget;
* writes local destinations atomically (temp name, verify, rename) and never leaves a
  partial file behind;
* reads a remote object through its endpoint's read stack (:mod:`transfer.layers`: node
  cache, then peers, then bundles, then the store, each layer wrapping the one below), which
  plans each batch first (the peers' one lookup; without peers and bundles in use, the store
  reads small objects ahead, many per round trip, and those downloads are made from the
  calling thread; with bundles in use, the bundle layer reads each bundle of the batch's
  members once, and those downloads are made from the calling thread too) and a 404 looked up
  in the directory's bundles;
* drives multipart uploads (:mod:`transfer.uploads`) and parallel ranged downloads
  (:mod:`transfer.ranged`) of large files, all their parts sharing one
  :class:`~transfer.ranged.PartPool` of ``threads``, and server-side copies between objects of
  one endpoint, or a two-hop copy through a local temp file between different endpoints.

Backends are obtained from the :class:`~transfer.session.Session`, which keeps one per
endpoint, so all workers share one connection pool per endpoint.
"""

from __future__ import annotations

import time

from transfer import _threads
from transfer._workers import InlineExecutor, Task, Workers
from transfer.copies import Copies, WritesSlot
from transfer.errors import Throttled, TransferError
from transfer import ranged
from transfer.ops import Attempt, Mkdir, Operation, Remove, Result, Transfer
from transfer.layers.bundles import StagerSlot
from transfer.layers.stack import Stacks
from transfer.pacing import Pacer
from transfer.retry import RetryBudget, RetryPolicy, RunBudget
from transfer.retrying import Retrier

# A job step imports only what its operations use: bundles, the node cache, peers, multipart
# bookkeeping and local copies are imported where they are first needed.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import random
    from concurrent.futures import Executor, Future
    from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

    from transfer._threads import Cancel
    from transfer.bundles.groups import GroupRun
    from transfer.backends.base import ObjectInfo
    from transfer.cache import NodeCache
    from transfer.pacing import Pace
    from transfer.peers import PeerRound, PeerSource
    from transfer.session import Session
    from transfer.urls import Url

    ResultCallback = Callable[[Result], None]

__all__ = ["Engine", "InlineExecutor"]


def _downloads(op: Transfer) -> bool:
    """A remote object to a local file (a destination naming a directory is refused before
    any request, and a local copy makes none)."""
    return op.dest.is_local and not op.sources[0].is_local and not op.dest.path.endswith("/")


def _peer_round(peers: Optional[PeerSource], cache: Optional[NodeCache]) -> Optional[PeerRound]:
    """A round of ``peers`` where there is a ``cache`` for them to fill, else None."""
    if peers is None or cache is None:
        return None
    from transfer.peers import PeerRound  # imported only where peers are on
    return PeerRound(peers)


def _drawer(pace: Pace, cancel: Optional[Cancel]) -> Callable[[], None]:
    """What takes one more token of ``pace`` for a later request of the same attempt."""
    return lambda: pace.acquire(cancel)


def _wait(future: Future) -> None:  # type: ignore[type-arg]
    """Wait for ``future`` to finish without raising its error."""
    if isinstance(future, Task):
        future.wait()
    else:
        future.exception()


class Engine:
    """Runs batches of operations against the backends of one session.

    Several threads may call :meth:`run` on one engine at once. ``with Engine(...) as engine``
    (or :meth:`close`) releases the part threads when done."""

    def __init__(
        self,
        session: Session,
        *,
        threads: Optional[int] = None,
        retry: Optional[RetryPolicy] = None,
        executor: Optional[Executor] = None,
        on_result: Optional[ResultCallback] = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: Optional[random.Random] = None,
        cache: Optional[NodeCache] = None,
        peers: Optional[PeerSource] = None,
        pacer: Optional[Pacer] = None,
    ) -> None:
        """``peers`` is consulted only together with a ``cache`` (peers fill the node cache).
        ``pacer`` paces requests per prefix (:mod:`transfer.pacing`; default: this engine's own,
        :func:`transfer.node.open_pacer` for one the jobs of a node share)."""
        settings = session.settings
        self._session = session
        self._threads = threads or settings.threads
        self._retry = retry or RetryPolicy(settings.max_attempts, settings.retry_base_delay,
                                           settings.retry_max_delay, throttle_timeout=settings.throttle_timeout)
        self._pacer = pacer if pacer is not None else Pacer(sleep=sleep)
        self._retrier = Retrier(self._retry, self._pacer, sleep, rng)
        self._executor = executor
        self._on_result = on_result
        self._sleep = sleep
        self._rng = rng
        self._callback_lock = _threads.Lock()
        self._parts = ranged.PartPool(self._threads, executor if isinstance(executor, InlineExecutor) else None)
        self._cache = cache
        self._peers = _peer_round(peers, cache)
        self._stager = StagerSlot(session)
        self._stacks = Stacks(session, self._parts, settings.download_part_size, self._pacer, cache, self._peers,
                              self._stager, self._threads, executor)
        self._writes_slot = WritesSlot(session, self._parts, self._retry, sleep, self._retrier, self._pacer, cache,
                                       self._peers)
        self._copies = Copies(session, self._stacks, self._writes_slot)

    @property
    def max_attempts(self) -> int:
        return self._retry.max_attempts

    def uncached(self) -> "Engine":
        """An engine on the same session and retry policy without the node cache or peers, for
        reads that must reach the store itself (a stage-out's verification pull-back: the cache
        entry of an upload is the uploaded file). Close it after use."""
        return Engine(self._session, threads=self._threads, retry=self._retry, executor=self._executor,
                      sleep=self._sleep, rng=self._rng, pacer=self._pacer)

    # -- batch --------------------------------------------------------------------------

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Wait for part transfers still running and drop their threads (the engine stays
        usable: a later run starts new ones). The session is the caller's to close."""
        self._parts.shutdown()

    def run(self, ops: Sequence[Operation], cancel: Optional[Cancel] = None) -> List[Result]:
        """One result per operation, in order. Never raises for a failed operation.

        ``cancel``: once set (from any thread), operations not yet finished stop at their next
        step (before a request, between retries) and fail with :class:`~transfer.errors.Cancelled`;
        the run returns promptly with every result."""
        results: List[Optional[Result]] = [None] * len(ops)
        budget = RunBudget(20 + len(ops) / 10, cancel)
        executor = self._executor or Workers(self._threads, thread_name_prefix="transfer")
        peers = self._peers
        self._parts.enter()
        try:
            mkdirs = [(i, op) for i, op in enumerate(ops) if isinstance(op, Mkdir)]
            if mkdirs:
                from transfer.mkdirs import MkdirTask
                for i, result in MkdirTask(self._session, self._retrier).run(mkdirs, budget, executor):
                    self._finish(results, i, result)
            self._run_transfers(ops, results, budget, executor, peers)
            removes = [(i, op) for i, op in enumerate(ops) if isinstance(op, Remove)]
            if removes:
                from transfer.removes import RemoveTask
                task = RemoveTask(self._session, self._stager.get() if self._stager.enabled else None, self._retrier.run,
                                  self._pacer, self._cache)
                for i, result in task.run(removes, budget):
                    self._finish(results, i, result)
        finally:
            if executor is not self._executor:
                executor.shutdown(wait=True, cancel_futures=True)
            self._parts.leave()
            if peers is not None and self._cache is not None:
                from transfer.layers.sharing import publish_batch
                publish_batch(self._cache, peers)
            if self._cache is not None:
                self._cache.close()  # end of a batch: counters, and eviction when over the cap
        return [r for r in results if r is not None]

    def _finish(self, results: List[Optional[Result]], index: int, result: Result) -> None:
        results[index] = result
        if self._on_result is not None:
            with self._callback_lock:
                self._on_result(result)

    def _run_transfers(self, ops: Sequence[Operation], results: List[Optional[Result]],
                       budget: RetryBudget, executor: Executor, peers: Optional[PeerRound]) -> None:
        indexed = self._prepare([(i, op) for i, op in enumerate(ops) if isinstance(op, Transfer)], results, budget)
        groups: Optional[GroupRun] = None
        if self._stager.enabled and self._plans_bundles(indexed):
            from transfer.bundles.groups import GroupRun, GroupTask  # bundles: imported when in use
            task = GroupTask(self._stager.get(), self._retrier, self._writes_slot.get())
            groups = GroupRun(task, self._threads, self._executor)
        try:
            indexed = groups.start(indexed, budget) if groups is not None else indexed
            if len(indexed) > 1 and peers is None:
                indexed = self._pipelined_puts(indexed, results, budget)
            futures = [(i, executor.submit(self._transfer, op, budget)) for i, op in indexed]
            self._collect(results, budget, executor, groups, futures)
        finally:
            if groups is not None:
                groups.close()

    def _prepare(self, indexed: List[Tuple[int, Transfer]], results: List[Optional[Result]],
                 budget: RetryBudget) -> List[Tuple[int, Transfer]]:
        """Each endpoint's stack plans the batch's downloads (:meth:`~transfer.layers.stack.Stacks.prepare`:
        the peers queue their one lookup; where only the store reads, it reads small objects
        ahead); each download whose body a layer then holds is made from this thread as the
        plan hands it over (a worker's hand-off costs a small file more CPU than its request),
        the read-ahead waiting meanwhile. Returns the transfers left for the pool."""
        downloads: Dict[int, Tuple[int, Transfer]] = {}
        for i, op in indexed:
            if _downloads(op):
                downloads.setdefault(id(op.sources[0]), (i, op))
        if not downloads:
            return indexed
        cancel = budget.cancel if isinstance(budget, RunBudget) else None
        done: Set[int] = set()
        plan = self._stacks.prepare([op.sources[0] for _, op in downloads.values()], cancel)
        try:
            for held in plan:
                for url in held:
                    i, op = downloads[id(url)]
                    done.add(i)
                    self._finish(results, i, self._held(op, budget, cancel))
        finally:
            plan.close()
        return [item for item in indexed if item[0] not in done] if done else indexed

    def _held(self, op: Transfer, budget: RetryBudget, cancel: Optional[Cancel]) -> Result:
        """A download whose body a layer holds, made as one attempt without the retry loop's
        bookkeeping (its request was made and paced in the read-ahead); a cancelled run, or an
        error (nothing written), goes the per-file path, which retries or reports it."""
        source = op.sources[0]
        if cancel is not None and cancel.is_set():
            return self._transfer(op, budget)
        started, clock = time.time(), time.monotonic()
        try:
            nbytes = self._copies.fetch(op)
        except Exception:  # noqa: BLE001 - the per-file path meets it again and reports it
            return self._transfer(op, budget)
        seconds = time.monotonic() - clock
        budget.earn()
        return Result(op, True, nbytes, seconds, 1, None, source,
                      (Attempt(source, op.dest, True, started, seconds, nbytes),))

    def _pipelined_puts(self, indexed: List[Tuple[int, Transfer]], results: List[Optional[Result]],
                        budget: RetryBudget) -> List[Tuple[int, Transfer]]:
        """Small uploads, pipelined from this thread first; the transfers left for the per-file path."""
        from transfer.batched import write_batched

        def stored(op: Transfer, info: ObjectInfo) -> None:
            self._writes_slot.get().write_through(op.dest, op.sources[0].path, info.version)

        return write_batched(self._session, indexed, self._threads, budget, self._pacer,
                             budget.cancel if isinstance(budget, RunBudget) else None,
                             lambda i, result: self._finish(results, i, result), stored)

    def _collect(self, results: List[Optional[Result]], budget: RetryBudget, executor: Executor,
                 groups: Optional[GroupRun],
                 futures: List[Tuple[int, Future]]) -> None:  # type: ignore[type-arg]
        """The packed uploads' results (:meth:`~transfer.bundles.groups.GroupRun.outcomes`), then
        every other result in order."""
        for outcome in groups.outcomes(budget) if groups is not None else ():
            for i, result in outcome[0]:
                self._finish(results, i, result)
        ahead = 4 * self._threads
        for position, (i, future) in enumerate(futures):
            if not future.done():  # wake once per several results, not once per file
                _wait(futures[min(position + ahead, len(futures) - 1)][1])
            self._finish(results, i, future.result())

    def _plans_bundles(self, indexed: List[Tuple[int, Transfer]]) -> bool:
        """Whether bundles could serve this batch: the stager may hold indexes an earlier run
        loaded; else :mod:`transfer.bundle_gate` (a batch they cannot serve does not import them)."""
        from transfer.bundle_gate import may_use_bundles
        return self._stager.made is not None or may_use_bundles((op for _, op in indexed),
                                                                  self._session.settings.bundle_min_files)

    def _transfer(self, op: Transfer, budget: RetryBudget) -> Result:
        cancel = budget.cancel if isinstance(budget, RunBudget) else None

        def action(history: List[Attempt]) -> Tuple[int, Optional[Url]]:
            errors: List[TransferError] = []
            for source in op.sources:
                remote = source if not source.is_local else op.dest  # an upload paces its destination's prefix
                pace = None if remote.is_local else self._pacer.pace(remote)
                if pace is not None:
                    pace.acquire(cancel)
                started, clock = time.time(), time.monotonic()
                try:
                    nbytes = self._copies.copy(source, op, None if pace is None else _drawer(pace, cancel))
                except TransferError as err:
                    history.append(Attempt(source, op.dest, False, started, time.monotonic() - clock, 0, err))
                    errors.append(err)
                    if pace is not None and isinstance(err, Throttled):
                        pace.throttled(started)
                    continue
                history.append(Attempt(source, op.dest, True, started, time.monotonic() - clock, nbytes))
                return nbytes, source
            raise next((e for e in errors if e.retryable), errors[0])

        return self._retrier.run(op, budget, action)

    def abort_uploads(self, seconds: float) -> List[str]:
        """For signal handlers: :meth:`~transfer.copies.WritesSlot.abort` of this engine's uploads."""
        return self._writes_slot.abort(seconds, self._session.opened())
