"""Staging a local file or bytes as a temp file beside a cache entry, hashed on the way; and
the SHA-256 check of an entry's bytes."""

from __future__ import annotations

import os

from transfer import _digests
from transfer.atomic import atomic_hardlink, untrack_temp, write_all
from transfer.cache.layout import KeyPaths, Layout, remove_quietly

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional, Tuple

_CHUNK = 1 << 20
_RDONLY = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)

if TYPE_CHECKING:
    Staged = Tuple[int, str, str]  # (open fd, temp path, sha256 hex)
else:
    Staged = object  # the alias above is for type checkers; typing is not imported at run time


def stage_file(paths: KeyPaths, path: str, link: bool) -> Staged:
    """``path`` as a temp file: a hard link when ``link``, the file is this user's and on the
    cache's filesystem, else a copy. Raises OSError."""
    if link and os.stat(path).st_uid == os.geteuid():
        temp = paths.new_temp()
        try:
            os.link(path, temp)
        except OSError:
            pass  # another filesystem, or links not allowed: copy instead
        else:
            return _opened(temp)
    fd, temp = paths.open_temp()
    return _filled(fd, temp, lambda: _copy_hashing(path, fd))


def stage_bytes(paths: KeyPaths, data: bytes) -> Staged:
    """``data`` as a temp file. Raises OSError."""
    fd, temp = paths.open_temp()

    def write() -> str:
        write_all(fd, data)
        return _digests.sha256_hex(data)

    return _filled(fd, temp, write)


def stage_linked(layout: Layout, data: bytes, dest: str) -> Optional[str]:
    """Write once and link: ``data`` into a new file of the cache's ``incoming/`` directory,
    created read-only as an entry is (0444 less the umask), hard-linked at ``dest`` (replacing a
    file there). The temp path, which a later insert renames into the entry
    (:func:`transfer.cache.members.insert_members` ``temps``); None, with no file left in the
    cache nor at ``dest``, when the link cannot be made (another filesystem). Taken without any
    lock and in no key's shard: the job's file costs one file made, as without the cache (no
    shard directory made, no ``fchmod``). Another process's cleaning may remove a staged file
    older than :data:`~transfer.cache.layout.INCOMING_GRACE_S`, which costs only the entry (the
    insert then writes ``data``). Raises OSError of the cache's side, and the TransferError of
    writing ``dest``."""
    fd, temp = layout.open_staged()
    try:
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        linked = atomic_hardlink(temp, dest)
    except BaseException:
        remove_quietly(temp)
        raise
    if not linked:
        remove_quietly(temp)
        return None
    untrack_temp(temp)  # the insert's to publish, not a signal handler's to remove (gc cleans a stray one)
    return temp


def hash_fd(fd: int) -> str:
    """SHA-256 of the whole file open as ``fd`` (read with pread: the offset is untouched)."""
    digest = _digests.new("sha256", os.fstat(fd).st_size)
    offset = 0
    while True:
        block = os.pread(fd, _CHUNK, offset)
        if not block:
            return digest.hexdigest()
        digest.update(block)
        offset += len(block)


def same_bytes(path: str, sha256: str) -> bool:
    """True if the file at ``path`` hashes to ``sha256`` (False if it cannot be read)."""
    try:
        fd = os.open(path, _RDONLY)
    except OSError:
        return False
    try:
        return hash_fd(fd) == sha256
    except OSError:
        return False
    finally:
        os.close(fd)


def _copy_hashing(path: str, dst: int) -> str:
    digest = _digests.Stream()
    with open(path, "rb", buffering=0) as src:
        while True:
            block = src.read(_CHUNK)
            if not block:
                return digest.hexdigest()
            digest.update(block)
            write_all(dst, block)


def _opened(temp: str) -> Staged:
    try:
        fd = os.open(temp, _RDONLY)
    except BaseException:
        remove_quietly(temp)
        raise
    return _filled(fd, temp, lambda: hash_fd(fd))


def _filled(fd: int, temp: str, fill: Callable[[], str]) -> Staged:
    try:
        return fd, temp, fill()
    except BaseException:
        os.close(fd)
        remove_quietly(temp)
        raise

