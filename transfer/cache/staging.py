"""Staging a local file or bytes as a temp file beside a cache entry, hashed on the way; and
the SHA-256 check of an entry's bytes."""

from __future__ import annotations

import os

from transfer import _digests
from transfer.cache.layout import KeyPaths, remove_quietly

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Tuple

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
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        return _digests.sha256_hex(data)

    return _filled(fd, temp, write)


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
            view = memoryview(block)
            while view:
                view = view[os.write(dst, view):]


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

