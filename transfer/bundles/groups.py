"""The bundle part of an engine run (one task, as :mod:`transfer.removes` is the remove part).

* :meth:`GroupTask.download`: one bundle fetched once, under the engine's retries, for all the
  members a batch wants from it. A member that fails its check fails alone and is retried
  alone; a bundle gone from the store (404 before any member was written) hands its files
  back for the engine's per-file path.
* :meth:`GroupTask.upload`: a group of small files packed into one new bundle, uploaded under
  the engine's retries, then each member written through to the node cache.

Every member read goes through :func:`~transfer.bundles.reading.read_group` (member-keyed node
cache, then one streamed fetch). A plain read that resolves to a member is the read stack's
(:class:`~transfer.layers.bundles.BundleLayer`), not this task's. Each file of a group gets its own :class:`~transfer.ops.Result`
with one :class:`~transfer.ops.Attempt` naming its own source, never the bundle.

The task owns no transfers or uploads: it takes the engine's retrier, bundle stager, node
cache and writes (:class:`~transfer.writes.Writes`: uploads and their write-through) as values;
nothing calls the engine back. Imported only when a batch uses bundles.
"""

from __future__ import annotations

import time

from transfer.backends.base import cache_keys
from transfer.errors import NotFound, TransferError
from transfer.ops import Attempt, LinkMode, Result, Transfer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

    from transfer.backends.base import Backend
    from transfer.bundles.directory import LoadedBundle
    from transfer.bundles.reading import GroupState, MemberRead
    from transfer.bundles.staging import BundleStager, DownloadGroup, UploadGroup
    from transfer.cache import NodeCache
    from transfer.peers import PeerRound
    from transfer.retry import RetryBudget
    from transfer.retrying import Retrier
    from transfer.urls import Url
    from transfer.writes import Writes

    # (one result per file done; the transfers left for the engine's per-file path)
    Outcome = Tuple[List[Tuple[int, Result]], List[Tuple[int, Transfer]]]


class GroupTask:
    """Runs bundle groups for one engine; any number of threads may use one task."""

    def __init__(self, stager: BundleStager, cache: Optional[NodeCache], retrier: Retrier, writes: Writes) -> None:
        self._stager = stager
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
            self._stager.forget(group.items[0][1].sources[0])
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
            self._stager.upload_group(group, put)
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
