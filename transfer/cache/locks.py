"""Advisory file locks (``fcntl.flock``) that stay correct when lock files are deleted.

flock locks belong to an open file description, so two threads of one process that each
open the lock file exclude each other just like two processes do, and the kernel releases
a lock when its holder dies (kill -9 included).

Lock files may be unlinked by whoever holds them exclusively (eviction does). A process
that opened the old file and then obtained its lock would hold a lock nobody else sees,
so :func:`acquire` checks, after locking, that the path still names the locked inode and
starts over if not.
"""

from __future__ import annotations

import errno
import fcntl
import os

from transfer.cache.layout import make_private_dirs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Tuple

SHARED = fcntl.LOCK_SH
EXCLUSIVE = fcntl.LOCK_EX
_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
_UNNAMED = os.O_RDWR | getattr(os, "O_TMPFILE", 0) | getattr(os, "O_CLOEXEC", 0)


def acquire(path: str, mode: int, *, blocking: bool = True) -> Optional[int]:
    """Lock ``path`` (created with its directory if missing); the locked fd, or None when
    ``blocking`` is False and someone else holds a conflicting lock. Raises OSError."""
    while True:
        fd = _open(path, _FLAGS)
        try:
            if not _lock(fd, mode, blocking):
                os.close(fd)
                return None
            if _still_named(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def acquire_new(path: str) -> Tuple[int, bool]:
    """Lock ``path`` exclusively, blocking: (the locked fd, whether this call created the file).

    A lock file is made before any other file of its key and removed after them (eviction,
    :mod:`transfer.cache.evict`), so a key whose lock this call created had no files: its
    filler may skip looking for a crashed predecessor's (at worst, a writer that took the new
    lock and died in the instant before this one left a temp file, which eviction's cleaning
    removes). The new file is locked before it has its name (:func:`_made_locked`): a file
    created and then locked would let another process take it in between, fill the key, and
    leave this one to fill it again. Raises OSError."""
    try:
        fd = _made_locked(path)
    except FileExistsError:
        return _exclusive(path), False
    if fd is None:  # no unnamed files here: never claim a new key
        return _exclusive(path), False
    return fd, True


def _made_locked(path: str) -> Optional[int]:
    """A new lock file at ``path`` (its directory made if missing), exclusively locked before
    it is linked there (an unnamed ``O_TMPFILE``, then ``linkat``): nobody else can have held
    it. FileExistsError when ``path`` exists; None where the filesystem or kernel has no
    unnamed files (or no ``/proc``). Raises OSError."""
    directory = os.path.dirname(path)
    try:
        fd = _open(directory + "/", _UNNAMED)  # the slash: _open makes the directory itself when missing
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None
        raise
    try:
        fcntl.flock(fd, EXCLUSIVE)  # nobody else can reach it yet: granted at once
        # linkat(AT_SYMLINK_FOLLOW) of its /proc name: a directory fd given makes os.link call linkat
        # (not link, which would link the symlink itself); the kernel ignores it for an absolute path
        os.link(f"/proc/self/fd/{fd}", path, src_dir_fd=fd)
    except FileNotFoundError:  # no /proc
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _exclusive(path: str) -> int:
    fd = acquire(path, EXCLUSIVE)
    if fd is None:  # only a non-blocking call returns None
        raise OSError(f"lock {path} not granted")
    return fd


def _open(path: str, flags: int) -> int:
    """Open (and create) the lock file ``path``, making its directory when missing."""
    try:
        return os.open(path, flags, 0o600)
    except FileNotFoundError:
        make_private_dirs(os.path.dirname(path))
        return os.open(path, flags, 0o600)


def _lock(fd: int, mode: int, blocking: bool) -> bool:
    try:
        fcntl.flock(fd, mode if blocking else mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _still_named(fd: int, path: str) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


class Held:
    """A lock taken by :func:`held` or :func:`try_held`: ``with`` gives its descriptor (None
    when :func:`try_held` found it busy) and releases it at the end. (A class, not
    ``contextlib.contextmanager``: contextlib brings collections and functools into every job
    step that uses the cache.)"""

    __slots__ = ("fd",)

    def __init__(self, fd: Optional[int]) -> None:
        self.fd = fd

    def __enter__(self) -> Optional[int]:
        return self.fd

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def held(path: str, mode: int) -> Held:
    """``with held(path, SHARED):`` - blocks until the lock is granted."""
    return Held(acquire(path, mode))


def try_held(path: str, mode: int) -> Held:
    """``with try_held(path, EXCLUSIVE) as fd:`` - fd is None when the lock is busy."""
    return Held(acquire(path, mode, blocking=False))
