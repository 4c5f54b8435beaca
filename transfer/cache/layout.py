"""The cache directory on disk: where a key's files live, safety checks, entry metadata, and the
marks a use (:func:`touch`) or an intact check (:func:`set_stamp`) leaves on a key's files.

::

    <root>/                     0700, owned by the user
      CACHEDIR.TAG              tells backup tools to skip the directory
      stats.json, stats.lock    persisted counters and the flock guarding them
      gc.lock                   one evicting process at a time
      objects/<hh>/             256 shards by the first two hex digits of the digest
        <digest>                the entry: complete, verified, mode 0444
        <digest>.meta           JSON: key, size, sha256, mtime_ns, version, source, created
        <digest>.lock           per-key flock: exclusive to fill or remove, shared to read
        <digest>.pin            mtime = last hand-out as a symlink
        <digest>.peers          capabilities of the peer scopes this node's daemon may serve
                                the entry to, one hex line each (``docs/security.md``)
        <digest>.ok             mtime = the entry's change time (ctime) when last known intact
        <digest>.<pid>.<n>.part data or metadata being written
      incoming/<pid>.<n>.part   a job's file written once, waiting for its insert
                                (:meth:`NodeCache.stage_linked`): one directory, so a first
                                job on a node makes no shard directory

``<digest>`` is the SHA-256 of the key. An entry exists exactly when its data file does;
the metadata is written (under the key's exclusive lock) before the data is renamed into place,
and removed after it.
"""

from __future__ import annotations

import itertools
import os
import stat
import time

from transfer._digests import digest_of as digest_of  # the name of a key, shared with the peers: defined below both
from transfer.lean import record
from transfer.lean_json import loads

from transfer.atomic import track_temp, untrack_temp, write_all
from transfer.errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Iterator, List, Optional, Tuple

DIR_MODE = 0o700
ENTRY_MODE = 0o444
FILE_MODE = 0o600  # metadata, counters: private whatever the umask
OBJECTS = "objects"
INCOMING = "incoming"
INCOMING_GRACE_S = 3600  # a staged file older than this waits for no insert: cleaning removes it
_TEMP_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_STAGED_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_META_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_META_NEW_FLAGS = _STAGED_FLAGS | os.O_NOFOLLOW
_TAG = ("Signature: 8a477f597d28d172789f06886806bc55\n"
        "# pegasus-cloudio node cache; see docs/cache.md\n")
_counter = itertools.count()  # unique temp names within this process
_PID = [os.getpid()]  # getpid() is a system call: asked once, and again in a forked child
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


def process_umask(probe_dir: str) -> int:
    """This process's umask, from ``Umask:`` of ``/proc/self/status`` (read without changing the
    umask, which ``os.umask`` would do for every thread at once); where that is unknown (no
    /proc, a kernel before 4.7), the bits a file created in ``probe_dir`` loses: a guess of
    022 would make a job's files readable by all under umask 077."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _probed_umask(probe_dir)


def _probed_umask(directory: str) -> int:
    """The permission bits a new file in ``directory`` loses to the umask; 077 (the most any
    umask takes from a file the cache hands a job) when none can be made there."""
    path = os.path.join(directory, f".umask.{os.getpid()}.{next(_counter)}.part")
    try:
        fd = os.open(path, _TEMP_FLAGS, 0o777)
    except OSError:
        return 0o077
    try:
        os.unlink(path)
        return 0o777 & ~stat.S_IMODE(os.fstat(fd).st_mode)
    except OSError:
        return 0o077
    finally:
        os.close(fd)


@record(frozen=True)
class KeyPaths:
    """The files of one key, all in one shard directory (so renames stay atomic)."""

    digest: str
    shard: str

    @property
    def data(self) -> str:
        return f"{self.shard}/{self.digest}"  # os.path.join's checks, 14 times per insert, cost more

    @property
    def meta(self) -> str:
        return self.data + ".meta"

    @property
    def lock(self) -> str:
        return self.data + ".lock"

    @property
    def pin(self) -> str:
        return self.data + ".pin"

    @property
    def peers(self) -> str:
        return self.data + ".peers"

    @property
    def stamp(self) -> str:
        """Its mtime is the entry's ctime when the entry was last known intact."""
        return self.data + ".ok"

    def new_temp(self) -> str:
        return f"{self.data}.{_PID[0]}.{next(_counter)}.part"

    def open_temp(self, mode: int = FILE_MODE) -> Tuple[int, str]:
        """A new temp file (fd, path) in the shard, created with it if missing, with ``mode``
        less the umask (the directory is private: 0700)."""
        path = self.new_temp()
        track_temp(path)  # a signal handler removes it (see transfer.atomic)
        try:
            fd = os.open(path, _TEMP_FLAGS, mode)
        except FileNotFoundError:
            make_private_dirs(self.shard)
            fd = os.open(path, _TEMP_FLAGS, mode)
        return fd, path

    def own_files(self) -> List[str]:
        """Names in the shard of this key's files but its lock: data, metadata, pin, peers
        capability, intact stamp and temp files (one listing; only under the key's exclusive lock)."""
        try:
            names = os.listdir(self.shard)
        except FileNotFoundError:
            return []
        prefix = self.digest + "."
        fixed = {self.digest, prefix + "meta", prefix + "pin", prefix + "peers", prefix + "ok"}
        return [n for n in names if n in fixed or (n.startswith(prefix) and n.endswith(".part"))]

    def leftovers(self) -> Iterator[str]:
        """Temp files of this key (only ever called under the key's exclusive lock)."""
        prefix = self.digest + "."
        try:
            names = os.listdir(self.shard)
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith(prefix) and name.endswith(".part"):
                yield os.path.join(self.shard, name)


class Layout:
    """Paths under one cache root."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.objects = os.path.join(root, OBJECTS)
        self.incoming = os.path.join(root, INCOMING)
        self.stats_file = os.path.join(root, "stats.json")
        self.stats_lock = os.path.join(root, "stats.lock")
        self.gc_lock = os.path.join(root, "gc.lock")

    def paths(self, key: str) -> KeyPaths:
        return self.paths_for_digest(digest_of(key))

    def paths_for_digest(self, digest: str) -> KeyPaths:
        return KeyPaths(digest, os.path.join(self.objects, digest[:2]))

    def open_staged(self) -> Tuple[int, str]:
        """A new file (fd open for writing, path) in ``incoming/`` (made 0700 if missing), created
        read-only as an entry is: 0444 less the umask, with no ``fchmod``. Raises OSError."""
        path = f"{self.incoming}/{_PID[0]}.{next(_counter)}.part"
        track_temp(path)  # a signal handler removes it (see transfer.atomic)
        try:
            fd = os.open(path, _STAGED_FLAGS, ENTRY_MODE)
        except FileNotFoundError:
            make_private_dirs(self.incoming)
            fd = os.open(path, _STAGED_FLAGS, ENTRY_MODE)
        return fd, path

    def shards(self) -> Iterator[str]:
        try:
            names = sorted(os.listdir(self.objects))
        except FileNotFoundError:
            return
        for name in names:
            if len(name) == 2:
                yield os.path.join(self.objects, name)


def make_private_dirs(path: str) -> None:
    """``os.makedirs`` with every directory it creates set to 0700 (whatever the umask)."""
    parent = os.path.dirname(path)
    if parent and parent != path and not os.path.isdir(parent):
        make_private_dirs(parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return
    os.chmod(path, DIR_MODE)


def prepare_root(root: str) -> None:
    """Create ``root`` (0700) or check that an existing one is safe to use.

    Raises ConfigError with a clear message when it is owned by another user, writable by
    group or others, inside a directory other users can write (:func:`_check_parents`), not a
    directory, or cannot be created.
    """
    _check_parents(root)
    try:
        make_private_dirs(root)
        st = os.stat(root)
        link = os.lstat(root)
    except OSError as err:
        raise ConfigError(f"cannot create the cache directory: {err.strerror}", url=root,
                          operation="cache") from err
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError("the cache directory path is not a directory", url=root, operation="cache")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"refusing a cache directory owned by uid {st.st_uid} (this process runs "
                          f"as uid {os.geteuid()}); set PEGASUS_CLOUDIO_CACHE_DIR to a directory of "
                          "your own", url=root, operation="cache")
    if stat.S_ISLNK(link.st_mode) and link.st_uid != os.geteuid():
        raise ConfigError(f"refusing a cache directory reached through a symbolic link owned by uid "
                          f"{link.st_uid}; set PEGASUS_CLOUDIO_CACHE_DIR to the real path", url=root,
                          operation="cache")
    if st.st_mode & 0o022:
        raise ConfigError(f"refusing a cache directory writable by group or others (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}); chmod 700 it", url=root, operation="cache")
    try:
        make_private_dirs(os.path.join(root, OBJECTS))
        _write_tag(root)
    except OSError as err:
        raise ConfigError(f"cannot write to the cache directory: {err.strerror}", url=root,
                          operation="cache") from err


def _check_parents(root: str) -> None:
    """ConfigError when a directory above ``root`` (as written or resolved) lets other users
    rename what it holds: writable by others, or by a group other than the user's own private
    group, without the sticky bit. They could move the cache away and put a directory of their
    own in its place, which a running process would then read entries from (and write the
    user's entries to)."""
    for path in {os.path.abspath(root), os.path.realpath(root)}:
        parent = os.path.dirname(path)
        while True:
            try:
                st = os.stat(parent)
            except OSError:
                st = None
            if st is not None and not st.st_mode & stat.S_ISVTX and (
                    st.st_mode & 0o002 or (st.st_mode & 0o020 and not _own_group(st.st_gid))):
                raise ConfigError(f"refusing a cache directory inside {parent}, which others can write (mode "
                                  f"{stat.S_IMODE(st.st_mode):04o}, no sticky bit): they could replace the "
                                  "cache; set PEGASUS_CLOUDIO_CACHE_DIR to a directory of your own", url=root,
                                  operation="cache")
            if os.path.dirname(parent) == parent:
                break
            parent = os.path.dirname(parent)


def _own_group(gid: int) -> bool:
    """True if ``gid`` is this user's private group (named after the user and listing nobody
    else, as on systems whose users' directories are group-writable by default)."""
    import grp
    import pwd
    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return False
    return group.gr_name == user and set(group.gr_mem) <= {user}


def _write_tag(root: str) -> None:
    path = os.path.join(root, "CACHEDIR.TAG")
    if os.path.exists(path):
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # another process wrote it just now
        return
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(_TAG)


@record(frozen=True)
class Meta:
    """What the cache recorded about an entry when it was published."""

    key: str
    size: int
    sha256: str
    mtime_ns: int
    created: float
    version: Optional[str] = None
    source: str = "download"

    def matches(self, st: os.stat_result) -> bool:
        """The cheap check done on every hit: size and modification time unchanged."""
        return st.st_size == self.size and st.st_mtime_ns == self.mtime_ns

    def changed(self, version: Optional[str], sha256: Optional[str]) -> bool:
        """Whether an object stored as ``version``/``sha256`` (None: not known) is another than
        the one this entry holds: the object changed under its name."""
        if version is not None and self.version is not None and version != self.version:
            return True
        return sha256 is not None and sha256 != self.sha256

    def same(self, version: Optional[str], sha256: Optional[str]) -> bool:
        """Whether an object stored as ``version``/``sha256`` is known to be the one this entry
        holds: not :meth:`changed`, and the version or the SHA-256 matches (an upload in parts
        has no version, and nothing then tells it apart from the entry before it is hashed)."""
        if self.changed(version, sha256):
            return False
        return (version is not None and version == self.version) or sha256 is not None


def read_meta(path: str) -> Optional[Meta]:
    """The metadata at ``path``; None when missing or unreadable (the entry is then corrupt)."""
    try:
        with open(path, "rb") as fh:
            return parse_meta(fh.read())
    except OSError:
        return None


def parse_meta(data: bytes) -> Optional[Meta]:
    """Metadata from the bytes of a ``.meta`` file; None when malformed."""
    try:
        fields = loads(data)
        return Meta(key=str(fields["key"]), size=int(fields["size"]), sha256=str(fields["sha256"]),
                    mtime_ns=int(fields["mtime_ns"]), created=float(fields["created"]),
                    version=fields.get("version"), source=str(fields.get("source", "download")))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def meta_bytes(meta: Meta) -> bytes:
    """The ``.meta`` file's bytes: ``json.dumps`` of the fields, keys sorted (one format, by hand:
    the generic encoder cost more than the rest of a bundle member's insert)."""
    quote = _quote()
    version = "null" if meta.version is None else quote(meta.version)
    return (f'{{"created": {float.__repr__(float(meta.created))}, "key": {quote(meta.key)}, '
            f'"mtime_ns": {int(meta.mtime_ns)}, "sha256": {quote(meta.sha256)}, "size": {int(meta.size)}, '
            f'"source": {quote(meta.source)}, "version": {version}}}').encode()


def _quote() -> Callable[[str], str]:
    import _json
    return _json.encode_basestring_ascii


def write_meta_in_place(paths: KeyPaths, meta: Meta, used_ns: Optional[int] = None, *,
                        new_private: bool = False) -> None:
    """Write the metadata at its own name, mode 0600: only under the key's exclusive lock while
    the key has no data file (an entry exists only when its data file does, so nothing reads
    this file until the data is renamed into place after it). ``used_ns``: the file's mtime,
    the entry's last use (see :func:`touch`). ``new_private``: the caller created the key's lock
    (so the key has no metadata file) and the umask takes nothing of 0600: a file created
    exclusively has that mode already, and no ``fchmod`` is made (one system call less per
    insert; a file found there after all is written as without ``new_private``). Raises OSError."""
    fd = _created_private(paths.meta) if new_private else -1
    if fd < 0:
        fd = os.open(paths.meta, _META_FLAGS, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)  # an existing file keeps its mode; a new one loses the umask's bits
        except BaseException:
            os.close(fd)
            raise
    try:
        write_all(fd, meta_bytes(meta))
        if used_ns is not None:
            os.utime(fd, ns=(used_ns, used_ns))
    finally:
        os.close(fd)


def _created_private(path: str) -> int:
    """A new file at ``path`` open for writing, created ``FILE_MODE`` less the umask; -1 when
    ``path`` exists. Raises OSError."""
    try:
        return os.open(path, _META_NEW_FLAGS, FILE_MODE)
    except FileExistsError:
        return -1


MAX_GRANTS = 64  # scopes one entry is shared with; a daemon reads at most this many lines
GRANT_LINE = 65


def stamped_ctime(paths: KeyPaths) -> Optional[int]:
    """The ctime the entry had when last known intact (its ``.ok`` stamp), None if unknown."""
    try:
        return os.stat(paths.stamp).st_mtime_ns
    except OSError:
        return None


def set_stamp(paths: KeyPaths, ctime_ns: int) -> None:
    """Record ``ctime_ns`` as the mtime of the entry's stamp file (created if missing). Raises OSError."""
    os.close(os.open(paths.stamp, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600))
    os.utime(paths.stamp, ns=(ctime_ns, ctime_ns))


def touch(paths: KeyPaths, symlink: bool) -> None:
    """Record a use: the metadata's mtime orders LRU; a symlink hand-out also pins."""
    now = time.time_ns()
    try:
        os.utime(paths.meta, ns=(now, now))
        if symlink:
            os.close(os.open(paths.pin, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600))
            os.utime(paths.pin, ns=(now, now))
    except OSError:
        pass


def grant_capability(path: str, capability: str) -> bool:
    """Append ``capability`` to the grants file at ``path`` unless it is there already
    (True) or the file is full (False). Appends of one short line are atomic, so concurrent
    grants need no lock; a duplicate line does no harm."""
    line = (capability + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                 FILE_MODE)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        known = os.pread(fd, MAX_GRANTS * GRANT_LINE, 0)
        if line in known.splitlines(keepends=True):
            return True
        if len(known) >= MAX_GRANTS * GRANT_LINE:
            return False
        os.write(fd, line)
        return True
    finally:
        os.close(fd)


def remove_quietly(path: str) -> bool:
    """Unlink ``path``; True if it was removed, False if it was absent or could not be."""
    untrack_temp(path)
    try:
        os.unlink(path)
    except OSError:
        return False
    return True
