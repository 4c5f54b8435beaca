"""The entries of one cache directory: checking one, publishing one, removing one, and the
usage they add up to (size cap, free-space floor, counters, eviction when due).

The layer below :class:`~transfer.cache.store.NodeCache` (fetches, inserts, queries) and
:mod:`transfer.cache.members` (bundle members in batches), which both call it and nothing
else of each other. Each step that changes a key's files needs that key's lock (named per
method); the usage bookkeeping is thread-safe and shared by every process through
``stats.json`` (:mod:`transfer.cache.stats`).
"""

from __future__ import annotations

import os
import time

from transfer.cache import evict
from transfer.cache.config import CacheConfig
from transfer.lean import logger
from transfer.cache.layout import (
    ENTRY_MODE, KeyPaths, Layout, Meta, process_umask, read_meta, remove_quietly, set_stamp, stamped_ctime,
    write_meta_in_place,
)
from transfer.cache.locks import EXCLUSIVE, acquire
from transfer.cache.staging import Staged, same_bytes
from transfer.cache.stats import Counters, StatsFile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Mapping, Optional, Tuple

_log = logger("transfer.cache.store")  # one logger for the cache's warnings


class Entries:
    """The entries under ``config.directory`` (made safe by the caller). Thread-safe."""

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.layout = Layout(config.directory)
        self.counters = Counters()
        self._stats = StatsFile(self.layout)
        self._gc_due = False
        self._seen_bytes = self._stats.read()["bytes"]  # usage at the last read of the file

    @property
    def directory(self) -> str:
        return self.config.directory

    def paths(self, key: str) -> KeyPaths:
        return self.layout.paths(key)

    # -- one entry --------------------------------------------------------------------

    def valid(self, paths: KeyPaths, key: str, check: bool = False, report: bool = True) -> Optional[Meta]:
        """The entry's metadata if it exists and passes the cheap check (size, mtime, key);
        with ``check``, its bytes must match their SHA-256: re-hashed for entries the config
        verifies on every hit, else when the ctime moved since the entry was last known intact.
        A failed SHA-256 check is logged and counted unless ``report`` is False."""
        try:
            st = os.stat(paths.data)
        except FileNotFoundError:
            return None
        meta = read_meta(paths.meta)
        if meta is None or meta.key != key or not meta.matches(st):
            return None
        if check and not self._intact(paths, meta, st):
            if not report:
                return None
            _log.warning("cache %s: entry for %s fails its SHA-256 check; fetching it again", self.directory,
                         key)
            self.counters.add(corrupt=1)
            return None
        return meta

    def _intact(self, paths: KeyPaths, meta: Meta, st: os.stat_result) -> bool:
        """The SHA-256 check of a hit (see :meth:`valid`); a big entry found intact is restamped."""
        if self.config.verifies(meta.size):
            return same_bytes(paths.data, meta.sha256)
        if stamped_ctime(paths) == st.st_ctime_ns:
            return True
        if not same_bytes(paths.data, meta.sha256):
            return False
        set_stamp(paths, st.st_ctime_ns)
        return True

    def restamp(self, paths: KeyPaths, size: int) -> None:
        """After our own link or publish of a big entry: record its ctime as known intact."""
        if not self.config.verifies(size):
            try:
                set_stamp(paths, os.stat(paths.data).st_ctime_ns)
            except OSError:
                pass  # no stamp: the next hit re-hashes

    def remove_invalid(self, paths: KeyPaths) -> None:
        """Under the exclusive lock, before a fill: drop a corrupt entry and crash leftovers."""
        removed = evict.remove_entry(paths)
        if removed is not None:
            self.adjust_usage(-1, -removed)

    def publish(self, paths: KeyPaths, key: str, staged: Staged, version: Optional[str], source: str,
                fill: bool = False) -> bool:
        """Under the key's exclusive lock, with no entry (:meth:`remove_invalid` done): make the
        complete staged temp file the entry (:meth:`make_entry`), with its metadata. ``fill``:
        the temp file is a fill's, created with mode 0666 just now (so its mode is what the
        umask left: the entry gets that less write, and the umask is not read again) after a
        check of the free-space floor.

        False (nothing published) when the cache cannot keep it: larger than the cap,
        below the free-space floor, or a write fails."""
        fd, temp, sha = staged
        reserved = 0
        try:
            st = os.fstat(fd)
            if not (fill or self.has_room(0)) or not self.reserve(st.st_size):
                return False
            reserved = st.st_size
            meta = Meta(key, st.st_size, sha, st.st_mtime_ns, time.time(), version, source)
            write_meta_in_place(paths, meta, time.time_ns())  # a precise last use: mtimes are jiffies
            mode = st.st_mode & ENTRY_MODE if fill else self.less_umask(ENTRY_MODE)
            self.make_entry(paths, fd, temp, st.st_size, mode)
            self.restamp(paths, st.st_size)
        except OSError as err:
            _log.warning("cache %s: cannot publish %s: %s", self.directory, key, err)
            remove_quietly(paths.meta)
            if reserved:
                self.adjust_usage(0, -reserved)
            return False
        self.adjust_usage(1, 0)
        return True

    def make_entry(self, paths: KeyPaths, fd: int, temp: str, size: int, mode: int) -> None:
        """The one publishing step, under the key's exclusive lock, its metadata written: the
        complete temp file ``temp`` (open as ``fd``, ``size`` bytes) becomes the entry: fsync
        (entries a hit does not re-hash), ``mode`` (0444 less the umask: a hit hands the entry
        itself to jobs), rename. Raises OSError; nothing is renamed into place then."""
        if self.config.fsync and not self.config.verifies(size):
            os.fsync(fd)  # a smaller entry is re-hashed on every hit (and by peers): damage shows
        os.fchmod(fd, mode)
        os.replace(temp, paths.data)

    def linkable(self, data: str) -> bool:
        """Whether a hard link of the entry ``data`` is no more readable than an entry made now:
        one another job made under a laxer umask would hand this job's input to others (then
        the hit is a copy, with this job's umask)."""
        try:
            return os.stat(data).st_mode & 0o777 & ~self.less_umask(ENTRY_MODE) == 0
        except OSError:
            return False

    def less_umask(self, mode: int) -> int:
        """``mode`` less the bits this process's umask takes away now: what ``os.open`` would give
        a new file, for files the cache made private first and hands to a job. Read each time
        (not with ``os.umask``, which would change it for every thread for a moment): a process
        that keeps the cache open over jobs may set each job's umask."""
        return mode & ~process_umask(self.directory)

    # -- usage ------------------------------------------------------------------------

    def adjust_usage(self, entries: int, size: int) -> None:
        """Count an entry added or removed, in memory. The shared file is written when this
        process's unflushed bytes reach the slack (so what every process counts is in the file,
        but for less than one slack each), or when its estimate crosses the high watermark (then
        eviction is due)."""
        self.counters.add(entries=entries, bytes=size)
        if abs(self.counters.peek().get("bytes", 0)) >= self._slack() or \
                self._usage_estimate() > self.config.high_bytes:
            self.flush_stats()

    def _slack(self) -> int:
        """Bytes one process may add before the others learn of them: 1/256 of the cap (so 32
        processes filling at once overshoot it by an eighth at most), at least 64 KiB (a flush
        is one locked write of ``stats.json``, which small entries should not pay each)."""
        return max(self.config.max_bytes >> 8, 64 << 10)

    def _usage_estimate(self) -> int:
        return self._seen_bytes + self.counters.peek().get("bytes", 0)

    def reserve(self, size: int) -> bool:
        """Count ``size`` more bytes when they keep the cache within ``max_bytes``, evicting if
        needed; True when counted. The caller then counts the entry (``adjust_usage(1, 0)``)
        once it is made, or gives the bytes back (``adjust_usage(0, -size)``).

        Bytes of a slack or more, or that the estimate has no room for, are added to the shared
        file's usage under its lock, and taken back when that passes the cap: processes filling
        at once then each see the others' reservations, not a total from before them."""
        if size > self.config.max_bytes:
            return False
        if size < self._slack() and self._usage_estimate() + size <= self.config.max_bytes:
            self.counters.add(bytes=size)
            return True
        for attempt in range(2):
            if self._merge(size) <= self.config.max_bytes:
                return True
            self._merge(-size)
            if not attempt:
                self.gc(wait=True)  # another process's pass may have skipped entries free now
        return False

    def _merge(self, size: int) -> int:
        """Merge this process's counters and ``size`` more bytes into the shared file; the
        usage there now. Raises OSError (the counters are kept for a later flush)."""
        pending = self.counters.take()
        delta = dict(pending)
        delta["bytes"] = delta.get("bytes", 0) + size
        try:
            self._seen_bytes = self._stats.update(delta)["bytes"]
        except OSError:
            self.counters.restore(pending)
            raise
        return self._seen_bytes

    def has_room(self, size: int) -> bool:
        """True if ``size`` more bytes leave at least ``min_free_bytes`` free."""
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize - size >= self.config.min_free_bytes

    def stats(self) -> Dict[str, int]:
        """Counters of every process that used this directory, plus this one's unflushed ones."""
        values = self._stats.read()
        for name, amount in self.counters.peek().items():
            values[name] = values.get(name, 0) + amount
        return values

    def gc(self, wait: bool = True) -> int:
        """Evict per the watermarks (LRU, never entries in use or pinned); bytes freed.

        With ``wait`` False, returns 0 at once when another process is collecting."""
        fd = acquire(self.layout.gc_lock, EXCLUSIVE, blocking=wait)
        if fd is None:
            return 0
        try:
            done = evict.collect(self.layout, self.config)
            self.set_usage({"evictions": done.evicted, "bytes_evicted": done.freed},
                           (done.entries, done.bytes))
        finally:
            os.close(fd)
        return done.freed

    def set_usage(self, delta: Mapping[str, int], usage: Tuple[int, int]) -> None:
        """Record a full scan's usage; this process's unflushed usage deltas are in it."""
        pending = self.counters.take()
        counted = {k: v for k, v in pending.items() if k not in ("entries", "bytes")}
        for name, amount in delta.items():
            counted[name] = counted.get(name, 0) + amount
        try:
            self._seen_bytes = self._stats.update(counted, usage=usage)["bytes"]
        except OSError:
            self.counters.restore(pending)
            raise

    def flush_stats(self) -> None:
        """Merge this process's counters into the shared file (one small locked write)."""
        pending = self.counters.take()
        try:
            values = self._stats.update(pending) if pending else self._stats.read()
        except OSError as err:
            self.counters.restore(pending)
            _log.warning("cache %s: cannot save counters: %s", self.directory, err)
            return
        self._seen_bytes = values["bytes"]
        self._gc_due = self._gc_due or values["bytes"] > self.config.high_bytes
        self.gc_if_due()

    def gc_if_due(self) -> None:
        """Evict, without waiting for another process's eviction, when the usage asked for it."""
        if not self._gc_due:
            return
        self._gc_due = False
        try:
            self.gc(wait=False)
        except OSError as err:
            _log.warning("cache %s: eviction failed: %s", self.directory, err)

    def settle(self) -> None:
        """End of a batch, every key's lock let go: persist the counters and, when the cache is
        over its high watermark, evict, waiting for a pass under way to end first. A pass skips
        entries in use, so one made while this process still held its entries may have left
        the cache over its cap; this one can take them."""
        self.flush_stats()
        if self._seen_bytes > self.config.high_bytes:
            try:
                self.gc(wait=True)
            except OSError as err:
                _log.warning("cache %s: eviction failed: %s", self.directory, err)
