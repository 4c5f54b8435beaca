"""Atomic local outputs: write to a hidden temp name beside the target, verify, rename.

A job never sees a partial file under the final name: until :meth:`AtomicFile.commit`
succeeds the data lives in ``.<name>.<pid>.<n>.part``, which is removed on any failure; a link
is made as ``.<name>.<pid>.<n>.link`` and renamed over the target. The temp names alive in this
process are tracked, so that a signal handler can remove them all (:func:`remove_temp_files`)
before the process exits without unwinding its threads.
"""

from __future__ import annotations

import _thread
import errno
import itertools
import os

from transfer.errors import AuthError, InvalidInput, LocalIOError, NoSpace, NotFound, TransferError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Callable, Optional, Set, Tuple

_counter = itertools.count()  # unique temp names within this process
_PID = [os.getpid()]  # getpid() is a system call: asked once, and again in a forked child
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


class _TempNames:
    """Temp files this process has open right now (process-wide, like the files themselves)."""

    def __init__(self) -> None:
        # Reentrant: a signal handler that removes the temp files may interrupt the very
        # thread that holds it (the engine's own thread writes files too).
        self._lock = _thread.RLock()
        self._names: Set[str] = set()

    def add(self, path: str) -> None:
        with self._lock:
            self._names.add(path)

    def discard(self, path: str) -> None:
        with self._lock:
            self._names.discard(path)

    def remove_all(self) -> int:
        with self._lock:
            names, self._names = self._names, set()
        removed = 0
        for path in names:
            try:
                os.unlink(path)
                removed += 1
            except OSError:
                pass
        return removed


_LIVE = _TempNames()


def track_temp(path: str) -> None:
    """Count ``path`` (a temp file another module creates, e.g. a cache entry being filled)
    among those :func:`remove_temp_files` removes; :func:`untrack_temp` once it is gone."""
    _LIVE.add(path)


def untrack_temp(path: str) -> None:
    _LIVE.discard(path)


def remove_temp_files() -> int:
    """Unlink every temp file of this process not yet committed; returns how many. For signal
    handlers: the writers' threads may still hold them open, but nothing is left on disk."""
    return _LIVE.remove_all()


_SHORT_NAME = 50  # characters: at most 200 bytes of UTF-8, nothing to measure


def _hidden(name: str) -> str:
    """``name`` as the middle of a temp name ``.NAME.<pid>.<n>.part``: cut to 200 bytes when
    longer, so that the temp name fits a file name (255 bytes) whenever ``name`` does."""
    if len(name) <= _SHORT_NAME:
        return name
    encoded = name.encode("utf-8", "surrogateescape")
    return name if len(encoded) <= 200 else encoded[:200].decode("utf-8", "ignore")


_NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP)  # link impossible here: copy
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_READ_WRITE = (_FLAGS & ~os.O_WRONLY) | os.O_RDWR  # parallel downloads read parts back to check them


def local_error(err: OSError, path: str, operation: str) -> TransferError:
    """Translate an OSError on a local path into the exception tree."""
    text = err.strerror or str(err)
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return NoSpace(f"no space left: {text}", url=path, operation=operation)
    if isinstance(err, FileNotFoundError):
        return NotFound("no such file or directory", url=path, operation=operation)
    if isinstance(err, PermissionError):
        return AuthError(f"permission denied: {text}", url=path, operation=operation)
    if isinstance(err, (IsADirectoryError, NotADirectoryError)):
        return InvalidInput(text, url=path, operation=operation)
    return LocalIOError(text, url=path, operation=operation)


class AtomicFile:
    """``with AtomicFile(path) as out: out.file.write(...); out.commit(size)``.

    ``commit(expected_size)`` checks the byte count, then renames into place. Leaving the
    block without committing (or any error) deletes the temp file. Parent directories are
    created as needed. ``fd`` is the temp file's descriptor, for writers that ``pwrite`` at
    offsets (then :meth:`commit_written`); ``file`` wraps it in an unbuffered file object,
    made on first use (most small downloads never need one). ``mode``: the file's permission
    bits before the umask (``os.open``'s).
    """

    def __init__(self, path: str, make_parents: bool = True, mode: int = 0o666) -> None:
        self.path = path
        self._mode = mode
        slash = path.rfind("/") + 1
        name = path[slash:]
        if not name:
            raise InvalidInput("destination is a directory path", url=path, operation="write")
        self._temp = f"{path[:slash]}.{_hidden(name)}.{_PID[0]}.{next(_counter)}.part"  # os.path.join's, cheaper
        self._make_parents = make_parents
        self.fd = -1
        self._file: Optional[BinaryIO] = None
        self._committed = False

    @property
    def file(self) -> BinaryIO:
        if self._file is None:
            self._file = os.fdopen(self.fd, "wb", buffering=0)
        return self._file

    def __enter__(self) -> "AtomicFile":
        try:
            self.fd = self._open()
        except OSError as err:
            raise local_error(err, self.path, "write") from err
        return self

    def _open(self) -> int:
        _LIVE.add(self._temp)
        try:
            return os.open(self._temp, _READ_WRITE, self._mode)
        except FileNotFoundError:
            if not self._make_parents:
                raise
        os.makedirs(os.path.dirname(self._temp) or ".", exist_ok=True)
        return os.open(self._temp, _READ_WRITE, self._mode)

    def _close(self) -> None:
        fd, self.fd = self.fd, -1
        if self._file is not None:
            self._file.close()
        elif fd >= 0:
            os.close(fd)

    def commit(self, expected_size: Optional[int] = None) -> int:
        """Check the size (the file position), rename into place, and return the number of
        bytes written."""
        try:
            size = self.file.tell()
        except OSError as err:
            raise local_error(err, self.path, "write") from err
        if expected_size is not None and size != expected_size:
            self._close()
            raise LocalIOError(f"wrote {size} bytes, expected {expected_size}", url=self.path, operation="write")
        return self.commit_written(size)

    def commit_written(self, size: int) -> int:
        """Rename into place a file the caller wrote ``size`` bytes of by ``pwrite`` at
        offsets (and counted); returns ``size``."""
        try:
            self._close()
            os.replace(self._temp, self.path)
        except OSError as err:
            raise local_error(err, self.path, "write") from err
        _LIVE.discard(self._temp)
        self._committed = True
        return size

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._committed:
            return
        try:
            self._close()
        except OSError:
            pass
        try:
            os.unlink(self._temp)
        except OSError:
            pass
        _LIVE.discard(self._temp)
        if isinstance(exc, OSError) and not isinstance(exc, TransferError):
            raise local_error(exc, self.path, "write") from exc


def write_all(fd: int, data: "bytes | bytearray | memoryview") -> None:
    """``os.write`` until all of ``data`` is written (a write may take less). Raises OSError."""
    written = os.write(fd, data)  # one call for nearly every write: no memoryview
    if written < len(data):
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view):]


def pwrite_all(fd: int, data: "bytes | bytearray | memoryview", offset: int) -> None:
    """``os.pwrite`` until all of ``data`` is written at ``offset`` onwards (a write may take
    less); the file position is left alone. Raises OSError."""
    written = os.pwrite(fd, data, offset)  # one call for nearly every write: no memoryview
    if written < len(data):
        view = memoryview(data)
        while written < len(view):
            written += os.pwrite(fd, view[written:], offset + written)


def atomic_write_bytes(path: str, data: bytes, mode: int = 0o666) -> int:
    """Write ``data`` to ``path`` atomically (temp name beside it, then rename); returns its size.
    ``mode``: the file's permission bits before the umask (``os.open``'s).

    The lean path for many small in-memory files (bundle members, bodies read ahead): four
    system calls each."""
    slash = path.rfind("/") + 1
    temp = f"{path[:slash]}.{_hidden(path[slash:])}.{_PID[0]}.{next(_counter)}.part"  # os.path.join's, cheaper
    _LIVE.add(temp)
    try:
        try:
            fd = os.open(temp, _FLAGS, mode)
        except FileNotFoundError:
            os.makedirs(path[:slash].rstrip("/") or ("/" if slash else "."), exist_ok=True)
            fd = os.open(temp, _FLAGS, mode)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except OSError as err:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise local_error(err, path, "write") from err
    except BaseException:  # KeyboardInterrupt in a library caller's main thread: no .part stays
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    finally:
        _LIVE.discard(temp)
    return len(data)


def atomic_symlink(target: str, link_path: str) -> None:
    """Point ``link_path`` at ``target``, replacing whatever is there, atomically."""
    _atomic_link(os.symlink, target, link_path, "symlink")


def atomic_hardlink(target: str, link_path: str) -> bool:
    """Hard-link ``link_path`` to ``target``; False when the filesystem cannot (e.g. EXDEV)."""
    try:
        os.link(target, link_path)  # a new name is whole at once: no temp name, no rename
        return True
    except OSError:
        pass  # the name exists (replace it), its directory is missing, or links fail: as below
    try:
        _atomic_link(os.link, target, link_path, "link")
    except TransferError as err:
        if isinstance(err.__cause__, OSError) and err.__cause__.errno in _NO_LINK:
            return False
        raise
    return True


def _atomic_link(make_link: Callable[[str, str], None], target: str, link_path: str,
                 operation: str) -> None:
    directory, name = os.path.split(link_path)
    temp = os.path.join(directory, f".{_hidden(name)}.{_PID[0]}.{next(_counter)}.link")
    _LIVE.add(temp)  # a signal handler removes it, as it removes .part files
    try:
        try:
            make_link(target, temp)
        except FileNotFoundError:
            # The parent may be missing (or being created by another thread right now): make
            # it and try once more; a second miss means the target itself is missing.
            os.makedirs(directory or ".", exist_ok=True)
            make_link(target, temp)
        os.replace(temp, link_path)
    except OSError as err:
        raise local_error(err, link_path, operation) from err
    finally:
        try:  # gone once renamed, but rename() does nothing when both names are links to one inode
            os.unlink(temp)
        except OSError:
            pass
        _LIVE.discard(temp)


def scratch_file(prefix: str, suffix: str = "") -> "Tuple[int, str]":
    """``tempfile.mkstemp(prefix=prefix, suffix=suffix)``: a new 0600 file in the temp directory,
    opened read-write; returns (fd, path). The directory is ``$TMPDIR``, ``$TEMP``, ``$TMP`` or
    ``/tmp``, the first set; when that one cannot take the file, ``tempfile`` itself decides (it
    imports ``shutil`` and ``random``, milliseconds a job step's bundle upload need not pay)."""
    directory = os.environ.get("TMPDIR") or os.environ.get("TEMP") or os.environ.get("TMP") or "/tmp"
    for _ in range(8):
        path = os.path.join(os.path.abspath(directory), f"{prefix}{os.urandom(6).hex()}{suffix}")
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), path
        except FileExistsError:
            continue
        except OSError:
            break
    import tempfile
    return tempfile.mkstemp(prefix=prefix, suffix=suffix)

