"""Local files (``file://``, ``symlink://``, ``moveto://``): the filesystem as a backend.

Reads stream with ``sendfile`` where possible. Writes to local destinations are done by the
engine through :mod:`transfer.atomic` (temp name, verify, rename), so ``put`` here is only
used when a local path is itself the target of an upload-shaped call. Links and moves are
plain functions the engine calls for local-to-local transfers.
"""

from __future__ import annotations

import errno
import os
import shutil

from transfer.atomic import AtomicFile, local_error
from transfer.backends.base import ByteRange, ObjectInfo
from transfer.errors import InvalidInput, TransferError
from transfer.backends.opening import Opening
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Hashable, Iterator, List, Optional, Sequence

_PROBE_BYTES = 1024


def endpoint_key(url: Url, context: Opening) -> Hashable:
    return "local"


def open_backend(url: Url, context: Opening) -> "LocalBackend":
    return LocalBackend()


class LocalBackend:
    """Stateless; one instance serves every local path."""

    def stat(self, url: Url) -> ObjectInfo:
        try:
            st = os.stat(url.path)
        except OSError as err:
            raise local_error(err, url.path, "stat") from err
        return ObjectInfo(url, st.st_size, f"{st.st_mtime_ns}-{st.st_size}", st.st_mtime)

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        try:
            with open(url.path, "rb") as src:
                st = os.fstat(src.fileno())
                start, end = byte_range if byte_range else (0, st.st_size)
                count = _copy_region(src, sink, start, end - start)
        except IsADirectoryError as err:
            raise InvalidInput("source is a directory", url=url.path, operation="get") from err
        except OSError as err:
            raise local_error(err, url.path, "get") from err
        if count != end - start:
            raise TransferError(f"read {count} of {end - start} bytes (file changed?)", url=url.path,
                                operation="get")
        return ObjectInfo(url, st.st_size, f"{st.st_mtime_ns}-{st.st_size}", st.st_mtime)

    def put(self, path: str, url: Url) -> ObjectInfo:
        with AtomicFile(url.path) as out:
            with open(path, "rb") as src:
                size = _copy_region(src, out.file, 0, os.fstat(src.fileno()).st_size)
            out.commit(size)
        return ObjectInfo(url, size)

    def touch(self, url: Url) -> ObjectInfo:
        """``Touches``: ``os.utime`` to now."""
        try:
            os.utime(url.path)
        except OSError as err:
            raise local_error(err, url.path, "touch") from err
        return self.stat(url)

    def list(self, url: Url) -> Iterator[ObjectInfo]:
        for root, _dirs, files in os.walk(url.path):
            for name in files:
                child = url.with_path(os.path.join(root, name))
                yield self.stat(child)

    def delete(self, urls: Sequence[Url]) -> List[Optional[TransferError]]:
        return [_remove(url, recursive=False) for url in urls]

    def delete_tree(self, url: Url) -> Optional[TransferError]:
        """Remove a directory tree; ``DIR/*`` removes DIR's contents and keeps DIR. The root
        directory's tree is refused, as ``rm -r`` refuses it (``--preserve-root``): a cleanup
        URL whose variable is undefined (``file://$DIR/``) names ``/``."""
        contents = url.path.endswith("/*")
        tree = (url.path[:-2] or "/") if contents else url.path
        if tree and os.path.realpath(tree) == "/":
            return InvalidInput("refusing to remove the root directory's tree", url=url.path, operation="remove")
        if contents:
            directory = tree
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                return None
            except OSError as err:
                return local_error(err, directory, "remove")
            for name in names:
                failure = _remove(url.with_path(os.path.join(directory, name)), recursive=True)
                if failure is not None:
                    return failure
            return None
        return _remove(url, recursive=True)

    def make_dirs(self, url: Url) -> None:
        try:
            os.makedirs(url.path, exist_ok=True)
        except OSError as err:
            raise local_error(err, url.path, "mkdir") from err

    def close(self) -> None:
        return None


def verify_readable(path: str) -> os.stat_result:
    """Open ``path`` and read a little (lazy filesystems fail here); returns its status."""
    try:
        with open(path, "rb") as fh:
            fh.read(_PROBE_BYTES)
            return os.fstat(fh.fileno())
    except OSError as err:
        raise local_error(err, path, "read") from err


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def move(source: str, dest: str) -> int:
    """Rename ``source`` to ``dest`` (copying across filesystems); returns its size."""
    try:
        size = os.stat(source).st_size
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        shutil.move(source, dest)
    except OSError as err:
        raise local_error(err, source, "move") from err
    return size


def _copy_region(src: BinaryIO, sink: BinaryIO, offset: int, length: int) -> int:
    try:
        out_fd = sink.fileno()
    except (AttributeError, OSError, ValueError):
        out_fd = -1
    if out_fd >= 0 and length > 0:
        try:
            return _sendfile(src.fileno(), out_fd, offset, length)
        except OSError as err:
            if err.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
    src.seek(offset)
    left, total = length, 0
    while left > 0:
        block = src.read(min(left, 1 << 20))
        if not block:
            break
        sink.write(block)
        total += len(block)
        left -= len(block)
    return total


def _sendfile(in_fd: int, out_fd: int, offset: int, length: int) -> int:
    total = 0
    while total < length:
        sent = os.sendfile(out_fd, in_fd, offset + total, length - total)
        if sent == 0:
            break
        total += sent
    return total


def _remove(url: Url, *, recursive: bool) -> Optional[TransferError]:
    path = url.path
    try:
        if recursive and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return InvalidInput("is a directory (use a recursive remove)", url=path, operation="remove")
    except OSError as err:
        return local_error(err, path, "remove")
    return None

