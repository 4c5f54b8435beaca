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
  cache, then peers, then the store, each layer wrapping the one below), with bundle members
  planned per batch (one fetch per bundle: :mod:`transfer.bundles.groups`) and a 404 looked up
  in the directory's bundles; without peers and bundles, small objects are first read many
  per round trip (:mod:`transfer.batched`, :mod:`transfer.cached_reads`);
* drives multipart uploads (:mod:`transfer.uploads`) and parallel ranged downloads
  (:mod:`transfer.ranged`) of large files, all their parts sharing one
  :class:`~transfer.ranged.PartPool` of ``threads``, and server-side copies between objects of
  one endpoint, or a two-hop copy through a local temp file between different endpoints.

Backends are obtained from the :class:`~transfer.session.Session`, which keeps one per
endpoint, so all workers share one connection pool per endpoint.
"""

from __future__ import annotations

import itertools
import os
import time

from transfer import _threads
from transfer._workers import InlineExecutor, Task, Workers
from transfer.atomic import scratch_file
from transfer.backends.base import ServerSideCopy, TempUploads, namespace, uploads
from transfer.errors import Throttled, TransferError
from transfer import ranged
from transfer.ops import Attempt, LinkMode, Mkdir, Operation, Remove, Result, Transfer
from transfer.layers.stack import StagerSlot, Stacks
from transfer.pacing import Pacer
from transfer.retry import RetryBudget, RetryPolicy, RunBudget
from transfer.retrying import Retrier

# A job step imports only what its operations use: bundles, the node cache, peers, multipart
# bookkeeping and local copies are imported where they are first needed.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import random
    from concurrent.futures import Executor, Future
    from typing import Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

    from transfer._threads import Cancel, Joinable
    from transfer.bundles.groups import GroupTask
    from transfer.bundles.staging import BundleStager, DownloadGroup
    from transfer.backends.base import ObjectInfo
    from transfer.cache import NodeCache
    from transfer.layers import Reader
    from transfer.peers import PeerRound, PeerSource
    from transfer.session import Session
    from transfer.writes import Writes
    from transfer.urls import Url

    ResultCallback = Callable[[Result], None]

_LISTING_WAIT = 1.0  # seconds the pipelined pass waits for a directory's bundle index

__all__ = ["Engine", "InlineExecutor"]


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
        self._lazy_lock = _threads.Lock()  # runs on several threads share one stager and upload list
        self._bundles_on = bool(settings.bundle or settings.bundle_sites)
        self._made_writes: Optional[Writes] = None
        self._parts = ranged.PartPool(self._threads, executor if isinstance(executor, InlineExecutor) else None)
        self._cache = cache
        self._peers: Optional[PeerRound] = None
        if peers is not None and cache is not None:
            from transfer.peers import PeerRound
            self._peers = PeerRound(peers)
        self._stager = StagerSlot(session)
        self._stacks = Stacks(self._parts, settings.download_part_size, self._pacer, cache, self._peers, self._stager)
        wanted = cache.config.uploads if cache is not None else None
        self._cache_uploads = cache is not None and (wanted if wanted is not None else peers is not None)

    @property
    def max_attempts(self) -> int:
        return self._retry.max_attempts

    def uncached(self) -> "Engine":
        """An engine on the same session and retry policy without the node cache or peers, for
        reads that must reach the store itself (a stage-out's verification pull-back: the cache
        entry of an upload is the uploaded file). Close it after use."""
        return Engine(self._session, threads=self._threads, retry=self._retry, executor=self._executor,
                      sleep=self._sleep, rng=self._rng, pacer=self._pacer)

    @property
    def _bundles(self) -> BundleStager:
        """Bundles, imported when first used (a read that found nothing may be a member)."""
        return self._stager.get()

    @property
    def _writes(self) -> Writes:
        """Uploads and their write-through, imported at the first (a stage-in does none)."""
        if self._made_writes is None:
            from transfer.writes import Writes
            with self._lazy_lock:
                if self._made_writes is None:
                    self._made_writes = Writes(self._session, self._parts, self._retry, self._sleep, self._retrier,
                                               self._pacer, self._cache, self._peers, self._cache_uploads)
        return self._made_writes

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
            self._run_mkdirs(ops, results, budget, executor)
            self._run_transfers(ops, results, budget, executor, peers)
            removes = [(i, op) for i, op in enumerate(ops) if isinstance(op, Remove)]
            if removes:
                from transfer.removes import RemoveTask
                task = RemoveTask(self._session, self._bundles if self._bundles_on else None, self._retrier.run,
                                  self._pacer, None if self._cache is None else self._forget)
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

    def _run_mkdirs(self, ops: Sequence[Operation], results: List[Optional[Result]],
                    budget: RetryBudget, executor: Executor) -> None:
        done: Dict[Tuple[str, str, str], Future] = {}  # type: ignore[type-arg]
        indexed = [(i, op) for i, op in enumerate(ops) if isinstance(op, Mkdir)]
        for _, op in indexed:
            key = (op.target.scheme, op.target.host, op.target.path.rstrip("/"))
            if key not in done:
                done[key] = executor.submit(self._mkdir, op, budget)
        for i, op in indexed:
            key = (op.target.scheme, op.target.host, op.target.path.rstrip("/"))
            outcome: Result = done[key].result()
            self._finish(results, i, Result(op, outcome.ok, 0, outcome.seconds, outcome.attempts,
                                            outcome.error, None, outcome.history))

    def _run_transfers(self, ops: Sequence[Operation], results: List[Optional[Result]],
                       budget: RetryBudget, executor: Executor, peers: Optional[PeerRound]) -> None:
        indexed = [(i, op) for i, op in enumerate(ops) if isinstance(op, Transfer)]
        groups: List[Future] = []  # type: ignore[type-arg]
        resident: List[DownloadGroup] = []
        group_pool: Optional[Executor] = None
        self._prepare(op for _, op in indexed)
        if self._bundles_on and self._plans_bundles(indexed):
            groups, resident, group_pool, indexed = self._start_groups(indexed, budget, executor, peers)
        loads: List[Joinable] = []  # directory indexes the pass below found it needs
        if len(indexed) > 1 and peers is None and self._stager.made is None and not self._bundles_on:
            indexed = self._pipelined(indexed, results, budget, loads)
        if len(indexed) > 1 and peers is None:
            indexed = self._pipelined_puts(indexed, results, budget)
        futures = [(i, executor.submit(self._transfer, op, budget, peers)) for i, op in indexed]
        try:
            self._collect(results, budget, executor, peers, resident, groups, futures)
        finally:
            if group_pool is not None and group_pool is not executor:
                group_pool.shutdown(wait=True)
            cancel = budget.cancel if isinstance(budget, RunBudget) else None
            for load in loads:  # no thread left to hold a lock when the drop-in forks (unless cancelled)
                load.join(0 if cancel is not None and cancel.is_set() else None)

    def _start_groups(self, indexed: List[Tuple[int, Transfer]], budget: RetryBudget, executor: Executor,
                      peers: Optional[PeerRound]) -> Tuple[List[Future], List[DownloadGroup],  # type: ignore[type-arg]
                                                           Optional[Executor], List[Tuple[int, Transfer]]]:
        """Plan the batch's bundle groups and start those that need the network: (their futures,
        the groups whose bundle the listing brought whole, the group pool, the other transfers)."""
        def elsewhere(url: Url) -> bool:
            return self._elsewhere(url, peers)

        # Bundle heads are small ranged GETs made before any transfer starts: as many in flight
        # as the connection cap allows (threads + 2 per endpoint), not just ``threads``.
        heads = executor if self._executor is not None else Workers(self._threads + 2, thread_name_prefix="heads")
        try:
            downloads, indexed = self._bundles.plan_downloads(indexed, heads.map, elsewhere)
        finally:
            if heads is not executor:
                heads.shutdown(wait=True)  # idle threads: none left to hold a lock when the drop-in forks
        bundled_up, indexed = self._bundles.plan_uploads(indexed)
        # A bundle the listing brought whole (its head is all of it) costs no request: its
        # members are written from this thread, below, while the other groups and files wait
        # on the network. Threads writing into one directory only contend for its lock and
        # for the interpreter: two took more CPU and more time than one.
        resident = [g for g in downloads if g.bundle.complete]
        fetched = [g for g in downloads if not g.bundle.complete]
        if not fetched and not bundled_up:
            return [], resident, None, indexed
        # Unpacking a bundle is local CPU and file-system work: more threads than cores
        # only fight over the interpreter lock.
        pool = self._group_pool(executor, len(fetched) + len(bundled_up))
        task = self._groups()
        groups = [pool.submit(task.download, g, budget, peers) for g in fetched]
        groups += [pool.submit(task.upload, g, budget) for g in bundled_up]
        return groups, resident, pool, indexed

    def _pipelined(self, indexed: List[Tuple[int, Transfer]], results: List[Optional[Result]],
                   budget: RetryBudget, loads: List[Joinable]) -> List[Tuple[int, Transfer]]:
        """Small downloads, pipelined from this thread first; the transfers left for the
        per-file path (``loads``: the directory indexes the pass started)."""
        from transfer.batched import read_batched, write_file
        from transfer.cached_reads import CachedReads

        def stands_in(source: Url) -> bool:
            # the listing runs on a thread of its own: one slow directory holds up the pass for
            # _LISTING_WAIT at most, then its files wait for it on the per-file path, alone
            return self._bundles.may_stand_in(source, lambda load: loads.append(_threads.start(load, "index")),
                                              _LISTING_WAIT)

        # node-cache hits are the per-file path's: served from the cache without a request
        cached = CachedReads(self._cache, self._cache_key) if self._cache is not None else None
        hits, misses = cached.split(indexed) if cached is not None else ([], indexed)
        rest = read_batched(self._session, misses, self._threads, budget, self._pacer,
                            budget.cancel if isinstance(budget, RunBudget) else None,
                            lambda i, result: self._finish(results, i, result), stands_in,
                            write_file if cached is None else cached.write)
        return sorted(rest + hits) if hits else rest

    def _pipelined_puts(self, indexed: List[Tuple[int, Transfer]], results: List[Optional[Result]],
                        budget: RetryBudget) -> List[Tuple[int, Transfer]]:
        """Small uploads, pipelined from this thread first; the transfers left for the per-file path."""
        from transfer.batched import write_batched

        def stored(op: Transfer, info: ObjectInfo) -> None:
            self._writes.write_through(op.dest, op.sources[0].path, info.version)

        return write_batched(self._session, indexed, self._threads, budget, self._pacer,
                             budget.cancel if isinstance(budget, RunBudget) else None,
                             lambda i, result: self._finish(results, i, result), stored)

    def _collect(self, results: List[Optional[Result]], budget: RetryBudget, executor: Executor,
                 peers: Optional[PeerRound], resident: List[DownloadGroup], groups: List[Future],  # type: ignore[type-arg]
                 futures: List[Tuple[int, Future]]) -> None:  # type: ignore[type-arg]
        """Write the resident groups from this thread, then gather every result in order; the
        files of a bundle that vanished go down the per-file path after the others."""
        task = self._groups() if resident else None
        outcomes = (task.download(one, budget, peers) for one in resident if task is not None)
        again: List[Tuple[int, Transfer]] = []
        for outcome in itertools.chain(outcomes, (group.result() for group in groups)):
            for i, result in outcome[0]:
                self._finish(results, i, result)
            again += outcome[1]
        futures = futures + [(i, executor.submit(self._transfer, op, budget, peers)) for i, op in again]
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

    def _group_pool(self, executor: Executor, groups: int) -> Executor:
        if self._executor is not None:  # an injected executor (tests) runs everything
            return executor
        return Workers(max(1, min(self._threads, os.cpu_count() or 1, groups)), thread_name_prefix="bundle")

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

    def _transfer(self, op: Transfer, budget: RetryBudget, peers: Optional[PeerRound] = None) -> Result:
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
                    nbytes = self._copy(source, op, peers)
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

    # -- bundles ------------------------------------------------------------------------

    def _groups(self) -> GroupTask:
        """The bundle part of a run, imported when first used (bundles are on, or a read that
        found nothing resolved to a member)."""
        from transfer.bundles.groups import GroupTask
        return GroupTask(self._bundles, self._cache, self._retrier, self._writes)

    # -- node cache ---------------------------------------------------------------------

    def _cache_key(self, url: Url) -> Optional[str]:
        """The node-cache name of a remote object, or None when it is not cached."""
        return None if self._cache is None or url.is_local else self._session.cache_key(url)

    def _forget(self, url: Url) -> None:
        """A remove asked the store to delete ``url``: drop the node cache's entry of it."""
        key = self._cache_key(url)
        if key is not None and self._cache is not None:
            self._cache.drop(key)

    def _elsewhere(self, url: Url, peers: Optional[PeerRound]) -> bool:
        """Served by the node cache or a peer (steps 1-2 of the read order): no bundle fetch.
        True, too, where asking fails (its backend cannot be made): the per-file path meets the
        same error and reports it for that file alone."""
        try:
            if self._cached(url):
                return True
            key = self._cache_key(url)
        except TransferError:
            return True
        return peers is not None and key is not None and peers.holds(key)

    def _cached(self, url: Url) -> bool:
        key = self._cache_key(url)
        return key is not None and self._cache is not None and self._cache.contains(key)

    def _reader(self, url: Url) -> Reader:
        """The top of the read stack of ``url``'s endpoint (:mod:`transfer.layers`)."""
        return self._stacks.reader(self._session.backend(url))

    def _prepare(self, transfers: Iterable[Transfer]) -> None:
        """Each endpoint's stack plans the batch's remote reads (the peers queue their one index
        lookup). Only the peer layer plans today: without peers a batch skips the walk. A source
        whose backend cannot be made is left to the per-file path, which reports it."""
        if self._peers is None:
            return
        batches: Dict[int, Tuple[Reader, List[Url]]] = {}
        for op in transfers:
            for source in op.sources:
                if source.is_local:
                    continue
                try:
                    reader = self._reader(source)
                except TransferError:
                    continue
                batches.setdefault(id(reader), (reader, []))[1].append(source)
        for reader, urls in batches.values():
            reader.prepare(urls)

    # -- copies -------------------------------------------------------------------------

    def _copy(self, source: Url, op: Transfer, peers: Optional[PeerRound] = None) -> int:
        dest = op.dest
        if dest.is_local:
            if source.is_local:
                return self._local_copy(source, op)
            return self._download(source, dest.path, symlink=op.link is LinkMode.SYMLINK or dest.scheme == "symlink")
        if source.is_local:
            return self._writes.upload(source.path, dest)
        return self._remote_copy(source, dest, peers)

    def _local_copy(self, source: Url, op: Transfer) -> int:
        from transfer.local_copies import local_copy
        return local_copy(source, op, lambda dest, mode: self._download(source, dest, mode=mode))

    def _download(self, source: Url, dest_path: str, symlink: bool = False, mode: int = 0o666) -> int:
        """Fetch a remote object into ``dest_path`` down its endpoint's read stack (node cache,
        peers, bundle members, the store). ``symlink`` links the destination to the cache entry
        (Pegasus ``--symlink``); ``mode`` is the new file's permission bits before the umask."""
        return self._reader(source).fetch_to(source, dest_path, symlink, mode)

    def abort_uploads(self, seconds: float) -> List[str]:
        """For signal handlers: abort every multipart upload in flight, giving up after
        ``seconds``, and remove the server-side temp files of other uploads in flight
        (:class:`~transfer.backends.base.TempUploads`) in what is left of it; returns the URLs
        of multipart uploads that could not be aborted in time."""
        deadline = time.monotonic() + seconds
        stuck = self._made_writes.abort_all(seconds) if self._made_writes is not None else []
        for backend in self._session.opened():
            if isinstance(backend, TempUploads):
                backend.discard_in_flight(max(0.5, deadline - time.monotonic()))
        return stuck

    def _remote_copy(self, source: Url, dest: Url, peers: Optional[PeerRound] = None) -> int:
        source_backend, dest_backend = self._session.backend(source), self._session.backend(dest)
        if source_backend is dest_backend and isinstance(source_backend, ServerSideCopy):
            try:
                return source_backend.copy(source, dest).size
            finally:
                self._writes.write_through(dest, None, None)
        uploads(dest_backend, dest, "put")  # a read-only destination is refused before any GET
        fd, temp = scratch_file("pegasus-cloudio-", ".data")
        os.close(fd)
        try:
            self._download(source, temp)
            return self._writes.upload(temp, dest)
        finally:
            try:
                os.unlink(temp)
            except OSError:
                pass
