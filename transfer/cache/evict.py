"""Scanning the cache, and removing entries: LRU eviction, verification, clearing.

Every removal takes the key's lock exclusively *without waiting*: an entry whose lock is
held (being filled, or being read into a job's directory) is in use and is skipped. The
lock file itself is unlinked while held, which :mod:`transfer.cache.locks` tolerates.
"""

from __future__ import annotations

import os
import time

from transfer import _digests
from transfer.lean import record

from transfer.cache.config import CacheConfig
from transfer.cache.layout import (
    INCOMING_GRACE_S, KeyPaths, Layout, Meta, digest_of, read_meta, remove_quietly,
)
from transfer.cache.locks import EXCLUSIVE, try_held

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator, List, Optional, Tuple

_DIGEST_LEN = 64
_HASH_CHUNK = 1 << 20


@record(frozen=True)
class EntryInfo:
    """One entry as found on disk. ``last_used`` is a Unix time; ``meta`` only when asked."""

    digest: str
    path: str
    size: int
    last_used: float
    pinned_until: float
    links: int
    meta: Optional[Meta] = None

    @property
    def key(self) -> str:
        return self.meta.key if self.meta is not None else self.digest


@record(frozen=True)
class Collected:
    """What one eviction pass did and left."""

    freed: int
    evicted: int
    entries: int
    bytes: int


def scan(layout: Layout, config: CacheConfig, *, with_meta: bool = False) -> Iterator[EntryInfo]:
    """Every entry, shard by shard (cheap: stats only, unless ``with_meta``)."""
    for shard in layout.shards():
        try:
            names = os.listdir(shard)
        except FileNotFoundError:
            continue
        for name in names:
            if len(name) == _DIGEST_LEN and "." not in name:
                found = _entry(layout.paths_for_digest(name), config, with_meta)
                if found is not None:
                    yield found


def _entry(paths: KeyPaths, config: CacheConfig, with_meta: bool) -> Optional[EntryInfo]:
    try:
        st = os.stat(paths.data)
    except FileNotFoundError:
        return None
    last_used = _mtime(paths.meta) or st.st_mtime
    pinned = _mtime(paths.pin)
    return EntryInfo(paths.digest, paths.data, st.st_size, last_used,
                     pinned + config.pin_seconds if pinned else 0.0, st.st_nlink,
                     read_meta(paths.meta) if with_meta else None)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def remove_entry(paths: KeyPaths) -> Optional[int]:
    """Remove the entry and its files; the caller holds the key's lock exclusively.

    Returns the size of the data file removed, None when there was none. One listing of the
    shard says which of the key's files exist; only those are unlinked (a new key: none)."""
    names = paths.own_files()
    size: Optional[int] = None
    if paths.digest in names:
        try:
            size = os.stat(paths.data).st_size
        except OSError:
            size = None
        if size is not None and not remove_quietly(paths.data):
            size = None
    for name in names:
        if name != paths.digest:
            remove_quietly(f"{paths.shard}/{name}")
    return size


def try_remove(paths: KeyPaths) -> Optional[int]:
    """Remove an entry not in use; its size, or None if it is in use or already gone."""
    with try_held(paths.lock, EXCLUSIVE) as fd:
        if fd is None:
            return None
        size = remove_entry(paths)
        if size is not None:
            remove_quietly(paths.lock)
        return size


def collect(layout: Layout, config: CacheConfig, now: Optional[float] = None) -> Collected:
    """Evict least recently used entries not in use or pinned, if above the high watermark,
    down to the low watermark; clean crash leftovers. Returns what it did and left."""
    now = time.time() if now is None else now
    entries = sorted(scan(layout, config), key=lambda e: e.last_used)
    total = sum(e.size for e in entries)
    freed = evicted = 0
    if total > config.high_bytes:
        for entry in entries:
            if total <= config.low_bytes:
                break
            if entry.pinned_until > now:
                continue
            size = try_remove(layout.paths_for_digest(entry.digest))
            if size is not None:
                total, freed, evicted = total - size, freed + size, evicted + 1
    clean_leftovers(layout)
    return Collected(freed, evicted, len(entries) - evicted, total)


def clean_leftovers(layout: Layout) -> int:
    """Remove temp files of crashed writers, files of keys without an entry, and files staged
    in ``incoming/`` longer ago than :data:`~transfer.cache.layout.INCOMING_GRACE_S`; count them.

    A file of a key is only removed while holding its key's lock, so nobody is writing it."""
    removed = _clean_incoming(layout.incoming, time.time() - INCOMING_GRACE_S)
    for shard in layout.shards():
        try:
            names = os.listdir(shard)
        except FileNotFoundError:
            continue
        stray = {n.split(".", 1)[0] for n in names if "." in n} - {n for n in names if "." not in n}
        for digest in sorted(stray):
            removed += _clean_key(layout.paths_for_digest(digest))
    return removed


def _clean_incoming(incoming: str, before: float) -> int:
    """Remove the staged files in ``incoming`` last modified before ``before``: a job's file
    written once (:meth:`~transfer.cache.store.NodeCache.stage_linked`) waits there for the
    insert behind its answer, seconds as a rule; one older waits for none (its job was killed
    before its inserts). Removing a name the job holds as a hard link leaves the job's file;
    one whose insert is still to come costs only that entry (the insert writes the bytes)."""
    try:
        names = os.listdir(incoming)
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        path = f"{incoming}/{name}"
        if name.endswith(".part") and _mtime(path) < before:
            removed += remove_quietly(path)
    return removed


def _clean_key(paths: KeyPaths) -> int:
    with try_held(paths.lock, EXCLUSIVE) as fd:
        if fd is None or os.path.exists(paths.data):
            return 0
        removed = sum(remove_quietly(p) for p in [paths.meta, paths.pin, paths.peers, *paths.leftovers()])
        remove_quietly(paths.lock)
        return removed


def verify(layout: Layout, config: CacheConfig) -> List[str]:
    """Check every entry not in use fully (size, mtime, SHA-256); remove and name the bad ones."""
    bad: List[str] = []
    for entry in list(scan(layout, config)):
        paths = layout.paths_for_digest(entry.digest)
        with try_held(paths.lock, EXCLUSIVE) as fd:
            if fd is None or not os.path.exists(paths.data):
                continue
            meta = read_meta(paths.meta)
            if meta is None or not _intact(paths, meta):
                bad.append(meta.key if meta is not None else entry.digest)
                remove_entry(paths)
                remove_quietly(paths.lock)
    return bad


def _intact(paths: KeyPaths, meta: Meta) -> bool:
    if digest_of(meta.key) != paths.digest:
        return False
    try:
        with open(paths.data, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not meta.matches(st):
                return False
            digest = _digests.new("sha256", st.st_size)
            for block in iter(lambda: fh.read(_HASH_CHUNK), b""):
                digest.update(block)
    except OSError:
        return False
    return digest.hexdigest() == meta.sha256


def clear(layout: Layout, config: CacheConfig, now: Optional[float] = None) -> Tuple[int, int, int]:
    """Remove every entry not in use nor pinned (a job may hold a symlink to it, as eviction
    honours); (entries removed, bytes removed, pinned entries kept)."""
    now = time.time() if now is None else now
    count = size = kept = 0
    for entry in list(scan(layout, config)):
        if entry.pinned_until > now:
            kept += 1
            continue
        removed = try_remove(layout.paths_for_digest(entry.digest))
        if removed is not None:
            count, size = count + 1, size + removed
    clean_leftovers(layout)
    return count, size, kept


def usage(layout: Layout, config: CacheConfig) -> Tuple[int, int]:
    """(entries, bytes) by a full scan."""
    count = size = 0
    for entry in scan(layout, config):
        count, size = count + 1, size + entry.size
    return count, size
