"""Putting a complete file (a cache entry) at a job's path, atomically.

In order of preference: a hard link (same filesystem: no bytes move, microseconds), a
reflink (``FICLONE``: copy-on-write on btrfs/XFS), a kernel copy (``copy_file_range``),
a plain read/write copy. A symlink only when asked for (Pegasus ``--symlink``). The job
never sees a partial file: links are made under a temp name and renamed over ``dest``,
copies go through :class:`transfer.atomic.AtomicFile`.
"""

from __future__ import annotations

import errno
import fcntl
import os

from transfer.atomic import AtomicFile, atomic_hardlink, atomic_symlink, local_error, pwrite_all

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

FICLONE = 0x40049409  # _IOW(0x94, 9, int) from linux/fs.h
_CHUNK = 1 << 20
_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM,
                   errno.EBADF)


def materialise(source: str, dest: str, *, symlink: bool = False, hardlink: bool = True,
                mode: Optional[int] = None) -> str:
    """Make ``dest`` hold ``source``'s bytes; returns how: symlink, hardlink, reflink or copy.
    ``mode``: ``dest`` is a file of its own (never a hard link, which shares ``source``'s mode)
    created with these permission bits before the umask.

    Raises a :mod:`transfer.errors` exception (NoSpace, AuthError, ...) for ``dest``.
    """
    if symlink:
        atomic_symlink(source, dest)
        return "symlink"
    if mode is None and hardlink and atomic_hardlink(source, dest):
        return "hardlink"
    return copy_atomically(source, dest, 0o666 if mode is None else mode)


def copy_atomically(source: str, dest: str, mode: int = 0o666) -> str:
    """Copy ``source`` to ``dest`` through a temp file created with ``mode`` (before the
    umask); returns "reflink" or "copy"."""
    try:
        src = os.open(source, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise local_error(err, source, "read") from err
    try:
        size = os.fstat(src).st_size
        with AtomicFile(dest, mode=mode) as out:
            try:
                method = clone_or_copy(src, out.file.fileno(), size)
            except OSError as err:
                raise local_error(err, dest, "write") from err
            out.file.seek(size)
            out.commit(size)
            return method
    finally:
        os.close(src)


def clone_or_copy(src: int, dst: int, size: int) -> str:
    """Reflink ``src`` into the empty ``dst`` if the filesystem can, else copy ``size`` bytes."""
    if size > 0:
        try:
            fcntl.ioctl(dst, FICLONE, src)
            return "reflink"
        except OSError:
            pass
    copied = copy_range(src, dst, size)
    if copied != size:
        raise OSError(errno.EIO, f"source shrank while copying: {copied} of {size} bytes")
    return "copy"


def copy_range(src: int, dst: int, length: int) -> int:
    """Copy bytes [0, length) of ``src`` to the same offsets of ``dst``; returns bytes copied."""
    copied = 0
    kernel_copy = getattr(os, "copy_file_range", None)
    while kernel_copy is not None and copied < length:
        try:
            n = kernel_copy(src, dst, length - copied, copied, copied)
        except OSError as err:
            if err.errno not in _NO_KERNEL_COPY:
                raise
            break
        if n == 0:
            return copied
        copied += n
    while copied < length:
        block = os.pread(src, min(_CHUNK, length - copied), copied)
        if not block:
            break
        pwrite_all(dst, block, copied)
        copied += len(block)
    return copied
