"""The bundle part of an engine run (one task, as :mod:`transfer.removes` is the remove part).

* :meth:`GroupTask.download`: one bundle fetched once, under the engine's retries, for all the
  members a batch wants from it. A member that fails its check fails alone and is retried
  alone; a bundle gone from the store (404 before any member was written) hands its files
  back for the engine's per-file path.
* :meth:`GroupTask.upload`: a group of small files packed into one new bundle, uploaded under
  the engine's retries, then each member written through to the node cache.

Every member read goes through :func:`~transfer.bundles.reading.read_group` (member-keyed node
cache, then one streamed fetch). A plain read that resolves to a member is the read stack's
(:class:`~transfer.layers.bundles.BundleLayer`), not this task's. Each file of a group gets its
own :class:`~transfer.ops.Result` with one :class:`~transfer.ops.Attempt` naming its own
source, never the bundle.

:class:`GroupRun` is one run's groups: planned, started on a pool of their own, their outcomes
handed back in turn. The task owns no transfers or uploads: it takes the engine's retrier,
bundle stager, node cache and writes (:class:`~transfer.writes.Writes`: uploads and their
write-through) as values; nothing calls the engine back. Imported only when a batch uses bundles.
"""

from __future__ import annotations

import os
import time

from transfer._workers import Workers

from transfer.backends.base import cache_keys
from transfer.errors import NotFound, TransferError
from transfer.ops import Attempt, LinkMode, Result, Transfer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from concurrent.futures import Executor, Future
    from typing import Dict, Iterator, List, Optional, Tuple

    from transfer.backends.base import Backend
    from transfer.bundles.directory import LoadedBundle
    from transfer.bundles.reading import GroupState, MemberRead
    from transfer.bundles.staging import BundleStager, DownloadGroup, UploadGroup
    from transfer.cache import NodeCache
    from transfer.peers import PeerRound
    from transfer.retry import RetryBudget
    from transfer.retrying import Retrier
    from transfer.session import Session
    from transfer.urls import Url
    from transfer.writes import Writes

    # (one result per file done; the transfers left for the engine's per-file path)
    Outcome = Tuple[List[Tuple[int, Result]], List[Tuple[int, Transfer]]]


class GroupTask:
    """Runs bundle groups for one engine; any number of threads may use one task."""

    def __init__(self, stager: BundleStager, cache: Optional[NodeCache], retrier: Retrier, writes: Writes) -> None:
        self.stager = stager
        self._cache = cache
        self._retrier = retrier
        self._writes = writes

    def download(self, group: DownloadGroup, budget: RetryBudget, peers: Optional[PeerRound] = None) -> Outcome:
        """Fetch one bundle once for all its wanted members. A member that fails its check fails
        alone; a vanished bundle hands all its files back, for the per-file path."""
        from transfer.bundles.reading import GroupState, MemberRead  # reads only: an upload does not load it
        state = GroupState.empty()
        started = time.time()
        reads = [MemberRead(i, op.sources[0], op.dest.path, member,
                            op.link is LinkMode.SYMLINK or op.dest.scheme == "symlink")
                 for i, op, member in group.items]

        failed: Dict[int, TransferError] = {}

        def action(history: List[Attempt]) -> Tuple[int, Optional[Url]]:
            self._read(group.backend, group.bundle, reads, state, peers)
            if state.failed:  # retried (a damaged download?) for those members only
                failed.update(state.failed)
                state.failed.clear()
                raise next(iter(failed.values()))
            return sum(state.done.values()), None

        outcome = self._retrier.run(group.items[0][1], budget, action)
        if not outcome.ok and isinstance(outcome.error, NotFound) and not state.done:
            self.stager.forget(group.items[0][1].sources[0])
            return [], [(i, op) for i, op, _ in group.items]
        results = []
        for i, op, _ in group.items:
            if i in state.done:
                mine = Result(op, True, state.done[i], outcome.seconds, outcome.attempts)
            else:
                mine = Result(op, False, 0, outcome.seconds, outcome.attempts, failed.get(i, outcome.error))
            results.append((i, _file_result(op, mine, state.done.get(i, 0), started)))
        return results, []

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

    def _read(self, backend: Backend, bundle: LoadedBundle, reads: List[MemberRead], state: GroupState,
              peers: Optional[PeerRound]) -> None:
        """The one way into bundles: member-keyed node cache, then one streamed fetch."""
        from transfer.bundles.reading import read_group
        stored = peers.stored if peers is not None else None
        keys = cache_keys(backend) if self._cache is not None else None  # members' keys start with the bundle's
        read_group(backend, bundle, reads, state, self._cache, keys.cache_key(bundle.url) if keys else None, stored)


def _file_result(op: Transfer, outcome: Result, size: int, started: float) -> Result:
    """One file's result out of its group's outcome, with one attempt naming its own source."""
    source = op.sources[0]
    attempt = Attempt(source, op.dest, outcome.ok, started, outcome.seconds, size if outcome.ok else 0,
                      outcome.error)
    return Result(op, outcome.ok, size if outcome.ok else 0, outcome.seconds, outcome.attempts,
                  outcome.error, source if outcome.ok else None, (attempt,))


class GroupRun:
    """The bundle groups of one engine run: planned, those that need the network started on a
    pool of their own, the rest (bundles the listing brought whole) written from the caller's
    thread when their outcomes are asked for. ``threads`` is the engine's; ``executor`` an
    injected one (tests: runs everything), else None. Which files the node cache or a peer
    serves (no bundle fetch for them) is asked of ``cache`` and ``peers``, values like the rest."""

    def __init__(self, task: GroupTask, session: Session, cache: Optional[NodeCache], peers: Optional[PeerRound],
                 threads: int, executor: Optional[Executor]) -> None:
        self._task = task
        self._session = session
        self._cache = cache
        self._peers = peers
        self._threads = threads
        self._executor = executor
        self._resident: List[DownloadGroup] = []
        self._started: List[Future[Outcome]] = []
        self._pool: Optional[Executor] = None

    def start(self, indexed: List[Tuple[int, Transfer]], budget: RetryBudget) -> List[Tuple[int, Transfer]]:
        """Plan the batch's groups and start those that need the network; the other transfers."""
        # Bundle heads are small ranged GETs made before any transfer starts: as many in flight
        # as the connection cap allows (threads + 2 per endpoint), not just ``threads``.
        heads = self._executor if self._executor is not None else Workers(self._threads + 2, thread_name_prefix="heads")
        try:
            downloads, indexed = self._task.stager.plan_downloads(indexed, heads.map, self._elsewhere)
        finally:
            if heads is not self._executor:
                heads.shutdown(wait=True)  # idle threads: none left to hold a lock when the drop-in forks
        bundled_up, indexed = self._task.stager.plan_uploads(indexed)
        # A bundle the listing brought whole (its head is all of it) costs no request: its
        # members are written from the caller's thread while the other groups and files wait
        # on the network. Threads writing into one directory only contend for its lock and
        # for the interpreter: two took more CPU and more time than one.
        self._resident = [g for g in downloads if g.bundle.complete]
        fetched = [g for g in downloads if not g.bundle.complete]
        if fetched or bundled_up:
            # Unpacking a bundle is local CPU and file-system work: more threads than cores
            # only fight over the interpreter lock.
            pool = self._pool = self._executor if self._executor is not None else Workers(
                max(1, min(self._threads, os.cpu_count() or 1, len(fetched) + len(bundled_up))),
                thread_name_prefix="bundle")
            self._started = [pool.submit(self._task.download, g, budget, self._peers) for g in fetched]
            self._started += [pool.submit(self._task.upload, g, budget) for g in bundled_up]
        return indexed

    def outcomes(self, budget: RetryBudget) -> Iterator[Outcome]:
        """The resident groups' outcomes (written now, from this thread), then the started ones'."""
        for group in self._resident:
            yield self._task.download(group, budget, self._peers)
        for future in self._started:
            yield future.result()

    def close(self) -> None:
        if self._pool is not None and self._pool is not self._executor:
            self._pool.shutdown(wait=True)

    def _elsewhere(self, url: Url) -> bool:
        """Served by the node cache or a peer (steps 1-2 of the read order): no bundle fetch.
        True, too, where asking fails (its backend cannot be made): the per-file path meets the
        same error and reports it for that file alone."""
        if self._cache is None or url.is_local:
            return False
        try:
            key = self._session.cache_key(url)
        except TransferError:
            return True
        if key is None:
            return False
        return self._cache.contains(key) or (self._peers is not None and self._peers.holds(key))
