"""The file-like object a download writes into on a cache miss.

It writes to the entry's temp file in the cache and hashes the bytes on the way. If the
cache's filesystem fails a write (ENOSPC, EDQUOT, EIO, ...), it switches to an
:class:`~transfer.atomic.AtomicFile` beside the job's destination: the bytes written so
far are copied over, the cache temp file is deleted, and the download carries on into the
destination, uncached - without a second request and without failing the job. Errors
writing the destination itself propagate as :mod:`transfer.errors` exceptions: those are
the job's own.

``fileno()`` is deliberately unsupported, so a backend that would ``sendfile`` into its
sink calls ``write`` instead and every byte passes through the hash.
"""

from __future__ import annotations

import errno
import io
import os

from transfer import _digests
from transfer.atomic import AtomicFile, local_error, untrack_temp, write_all
from transfer.cache.layout import remove_quietly
from transfer.cache.materialise import copy_range
from transfer.lean import Buffer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional



class CacheSink(io.RawIOBase):
    """Write-only sink over the cache temp file ``temp``, open as ``fd`` (owned by the sink);
    ``mode``: the permission bits (before the umask) of a file the sink makes at ``dest_path``.

    After the download: ``fallback`` is the committed-or-not AtomicFile when the cache
    failed, else the temp file holds ``written`` bytes hashing to ``hexdigest()``.
    Always finish with :meth:`abort` (idempotent, a no-op for what was committed/renamed).
    """

    def __init__(self, fd: int, temp: str, dest_path: str, mode: int = 0o666) -> None:
        super().__init__()
        self._fd: Optional[int] = fd
        self.temp = temp
        self._dest_path = dest_path
        self._mode = mode  # the destination's, before the umask, where the download moves there
        self.fallback: Optional[AtomicFile] = None
        self.written = 0
        self._hash = _digests.Stream()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a cache sink has no file descriptor")

    def write(self, data: Buffer) -> int:  # type: ignore[override]
        if self.fallback is None:
            try:
                write_all(self.cache_fd(), data)
            except OSError:
                self._switch()
            else:
                self._hash.update(data)
                self.written += len(data)
                return len(data)
        assert self.fallback is not None
        try:
            write_all(self.fallback.file.fileno(), data)
        except OSError as err:
            raise local_error(err, self._dest_path, "write") from err
        self.written += len(data)
        return len(data)

    def reset(self) -> None:
        """Discard everything written so far (a peer's bytes that failed verification)."""
        self.written = 0
        self._hash = _digests.Stream()
        if self.fallback is None:
            try:
                os.lseek(self.cache_fd(), 0, os.SEEK_SET)
                os.ftruncate(self.cache_fd(), 0)
                return
            except OSError:
                self._switch()  # moves the (now zero) bytes written so far
        assert self.fallback is not None
        try:
            self.fallback.file.seek(0)
            self.fallback.file.truncate()
        except OSError as err:
            raise local_error(err, self._dest_path, "write") from err

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def cache_fd(self) -> int:
        """The cache temp file's descriptor (valid until a switch or abort)."""
        if self._fd is None:
            raise OSError(errno.EBADF, "cache temp file already closed")
        return self._fd

    def _switch(self) -> None:
        """Move the bytes written so far to an AtomicFile beside the destination."""
        fallback = AtomicFile(self._dest_path, mode=self._mode).__enter__()
        self.fallback = fallback
        try:
            copied = copy_range(self.cache_fd(), fallback.file.fileno(), self.written)
            if copied != self.written:
                raise OSError(errno.EIO, f"cache temp file holds {copied} of {self.written} bytes")
            fallback.file.seek(copied)
        except OSError as err:
            raise local_error(err, self._dest_path, "write") from err
        self._discard_temp()

    def published(self) -> None:
        """The temp file was renamed into place (it is the entry now): close it, remove nothing."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            untrack_temp(self.temp)

    def _discard_temp(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            remove_quietly(self.temp)

    def abort(self) -> None:
        """Close and delete the cache temp file and any uncommitted fallback file."""
        self._discard_temp()
        if self.fallback is not None:
            self.fallback.__exit__(None, None, None)

