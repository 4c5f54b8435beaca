"""NodeCache: a write-once cache of whole objects shared by every process on a node.

Protocol for one key (the lock is ``<digest>.lock``, see :mod:`transfer.cache.locks`):

1. Take the lock *shared*. If a valid entry exists (size and mtime as recorded; for entries
   up to ``verify_bytes`` the SHA-256 too; for bigger ones the SHA-256 again whenever the
   entry's ctime moved since it was last known intact), link or copy it to the destination
   while still holding the lock - eviction cannot take an entry
   whose lock is held - and return a hit.
2. Otherwise take the lock *exclusive* (this is where N-1 processes wait while one
   downloads). If a valid entry appeared meanwhile, go back to 1. Else remove what a
   crashed or corrupt predecessor left, download into a temp file in the cache (hashing on
   the way), check the size against the store's, fsync, record the metadata, make it 0444
   and rename it into place; then materialise it, still exclusive, and return a miss.

Whatever goes wrong on the cache's side (full disk, quota, permissions, below the minimum
free space) turns into an uncached transfer into an atomic temp file beside the
destination, never into a failed job. Errors of the download and of the destination
propagate unchanged. An uncached download whose version (ETag) differs from the entry's
drops the entry: the object changed under its name. The members of a bundle go in as one
batch per bundle (:mod:`transfer.cache.members`, imported only for them).
"""

from __future__ import annotations

import os

from transfer import _digests
from transfer.atomic import AtomicFile
from transfer.backends.base import ObjectInfo
from transfer.cache import evict
from transfer.cache.config import CacheConfig, config_from_env
from transfer.cache.entries import Entries
from transfer.cache.layout import KeyPaths, Meta, grant_capability, prepare_root, remove_quietly, touch
from transfer.cache.locks import EXCLUSIVE, SHARED, Held, acquire_new, held
from transfer.cache.materialise import materialise
from transfer.cache.sink import CacheSink
from transfer.cache.staging import Staged, stage_bytes, stage_file, stage_linked
from transfer.cache.stats import CacheStats, stats_from
from transfer.errors import ChecksumMismatch, ConfigError, TransferError
from transfer.lean import logger

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Callable, List, Mapping, Optional, Sequence, Set, Tuple

if TYPE_CHECKING:
    Download = Callable[[BinaryIO], ObjectInfo]
else:
    Download = object  # the alias above is for type checkers; typing is not imported at run time
_log = logger(__name__)  # logging is imported when a warning is first logged
JOB_FILE_MODE = 0o666  # before the umask: what an uncached download (transfer.atomic) creates
_ROUNDS = 3


class _CannotStore(Exception):
    """The cache cannot take this object now: transfer it uncached."""


class _Call:
    """State of one fetch: once ``download`` has been called, nothing may call it again."""

    downloaded = False


class NodeCache:
    """One cache directory. Thread-safe; any number of processes may share the directory.

    Raises ConfigError when the directory is unsafe (another owner, group/world-writable)
    or cannot be created. Call :meth:`close` at the end of a batch to persist counters.
    """

    def __init__(self, config: CacheConfig) -> None:
        prepare_root(config.directory)
        self.config = config
        self._entries = Entries(config)
        self._layout = self._entries.layout
        self._counters = self._entries.counters

    @property
    def directory(self) -> str:
        return self.config.directory

    # -- fetch ------------------------------------------------------------------------

    def fetch(self, key: str, dest_path: str, download: Download, *,
              symlink: bool = False, missed: bool = False, fresh: Optional[str] = None,
              mode: Optional[int] = None) -> Tuple[int, bool]:
        """Make ``dest_path`` hold the object ``key`` names; returns (bytes, hit?).

        ``download(sink)`` writes the object to ``sink`` and returns its ObjectInfo. It is
        called at most once per fetch, and by one process at a time per key on the node;
        its errors propagate unchanged and leave nothing behind. ``missed``: the caller has
        just found no entry (a hint: the first look for a hit is made under the fill's lock).
        ``fresh``: the version of the object as the caller's download has it (its bytes already
        in hand): an entry recorded with another version is not handed out but replaced, as
        :meth:`observe` drops one. ``mode``: ``dest_path`` is a file of its own, never a hard link
        of the entry (whose mode stays), created with these permission bits before the umask
        (None: the cache's way, a read-only link of the entry where it can).
        """
        paths = self._layout.paths(key)
        call = _Call()
        try:
            for attempt in range(_ROUNDS):
                size = None if missed and not attempt else self._serve(paths, key, dest_path, symlink, mode)
                if size is not None:
                    self._counters.add(hits=1, requests_saved=1, bytes_saved=size)
                    return size, True
                fd, new_key = acquire_new(paths.lock)
                with Held(fd):
                    meta = None if new_key else self._entries.valid(paths, key, check=True, report=False)
                    if meta is None or self._outdated(meta, key, fresh):
                        return self._fill(paths, key, dest_path, download, (symlink, mode), call, new_key)
        except _CannotStore:
            pass
        except OSError as err:
            if isinstance(err, TransferError) or call.downloaded:
                raise
            _log.warning("cache %s unusable for this transfer: %s", self.directory, err)
        finally:
            self._entries.gc_if_due()
        self._counters.add(misses=1, uncached=1)
        info = _download_to(dest_path, download, 0o666 if mode is None else mode)
        self.observe(key, info.version)
        return info.size, False

    def _outdated(self, meta: Meta, key: str, fresh: Optional[str]) -> bool:
        """Whether the entry ``meta`` is of another version than ``fresh`` (logged: it goes)."""
        if fresh is None or meta.version is None or meta.version == fresh:
            return False
        _log.warning("cache %s: %s changed in the store (version %s, cached %s); entry replaced",
                     self.directory, key, fresh, meta.version)
        return True

    def _serve(self, paths: KeyPaths, key: str, dest_path: str, symlink: bool, mode: Optional[int]) -> Optional[int]:
        """A hit, under the shared lock: the entry's size, or None without a valid entry."""
        with held(paths.lock, SHARED):
            meta = self._entries.valid(paths, key, check=True)
            if meta is None:
                return None
            hardlink = self.config.hardlink and self._entries.linkable(paths.data)
            materialise(paths.data, dest_path, symlink=symlink, hardlink=hardlink, mode=mode)
            self._entries.restamp(paths, meta.size)  # our own hard link moved the ctime
            touch(paths, symlink)
            return meta.size

    def observe(self, key: str, version: Optional[str]) -> None:
        """A fresh GET of ``key`` returned ``version``: drop an entry recorded with another
        version (the object changed under its name, which Pegasus's write-once contract rules
        out, so it is rare and never served)."""
        if version is None:
            return
        paths = self._layout.paths(key)
        try:
            with held(paths.lock, EXCLUSIVE):
                meta = self._entries.valid(paths, key)
                if meta is not None and meta.version is not None and meta.version != version:
                    _log.warning("cache %s: %s changed in the store (version %s, cached %s); entry dropped",
                                 self.directory, key, version, meta.version)
                    self._entries.remove_invalid(paths)
        except OSError as err:
            _log.warning("cache %s: cannot check %s: %s", self.directory, key, err)

    def drop(self, key: str) -> None:
        """The object named ``key`` was (or may have been) replaced in the store by this node:
        remove its entry, so that no later read on the node gets the old bytes. Logs, never
        raises, when the entry cannot be removed."""
        paths = self._layout.paths(key)
        if not (os.path.lexists(paths.data) or os.path.lexists(paths.meta)):
            return  # nothing cached under the name: no lock file made for an upload's name
        try:
            with held(paths.lock, EXCLUSIVE):
                self._entries.remove_invalid(paths)
        except OSError as err:
            _log.warning("cache %s: cannot drop %s after an upload over it: %s", self.directory, key, err)

    def _fill(self, paths: KeyPaths, key: str, dest_path: str, download: Download, how: Tuple[bool, Optional[int]],
              call: _Call, new_key: bool) -> Tuple[int, bool]:
        """A miss, under the exclusive lock: download, publish, materialise (``how``: symlink and
        mode, as :meth:`fetch` has them). ``new_key``: this fill made the key's lock, so the key
        has no files to clear (:func:`acquire_new`)."""
        if not new_key:
            self._entries.remove_invalid(paths)
        if not self._entries.has_room(0):
            raise _CannotStore()
        try:
            fd, temp = paths.open_temp(JOB_FILE_MODE)  # its mode says what the umask leaves
        except OSError as err:
            raise _CannotStore() from err
        sink = CacheSink(fd, temp, dest_path, 0o666 if how[1] is None else how[1])
        try:
            call.downloaded = True
            info = download(sink)  # type: ignore[arg-type]  # a sink writes like a BinaryIO
            if sink.written != info.size:
                raise ChecksumMismatch(f"received {sink.written} bytes, expected {info.size}",
                                       url=str(info.url), operation="get")
            if sink.fallback is not None:  # the cache's disk failed mid-way: delivered uncached
                self._counters.add(misses=1, uncached=1)
                return sink.fallback.commit(info.size), False
            self._deliver(paths, key, sink, info.version, dest_path, how)
            return sink.written, False
        finally:
            sink.abort()

    def _deliver(self, paths: KeyPaths, key: str, sink: CacheSink, version: Optional[str], dest_path: str,
                 how: Tuple[bool, Optional[int]]) -> None:
        """The complete download in ``sink`` becomes the entry and reaches ``dest_path``; or, when
        the cache cannot keep it, the temp file itself (made 0666 less the umask when opened, as
        an uncached download's) is linked or copied there (copied, with ``how``'s mode given)."""
        temp = sink.temp
        symlink, mode = how
        if self._entries.publish(paths, key, (sink.cache_fd(), temp, sink.hexdigest()), version, "download",
                                 fill=True):
            sink.published()
            materialise(paths.data, dest_path, symlink=symlink, hardlink=self.config.hardlink, mode=mode)
            self._entries.restamp(paths, sink.written)
            if symlink:
                touch(paths, symlink)  # the pin
            self._counters.add(misses=1)
        else:  # the job's file is a hard link (or copy) of the temp file, which then goes
            os.fchmod(sink.cache_fd(), self._entries.less_umask(JOB_FILE_MODE))  # publish may have set 0444
            materialise(temp, dest_path, mode=mode)
            self._counters.add(misses=1, uncached=1)

    # -- inserts ----------------------------------------------------------------------

    def stage_linked(self, key: str, data: bytes, dest_path: str) -> Optional[str]:
        """Write once and link, for an insert made later (:meth:`insert_members` ``temps``):
        ``data`` (verified, of the object ``key`` names) into a temp file in the cache, read-only
        as an entry is, and hard-linked at ``dest_path``, so the insert renames it into the entry
        instead of writing the bytes again. Without the key's lock or metadata: the job's file
        costs one file made, as without the cache. None (nothing written) where the cache hands
        out no hard links, the entry would not be re-hashed on a hit (bigger than
        ``verify_bytes``: the job's copy is the entry until then), or the link fails (another
        filesystem): the caller writes ``dest_path`` itself. Errors of ``dest_path`` propagate."""
        if not (self.config.hardlink and self.config.verifies(len(data))):
            return None
        try:
            return stage_linked(self._layout, data, dest_path)
        except OSError as err:
            if isinstance(err, TransferError):
                raise
            _log.warning("cache %s unusable for this transfer: %s", self.directory, err)
            return None

    def insert_file(self, key: str, path: str, version: Optional[str] = None, *, link: bool = False) -> bool:
        """Write-through after an upload: store the local file ``path`` as ``key``.

        A copy (reflinked where the filesystem can), so the caller's file keeps its mode;
        ``link=True`` hard-links instead when ``path`` is this user's and on the cache's
        filesystem, and the file then becomes read-only: it *is* the entry. False if not stored.
        """
        return self._insert(key, version, None, "upload",
                            lambda paths: stage_file(paths, path, link and self.config.hardlink))

    def insert_bytes(self, key: str, data: bytes, version: Optional[str] = None) -> bool:
        """Store ``data`` as ``key`` (bundle members fetched along with a wanted one)."""
        if len(data) > self.config.max_bytes:
            return False
        return self._insert(key, version, _digests.sha256_hex(data), "bundle",
                            lambda paths: stage_bytes(paths, data))

    def insert_members(self, members: Sequence[Tuple[str, bytes, str]], version: Optional[str] = None,
                       dests: Optional[Sequence[Sequence[str]]] = None, *, source: str = "bundle",
                       read_at: Optional[float] = None, versions: Optional[Sequence[Optional[str]]] = None,
                       read_ats: Optional[Sequence[Optional[float]]] = None,
                       temps: Optional[Sequence[Optional[str]]] = None) -> List[str]:
        """Store verified bundle members, ``(key, bytes, sha256)`` each, as one batch; the keys
        stored. With ``dests`` (paths per member), stored members are also materialised there.
        ``source`` is recorded in their metadata ("download": bodies a job read, stored behind
        its answer); ``read_at``, when the bytes were read (an insert behind a job's answer): an
        entry published after that stays. ``versions`` and ``read_ats`` (one per member) take
        the place of ``version`` and ``read_at`` for a batch of objects read one by one;
        ``temps``, per member, the temp file :meth:`stage_linked` made of its bytes (None: none),
        renamed into the entry where the key is new. The contract is
        :mod:`transfer.cache.members`'s, imported at the first batch."""
        from transfer.cache.members import insert_members
        return insert_members(self._entries, members, version, dests, source, read_at, versions=versions,
                              read_ats=read_ats, temps=temps)

    def _insert(self, key: str, version: Optional[str], sha256: Optional[str], source: str,
                stage: Callable[[KeyPaths], Staged]) -> bool:
        """Store what ``stage`` writes as ``key``; an existing entry stays only when its version or
        SHA-256 shows that it is the same object (else: an upload over an existing name)."""
        paths = self._layout.paths(key)
        stored = False
        try:
            with held(paths.lock, EXCLUSIVE):
                meta = self._entries.valid(paths, key)
                if meta is not None and meta.same(version, sha256):
                    return True
                self._entries.remove_invalid(paths)
                if not self._entries.has_room(0):
                    return False
                staged = stage(paths)
                try:
                    stored = self._entries.publish(paths, key, staged, version, source)
                finally:
                    os.close(staged[0])
                    remove_quietly(staged[1])
        except OSError as err:
            _log.warning("cache %s: cannot insert %s: %s", self.directory, key, err)
            return False
        finally:
            self._entries.gc_if_due()
        if stored:
            self._counters.add(inserts=1)
        return stored

    # -- queries and maintenance ------------------------------------------------------

    def contains(self, key: str) -> bool:
        """True if a valid entry for ``key`` exists (cheap check, no lock)."""
        try:
            return self._entries.valid(self._layout.paths(key), key) is not None
        except OSError:
            return False

    def holds(self, keys: Sequence[Optional[str]]) -> List[bool]:
        """:meth:`contains` of each key (None: False), for a batch: one listing of the shards
        first, so a key whose shard does not exist costs no look (a first job on a node: none)."""
        try:
            shards = set(os.listdir(self._layout.objects))
        except OSError:
            return [False] * len(keys)
        if not shards:
            return [False] * len(keys)
        return [key is not None and self._holds(key, shards) for key in keys]

    def _holds(self, key: str, shards: Set[str]) -> bool:
        paths = self._layout.paths(key)
        try:
            return paths.digest[:2] in shards and self._entries.valid(paths, key) is not None
        except OSError:
            return False

    def describe(self, key: str) -> Optional[Meta]:
        """The recorded metadata (size, SHA-256, ...) of a valid entry for ``key``, or None."""
        try:
            return self._entries.valid(self._layout.paths(key), key)
        except OSError:
            return None

    def grant(self, key: str, capability: str) -> bool:
        """Let this node's cache daemon serve ``key``'s entry to readers proving
        ``capability`` (a 64-digit hex string): one line appended to ``<digest>.peers``
        (0600). False when there is no valid entry, or the file holds too many already.
        Raises OSError when it cannot be written."""
        if len(capability) != 64 or capability.strip("0123456789abcdef"):
            raise ValueError("a capability is 64 lower-case hex digits")
        paths = self._layout.paths(key)
        with held(paths.lock, SHARED):
            if self._entries.valid(paths, key) is None:
                return False
            return grant_capability(paths.peers, capability)

    def pin(self, key: str) -> "_Pinned":
        """``with cache.pin(key) as path:`` - the entry's path (None if absent), which
        eviction leaves alone until the block ends."""
        return _Pinned(self._entries, key)

    def stats(self) -> CacheStats:
        """Counters of every process that used this directory, plus this one's unflushed ones."""
        return stats_from(self._entries.stats())

    def entries(self) -> List[evict.EntryInfo]:
        """Every entry with its metadata, least recently used first."""
        found = evict.scan(self._layout, self.config, with_meta=True)
        return sorted(found, key=lambda e: e.last_used)

    def gc(self, wait: bool = True) -> int:
        """Evict per the watermarks (LRU, never entries in use or pinned); bytes freed.

        With ``wait`` False, returns 0 at once when another process is collecting."""
        return self._entries.gc(wait)

    def verify(self) -> List[str]:
        """Fully check every entry not in use; the keys of corrupt ones, which are removed."""
        bad = evict.verify(self._layout, self.config)
        self._entries.set_usage({}, evict.usage(self._layout, self.config))
        return bad

    def clear(self) -> int:
        """Remove every entry not in use nor pinned (handed out as a symlink less than
        ``pin_seconds`` ago: a job may still read it); the counters are kept. Returns the
        number of pinned entries kept."""
        kept = evict.clear(self._layout, self.config)[2]
        self._entries.set_usage({}, evict.usage(self._layout, self.config))
        return kept

    def flush_stats(self) -> None:
        """Merge this process's counters into the shared file (one small locked write)."""
        self._entries.flush_stats()

    def close(self) -> None:
        """End of a batch: persist the counters, and collect if over the high watermark."""
        self._entries.settle()

    def __enter__(self) -> "NodeCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Pinned:
    """What :meth:`NodeCache.pin` returns: the entry's shared lock, held for the ``with`` block."""

    __slots__ = ("_entries", "_key", "_lock")

    def __init__(self, entries: Entries, key: str) -> None:
        self._entries, self._key = entries, key
        self._lock: Optional[Held] = None

    def __enter__(self) -> Optional[str]:
        paths = self._entries.paths(self._key)
        self._lock = held(paths.lock, SHARED)
        try:
            return paths.data if self._entries.valid(paths, self._key) is not None else None
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.__exit__()
            self._lock = None


def cache_from_settings(env: Mapping[str, str], *, strict: bool = False) -> Optional[NodeCache]:
    """The cache ``PEGASUS_CLOUDIO_CACHE_*`` in ``env`` describes; None when it is ``off``.

    An unusable directory (foreign owner, group/world-writable, cannot be created) logs a
    warning and returns None - transfers then go uncached - unless ``strict`` (ConfigError).
    A malformed value raises InvalidInput.
    """
    config = config_from_env(env)
    if config is None:
        return None
    try:
        return NodeCache(config)
    except ConfigError as err:
        if strict:
            raise
        _log.warning("node cache disabled: %s", err)
        return None


def _download_to(dest_path: str, download: Download, mode: int) -> ObjectInfo:
    """The uncached path: straight into an atomic temp file (``mode`` before the umask) beside
    the destination."""
    with AtomicFile(dest_path, mode=mode) as out:
        info = download(out.file)
        out.commit(info.size)
        return info
