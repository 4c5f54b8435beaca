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

import contextlib
import fcntl
import os

from transfer.cache.layout import make_private_dirs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator, Optional

SHARED = fcntl.LOCK_SH
EXCLUSIVE = fcntl.LOCK_EX
_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


def acquire(path: str, mode: int, *, blocking: bool = True) -> Optional[int]:
    """Lock ``path`` (created with its directory if missing); the locked fd, or None when
    ``blocking`` is False and someone else holds a conflicting lock. Raises OSError."""
    while True:
        try:
            fd = os.open(path, _FLAGS, 0o600)
        except FileNotFoundError:
            make_private_dirs(os.path.dirname(path))
            continue
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


@contextlib.contextmanager
def held(path: str, mode: int) -> Iterator[int]:
    """``with held(path, SHARED):`` - blocks until the lock is granted."""
    fd = acquire(path, mode)
    assert fd is not None
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def try_held(path: str, mode: int) -> Iterator[Optional[int]]:
    """``with try_held(path, EXCLUSIVE) as fd:`` - fd is None when the lock is busy."""
    fd = acquire(path, mode, blocking=False)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)
