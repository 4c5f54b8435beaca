"""Cache counters, persisted across processes in ``stats.json`` under ``stats.lock``.

Hits and misses are counted in memory and merged into the file by ``flush`` (once per
batch: :meth:`NodeCache.close`), so a hit costs no file write. The usage totals
(``entries``, ``bytes``) are adjusted in the file as entries are added or removed, and
set from a full scan by ``gc``, ``verify`` and ``clear`` (which repairs any drift left by
a process killed between publishing an entry and counting it).
"""

from __future__ import annotations

import _thread
import os

from transfer import _threads
from transfer import lean
from transfer.lean import record
from transfer.lean_json import dumps, loads

from transfer.cache.layout import FILE_MODE, Layout, remove_quietly
from transfer.cache.locks import EXCLUSIVE, held

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Mapping, Optional, Tuple


@record(frozen=True)
class CacheStats:
    """Counters of one cache directory, summed over every process that used it.

    hits / misses:   fetches served from the cache / that downloaded (a waiter that used
                     another process's download counts as a hit).
    bytes_saved:     bytes served by hits (not moved over the network).
    requests_saved:  origin requests avoided (one per hit).
    entries / bytes: what the cache holds.
    uncached:        fetches that bypassed the cache (full, below min free space, unwritable).
    inserts:         entries added by write-through (uploads) and bundle members.
    evictions / bytes_evicted: entries removed by gc to respect the size cap.
    corrupt:         hits refused because the entry no longer matched its SHA-256.
    """

    hits: int = 0
    misses: int = 0
    bytes_saved: int = 0
    requests_saved: int = 0
    entries: int = 0
    bytes: int = 0
    uncached: int = 0
    inserts: int = 0
    evictions: int = 0
    bytes_evicted: int = 0
    corrupt: int = 0

    def as_dict(self) -> Dict[str, int]:
        return lean.asdict(self)


FIELDS = tuple(f.name for f in lean.fields(CacheStats))


def stats_from(values: Mapping[str, int]) -> CacheStats:
    return CacheStats(**{name: max(0, int(values.get(name, 0))) for name in FIELDS})


class StatsFile:
    """Read-modify-write of ``stats.json`` under an exclusive flock; readers need no lock."""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout

    def read(self) -> Dict[str, int]:
        try:
            with open(self._layout.stats_file, "rb") as fh:
                values = loads(fh.read())
            return {name: int(values.get(name, 0)) for name in FIELDS}
        except (OSError, ValueError, TypeError, AttributeError):
            return dict.fromkeys(FIELDS, 0)

    def update(self, delta: Mapping[str, int], usage: Optional[Tuple[int, int]] = None) -> Dict[str, int]:
        """Add ``delta``, optionally set (entries, bytes); returns the new values. Raises OSError."""
        with held(self._layout.stats_lock, EXCLUSIVE):
            values = self.read()
            for name, amount in delta.items():
                values[name] = values.get(name, 0) + amount
            if usage is not None:
                values["entries"], values["bytes"] = usage
                self._remove_leftovers()
            values = {name: max(0, value) for name, value in values.items()}
            self._write(values)
            return values

    def _write(self, values: Mapping[str, int]) -> None:
        temp = f"{self._layout.stats_file}.{os.getpid()}.{_thread.get_ident()}.part"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
            os.fchmod(fd, FILE_MODE)
            with os.fdopen(fd, "w", encoding="ascii") as fh:
                fh.write(dumps(values, sort_keys=True))
            os.replace(temp, self._layout.stats_file)
        except BaseException:
            remove_quietly(temp)
            raise

    def _remove_leftovers(self) -> None:
        """Temp files of writers killed mid-write (safe: every writer holds the lock)."""
        prefix = os.path.basename(self._layout.stats_file) + "."
        for name in os.listdir(self._layout.root):
            if name.startswith(prefix) and name.endswith(".part"):
                remove_quietly(os.path.join(self._layout.root, name))


class Counters:
    """Deltas not yet flushed, shared by the threads of one process."""

    def __init__(self) -> None:
        self._lock = _threads.Lock()
        self._pending: Dict[str, int] = {}

    def add(self, **delta: int) -> None:
        with self._lock:
            for name, amount in delta.items():
                self._pending[name] = self._pending.get(name, 0) + amount

    def peek(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._pending)

    def take(self) -> Dict[str, int]:
        with self._lock:
            pending, self._pending = self._pending, {}
            return pending

    def restore(self, pending: Mapping[str, int]) -> None:
        """Put back deltas whose flush failed, so they are not lost."""
        self.add(**pending)
