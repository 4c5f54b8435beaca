"""How the cache daemon opens a user's cache files: never through a link, never anything
but a regular file of the cache's owner, never more than it expects to read.

A user controls every name under her cache directory, so each one may be a symbolic link
(to ``/dev/zero``, to another user's file), a FIFO (an ``open`` that never returns), a
device, a hard link to someone else's file, or a file far larger than its metadata says.
:func:`open_entry_file` walks ``objects/<hh>/<name>`` from an open descriptor of the cache
root one component at a time with ``O_NOFOLLOW`` (and ``O_NONBLOCK``, so a FIFO cannot
block the open), then checks with ``fstat`` that it got a regular file (or directory)
owned by the root's owner. :func:`read_small` reads at most a bound. The flags, the
regular-file check and the bounded read are :mod:`transfer.named_files`'s, the one way
every file someone else names is read; the walk below a directory descriptor is this
module's. The daemon also runs
as the cache's owner (``serve`` drops to it), so these checks are a second wall.
"""

from __future__ import annotations

import os
from typing import FrozenSet, Optional

from transfer.cache.layout import OBJECTS, Meta, parse_meta
from transfer.named_files import FLAGS, NO_LINKS, open_regular, read_fd

__all__ = ["MAX_META_BYTES", "open_entry_file", "open_root", "read_grants", "read_meta_fd", "read_small"]

MAX_META_BYTES = 64 * 1024
_FLAGS = FLAGS | os.O_NOFOLLOW


def open_root(root: str, uid: Optional[int] = None) -> Optional[int]:
    """A descriptor of the cache directory ``root`` (itself not a link; owned by ``uid``
    when given), or None."""
    try:
        fd = os.open(root, _FLAGS | os.O_DIRECTORY)
    except OSError:
        return None
    st = os.fstat(fd)
    if uid is not None and st.st_uid != uid:
        os.close(fd)
        return None
    return fd


def open_entry_file(root_fd: int, digest: str, suffix: str = "") -> Optional[int]:
    """``objects/<digest[:2]>/<digest><suffix>`` below ``root_fd``: a descriptor of a
    regular file owned by the root's owner, or None (missing, a link, a FIFO, a device,
    someone else's file)."""
    owner = os.fstat(root_fd).st_uid
    fd = root_fd
    opened = []
    try:
        for name in (OBJECTS, digest[:2]):
            fd = os.open(name, _FLAGS | os.O_DIRECTORY, dir_fd=fd)
            opened.append(fd)
            if os.fstat(fd).st_uid != owner:
                return None
        leaf, st = open_regular(digest + suffix, NO_LINKS, dir_fd=fd)
    except OSError:
        return None
    finally:
        for d in opened:
            os.close(d)
    if st.st_uid != owner:
        os.close(leaf)
        return None
    return leaf


def read_small(fd: int, limit: int) -> Optional[bytes]:
    """The whole file behind ``fd`` if it holds at most ``limit`` bytes, else None (closes
    ``fd``). Read as :func:`transfer.named_files.read_fd` reads every file others name."""
    try:
        if os.fstat(fd).st_size > limit:
            return None
        return read_fd(fd, limit, "<cache file>")
    except OSError:
        return None
    finally:
        os.close(fd)


def read_meta_fd(fd: int) -> Optional[Meta]:
    """An entry's metadata from its open ``.meta`` file (closed here); None when too large
    or malformed."""
    data = read_small(fd, MAX_META_BYTES)
    return parse_meta(data) if data is not None else None


def read_grants(fd: int, limit: int) -> FrozenSet[str]:
    """The capabilities in an entry's open ``.peers`` file (closed here), at most ``limit``
    bytes of it; empty when larger or unreadable."""
    data = read_small(fd, limit)
    if data is None:
        return frozenset()
    return frozenset(line for line in data.decode("ascii", "replace").split("\n") if len(line) == 64)
