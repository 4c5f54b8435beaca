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

import fcntl
import os

from transfer.cache.layout import make_private_dirs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Tuple

SHARED = fcntl.LOCK_SH
EXCLUSIVE = fcntl.LOCK_EX
_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
_NEW = _FLAGS | os.O_EXCL


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
    removes; so do a job's files written once and waiting, without the lock, for their insert:
    :meth:`~transfer.cache.store.NodeCache.stage_linked`). Raises OSError."""
    try:
        fd = _open(path, _NEW)
    except FileExistsError:
        return _exclusive(path), False
    try:
        _lock(fd, EXCLUSIVE, True)
        if _still_named(fd, path):
            return fd, True
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)  # evicted the moment it was made: start over as an existing key
    return _exclusive(path), False


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
