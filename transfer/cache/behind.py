"""Write-behind: cache inserts a process finishes after its job has its answer.

A process that runs jobs for others (the node stager, :mod:`pegasus_cloudio.stager`) answers
the job first and fills the node cache afterwards, off the job's critical path. :func:`collect`
turns this on for the process; :func:`offer` queues the inserts of one bundle's members, or of
one small download's body (:mod:`transfer.cached_reads`), and says whether it did (False:
not collecting, or the byte budget is spent: the caller inserts now); :func:`drain` performs
the queued inserts and persists each cache's counters. Queued entries are the bytes the job
already verified, never re-read from the job's files, which the job may change or remove (a
body written once into the cache and linked as the job's file, :meth:`NodeCache.stage_linked`,
becomes the entry by a rename, recorded with the SHA-256 of the verified bytes: entries that
small are re-hashed on every hit).
A process killed before it drains loses only cache entries, never correctness. The drop-in
run in the job itself collects too, and has a child process of its own drain the queue after
its files are in place (:func:`pegasus_cloudio.dropin.main.insert_behind`).
"""

from __future__ import annotations


import time

from transfer import _threads
from transfer.lean import logger

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from transfer.cache.store import NodeCache

    Member = Tuple[str, bytes, str]  # key, bytes, the SHA-256 they were verified against
    # members, version, source, read at, temp files of their bytes
    Queued = Tuple["NodeCache", List[Member], Optional[str], str, float, List[Optional[str]]]
    Joined = Tuple[Member, Optional[str], float, Optional[str]]  # member, version, read at, temp file

BUDGET_BYTES = 64 << 20  # at most this much member data waits in memory
JOIN_BYTES = 64 << 10  # offers joined into one batch up to this (a slack of the cap at least: see Entries)

_log = logger(__name__)  # logging is imported when a warning is first logged
_queue: Optional[List[Queued]] = None
_queued_bytes = 0
_lock = _threads.Lock()  # offer() runs in the engine's worker threads


def collect() -> None:
    """From now on, :func:`offer` queues inserts (until :func:`drain`)."""
    global _queue, _queued_bytes
    with _lock:
        _queue, _queued_bytes = [], 0


def collecting() -> bool:
    """True between :func:`collect` and :func:`drain`: inserts may wait for the job's answer."""
    return _queue is not None


def offer(cache: "NodeCache", members: List[Member], version: Optional[str] = None, source: str = "bundle",
          temps: Optional[List[Optional[str]]] = None) -> bool:
    """Queue verified members ``(key, bytes, sha256)`` (:meth:`NodeCache.insert_members`, with
    ``version``, ``source`` and ``temps``: files :meth:`NodeCache.stage_linked` made of their
    bytes) for ``cache``, all or none; False when the caller must insert them now (not
    collecting, or the byte budget is spent). The bytes count as read now: an entry another
    process publishes before the drain is of the object as it was later, and the drain leaves
    it (``read_at``)."""
    global _queued_bytes
    size = sum(len(data) for _, data, _ in members)
    with _lock:
        if _queue is None or _queued_bytes + size > BUDGET_BYTES:
            return False
        _queue.append((cache, list(members), version, source, time.time(),
                       list(temps) if temps is not None else [None] * len(members)))
        _queued_bytes += size
        return True


def pending() -> int:
    """Members queued and not yet inserted."""
    with _lock:
        return sum(len(queued[1]) for queued in _queue or ())


def abandon() -> None:
    """Stop collecting and drop the queue (another process inserts it: see the drop-in)."""
    global _queue, _queued_bytes
    with _lock:
        _queue, _queued_bytes = None, 0


def drain() -> int:
    """Insert everything queued, then stop collecting; the number of entries stored. Offers
    for one cache and source in a row go in as one batch (each member with its offer's
    version and time of reading): the small files of a pipelined pass, offered one by one,
    then cost one free-space check and one reservation for all, not one each."""
    global _queue, _queued_bytes
    with _lock:
        queue, _queue, _queued_bytes = _queue or [], None, 0
    stored = 0
    caches: Dict[int, "NodeCache"] = {}
    for cache, source, batch in _batches(queue):
        caches[id(cache)] = cache
        members = [joined[0] for joined in batch]
        try:
            stored += len(cache.insert_members(members, source=source, versions=[j[1] for j in batch],
                                               read_ats=[j[2] for j in batch], temps=[j[3] for j in batch]))
        except Exception as err:  # noqa: BLE001 - the job is done: a cache entry is never worth a failure
            _log.warning("cache %s: write-behind of %d member(s) failed: %s", cache.directory, len(members), err)
    for cache in caches.values():
        cache.close()
    return stored


def _batches(queue: List[Queued]) -> List[Tuple["NodeCache", str, List[Joined]]]:
    """The queue's offers as batches: consecutive offers for one cache and source joined, each
    member with its offer's version and time of reading, up to :data:`JOIN_BYTES` (and a
    sixteenth of the cache's cap: a batch is reserved under the cap whole, all or nothing)."""
    batches: List[Tuple["NodeCache", str, List[Joined]]] = []
    joined = 0
    for cache, members, version, source, read_at, temps in queue:
        size = sum(len(data) for _, data, _ in members)
        if not batches or batches[-1][0] is not cache or batches[-1][1] != source or \
                joined + size > min(JOIN_BYTES, cache.config.max_bytes >> 4):
            batches.append((cache, source, []))
            joined = 0
        batches[-1][2].extend((member, version, read_at, temp) for member, temp in zip(members, temps))
        joined += size
    return batches
