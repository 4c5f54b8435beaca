"""Files on an SSH server (``scp://`` and ``sftp://``, the submit-host staging mode) over SFTP.

URLs as Pegasus writes them: ``scp://USER@HOST[:PORT]/ABS/PATH``, also
``scp://USER@HOST:/ABS/PATH`` (Url.host then ends in ``:``); ``sftp://`` alike. Keys and
host-key policy: see :mod:`transfer.backends._ssh`.

One backend per (user, host, port, key file) holds ONE SSH connection (one handshake per
session) and moves files on a small pool of SFTP channels of it, at most
``settings.threads``. A dropped connection fails the calls in flight with TransientError
(the engine retries them) and the next call reconnects.

* ``get`` streams into the sink and checks the byte count against the size the server
  reports for the open file (SFTP has no checksums).
* ``put`` writes ``.NAME.PID.TOKEN.N.part`` beside the target (creating missing parent
  directories; with the source's permission bits, owner-writable), checks the stored size,
  then renames it into place with ``posix-rename@openssh.com`` (remove + rename on servers
  without it). A failed upload removes its temp file; if the connection died, the removal
  happens after reconnecting. On a signal (``TempUploads.discard_in_flight``) the temp files
  of uploads in flight are removed on a channel of their own, within the handler's budget.
* ``delete`` removes files (missing ones succeed); ``delete_tree`` removes a directory
  tree (``DIR/*``: the contents only); ``make_dirs`` is ``mkdir -p``. All on the same
  connection.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import posixpath
import secrets
import socket
import stat
import threading
from typing import BinaryIO, Callable, Hashable, Iterator, List, Mapping, Optional, Sequence, Set, TypeVar

import paramiko
import paramiko.sftp

from transfer.atomic import local_error
from transfer.backends import _ssh
from transfer.backends.base import ByteRange, ObjectInfo
from transfer.errors import ChecksumMismatch, InvalidInput, NotFound, TransferError
from transfer.backends.opening import Opening
from transfer.config import Settings
from transfer.http.pool import PoolStats
from transfer.urls import Url

T = TypeVar("T")
_SFTP_ERRORS = (OSError, EOFError, paramiko.SSHException, paramiko.SFTPError)
_ONE_READ = 32768          # paramiko's largest single SFTP read
_BLOCK = 1 << 20           # bytes handed to the sink at a time
_WINDOW = 8 << 20          # bytes of reads in flight for one large download


def endpoint_key(url: Url, context: Opening) -> Hashable:
    ep = _ssh.endpoint_for(url, context.env)
    return (ep.user, ep.host, ep.port, ep.key_file)


def open_backend(url: Url, context: Opening) -> "SftpBackend":
    return SftpBackend(_ssh.endpoint_for(url, context.env), context.env, context.settings, context.stats)


class SftpBackend:
    """One SSH endpoint. Thread-safe; connects on first use and after a dropped connection."""

    def __init__(self, endpoint: _ssh.SshEndpoint, env: Mapping[str, str], settings: Settings,
                 stats: PoolStats) -> None:
        self.endpoint = endpoint
        self.handshakes = 0
        self._env, self._settings, self._stats = env, settings, stats
        self._lock = threading.Lock()
        self._connection_now: Optional[_ssh.Connection] = None
        self._orphans: List[str] = []
        self._posix_rename = True
        self._temp_ids = itertools.count(1)
        self._token = secrets.token_hex(3)
        self._temps: Set[str] = set()  # temp files of uploads in flight

    # -- plumbing -----------------------------------------------------------------------

    def _connection(self) -> _ssh.Connection:
        """The live connection, opening one (exactly one, whatever the thread count) if needed."""
        with self._lock:
            current = self._connection_now
            if current is not None and current.alive:
                return current
            self._connection_now = None
            if current is not None:
                current.close()
            settings = self._settings
            current = _ssh.connect(self.endpoint, self._env, connect_timeout=settings.connect_timeout,
                                   read_timeout=settings.read_timeout, known_hosts=settings.ssh_known_hosts,
                                   channels=settings.threads)
            self.handshakes += 1
            self._stats.count(connections=1)
            self._connection_now = current
            orphans, self._orphans = self._orphans, []
        if orphans:
            self._remove_orphans(current, orphans)
        return current

    def _run(self, url: Url, operation: str, action: Callable[[paramiko.SFTPClient], T]) -> T:
        """``action`` on one channel; paramiko and socket errors leave as TransferErrors."""
        connection = self._connection()
        try:
            client = connection.take()
        except _SFTP_ERRORS as err:
            raise _ssh.translate(err, str(url), operation, False) from err
        healthy = False
        try:
            result = action(client)
            healthy = True
            return result
        except TransferError:
            healthy = _ssh.channel_alive(client)
            raise
        except _SFTP_ERRORS as err:
            healthy = not isinstance(err, socket.timeout) and _ssh.channel_alive(client)
            raise _ssh.translate(err, str(url), operation, healthy) from err
        finally:
            self._stats.count(requests=1)
            connection.give(client, healthy)

    def _remove_orphans(self, connection: _ssh.Connection, paths: List[str]) -> None:
        client = connection.take()
        healthy = True
        try:
            for path in paths:
                try:
                    client.remove(path)
                except OSError:
                    pass
        except _SFTP_ERRORS:
            healthy = False
        finally:
            connection.give(client, healthy and _ssh.channel_alive(client))

    # -- Backend ------------------------------------------------------------------------

    def stat(self, url: Url) -> ObjectInfo:
        path = _path_of(url, "stat")
        return _info(url, self._run(url, "stat", lambda client: client.stat(path)))

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        path = _path_of(url, "get")

        def action(client: paramiko.SFTPClient) -> ObjectInfo:
            with client.open(path, "rb") as remote:
                attrs = remote.stat()
                if stat.S_ISDIR(attrs.st_mode or 0):
                    raise InvalidInput("source is a directory", url=str(url), operation="get")
                size = attrs.st_size or 0
                start, end = byte_range if byte_range else (0, size)
                if end > size:
                    raise InvalidInput(f"range ends at {end}, beyond the {size}-byte file", url=str(url),
                                       operation="get")
                count = _receive(remote, sink, start, end - start)
            if count != end - start:
                raise ChecksumMismatch(f"received {count} bytes, expected {end - start}", url=str(url),
                                       operation="get")
            return _info(url, attrs)

        return self._run(url, "get", action)

    def put(self, path: str, url: Url) -> ObjectInfo:
        target = _path_of(url, "put")
        folder, name = posixpath.split(target)
        temp = posixpath.join(folder, f".{name}.{os.getpid()}.{self._token}.{next(self._temp_ids)}.part")
        try:
            source = open(path, "rb")
        except OSError as err:
            raise local_error(err, path, "put") from err
        with source:
            st = os.fstat(source.fileno())
            size, mode = st.st_size, st.st_mode

            def action(client: paramiko.SFTPClient) -> None:
                remote = _create(client, temp, folder, mode)
                try:
                    with remote:
                        remote.set_pipelined(True)
                        _send(source, remote, path)
                    stored = client.stat(temp).st_size
                    if stored != size:
                        raise ChecksumMismatch(f"server stored {stored} of {size} bytes", url=str(url),
                                               operation="put")
                    self._rename(client, temp, target)
                except BaseException:
                    self._discard(client, temp)
                    raise

            with self._lock:
                self._temps.add(temp)  # registered before it exists: a signal may come any time
            try:
                self._run(url, "put", action)
            finally:
                with self._lock:
                    self._temps.discard(temp)
        return ObjectInfo(url, size)

    def list(self, url: Url) -> Iterator[ObjectInfo]:
        root = _path_of(url, "list").rstrip("/") or "/"
        pending = [root]
        while pending:
            folder = pending.pop()
            try:
                entries = self._run(url, "list", lambda client: client.listdir_attr(folder))
            except NotFound:
                continue
            for entry in sorted(entries, key=lambda e: e.filename):
                child = posixpath.join(folder, entry.filename)
                mode = entry.st_mode or 0
                if stat.S_ISDIR(mode):
                    pending.append(child)
                elif stat.S_ISREG(mode):
                    yield _info(url.with_path(child), entry)
                elif stat.S_ISLNK(mode):
                    yield from self._resolved_link(url.with_path(child))

    def _resolved_link(self, url: Url) -> Iterator[ObjectInfo]:
        """A symlink to a file lists as that file; links to directories are not followed."""
        try:
            attrs = self._run(url, "list", lambda client: client.stat(url.path))
        except NotFound:
            return
        if stat.S_ISREG(attrs.st_mode or 0):
            yield _info(url, attrs)

    def delete(self, urls: Sequence[Url]) -> List[Optional[TransferError]]:
        results: List[Optional[TransferError]] = []
        for url in urls:
            try:
                path = _path_of(url, "remove")
                self._run(url, "remove", lambda client: _remove_file(client, path, url))
                results.append(None)
            except NotFound:
                results.append(None)
            except TransferError as err:
                results.append(err)
        return results

    def delete_tree(self, url: Url) -> Optional[TransferError]:
        """Remove a file or a whole directory tree; ``DIR/*`` empties DIR. Missing = success."""
        path = _path_of(url, "remove")
        keep_root = path.endswith("/*")
        root = path[:-2] if keep_root else path.rstrip("/") or "/"
        try:
            self._run(url, "remove", lambda client: _remove_tree(client, root, keep_root))
        except NotFound:
            return None
        except TransferError as err:
            return err
        return None

    def make_dirs(self, url: Url) -> None:
        path = _path_of(url, "mkdir").rstrip("/") or "/"
        self._run(url, "mkdir", lambda client: _mkdir_p(client, path))

    def close(self) -> None:
        with self._lock:
            current, self._connection_now = self._connection_now, None
        if current is not None:
            current.close()

    def discard_in_flight(self, seconds: float) -> None:
        """Remove the temp files of uploads in flight on a new channel, on a thread that is
        given up after ``seconds`` (the interrupted thread may hold a paramiko lock)."""
        with self._lock:
            temps, connection = sorted(self._temps), self._connection_now
        if not temps or connection is None or not connection.alive:
            return

        def remove() -> None:
            with contextlib.suppress(*_SFTP_ERRORS):
                client = paramiko.SFTPClient.from_transport(connection.transport)
                if client is None:
                    return
                with client:
                    for temp in temps:
                        with contextlib.suppress(*_SFTP_ERRORS):
                            client.remove(temp)

        worker = threading.Thread(target=remove, name="sftp-discard", daemon=True)
        worker.start()
        worker.join(seconds)

    # -- put helpers --------------------------------------------------------------------

    def _rename(self, client: paramiko.SFTPClient, temp: str, target: str) -> None:
        if self._posix_rename:
            try:
                client.posix_rename(temp, target)
                return
            except OSError as err:
                if err.errno is not None or not _ssh.channel_alive(client):
                    raise
        try:  # no posix-rename@openssh.com: plain SFTP rename refuses to replace a file
            client.rename(temp, target)
        except OSError as err:
            if err.errno is not None or not _ssh.channel_alive(client):
                raise
            _ignore_missing(lambda: client.remove(target))
            client.rename(temp, target)
        self._posix_rename = False

    def _discard(self, client: paramiko.SFTPClient, temp: str) -> None:
        """Delete a failed upload's temp file now, or after reconnecting if the link is gone."""
        if _ssh.channel_alive(client):
            try:
                client.remove(temp)
                return
            except _SFTP_ERRORS:
                pass
        with self._lock:
            self._orphans.append(temp)


# --------------------------------------------------------------------------- helpers


def _path_of(url: Url, operation: str) -> str:
    if not url.path.startswith("/"):
        raise InvalidInput("SSH URL needs an absolute path", url=str(url), operation=operation)
    return url.path


def _info(url: Url, attrs: paramiko.SFTPAttributes) -> ObjectInfo:
    size, mtime = attrs.st_size or 0, attrs.st_mtime
    return ObjectInfo(url, size, f"{mtime}-{size}", float(mtime) if mtime is not None else None)


def _create(client: paramiko.SFTPClient, temp: str, folder: str, mode: int) -> paramiko.SFTPFile:
    try:
        return _open_new(client, temp, mode)
    except OSError as err:
        if err.errno != errno.ENOENT or not folder:  # ENOENT here: the directory is missing
            raise
    _mkdir_p(client, folder)
    return _open_new(client, temp, mode)


def _open_new(client: paramiko.SFTPClient, path: str, mode: int) -> paramiko.SFTPFile:
    """``client.open(path, "wb")`` that sends the source's permission bits with the open, as
    OpenSSH's scp and sftp do (the server applies its umask to a new file). paramiko's ``open``
    sends none: the file would be 0666 less the umask, an executable would lose its x bits and
    a private file would become readable by all. The owner may always write the new file: a
    read-only local copy is most often the node cache's entry (0444) a two-hop copy linked,
    where pegasus-transfer makes its two-hop temp file 0644. (paramiko 5.1's own ``open``, with
    attributes.)"""
    attrs = paramiko.SFTPAttributes()
    attrs.st_mode = (stat.S_IMODE(mode) & 0o777) | stat.S_IWUSR
    flags = paramiko.sftp.SFTP_FLAG_WRITE | paramiko.sftp.SFTP_FLAG_CREATE | paramiko.sftp.SFTP_FLAG_TRUNC
    kind, msg = client._request(paramiko.sftp.CMD_OPEN, path, flags, attrs)  # type: ignore[attr-defined]
    if kind != paramiko.sftp.CMD_HANDLE:
        raise paramiko.SFTPError("Expected handle")
    return paramiko.SFTPFile(client, msg.get_binary(), "wb")


def _send(source: BinaryIO, remote: paramiko.SFTPFile, path: str) -> None:
    while True:
        try:
            block = source.read(_BLOCK)
        except OSError as err:
            raise local_error(err, path, "put") from err
        if not block:
            return
        remote.write(block)


def _receive(remote: paramiko.SFTPFile, sink: BinaryIO, start: int, length: int) -> int:
    """Copy ``length`` bytes from ``start`` to the sink; returns the count actually read."""
    if length <= 0:
        return 0
    if length <= _ONE_READ:
        remote.seek(start)
        return _deliver(sink, remote.read(length))
    total = 0
    end = start + length
    for window in range(start, end, _WINDOW):
        stop = min(window + _WINDOW, end)
        blocks = [(offset, min(_BLOCK, stop - offset)) for offset in range(window, stop, _BLOCK)]
        for (_, wanted), data in zip(blocks, remote.readv(blocks)):
            total += _deliver(sink, data)
            if len(data) < wanted:
                return total
    return total


def _deliver(sink: BinaryIO, data: bytes) -> int:
    try:
        sink.write(data)
    except OSError as err:
        raise local_error(err, str(getattr(sink, "name", "<download>")), "get") from err
    return len(data)


def _mkdir_p(client: paramiko.SFTPClient, path: str) -> None:
    """``mkdir -p``: one stat when the directory exists; safe against concurrent creators."""
    if _is_dir(client, path):
        return
    parent = posixpath.dirname(path)
    if parent and parent != path:
        _mkdir_p(client, parent)
    try:
        client.mkdir(path)
    except OSError:
        if not _is_dir(client, path):
            raise


def _is_dir(client: paramiko.SFTPClient, path: str) -> bool:
    try:
        return stat.S_ISDIR(client.stat(path).st_mode or 0)
    except OSError as err:
        if err.errno == errno.ENOENT:
            return False
        raise


def _remove_file(client: paramiko.SFTPClient, path: str, url: Url) -> None:
    try:
        client.remove(path)
    except OSError as err:
        if err.errno is not None:
            raise
        try:  # SFTP v3 reports EISDIR as a bare "Failure": say what it was
            is_dir = stat.S_ISDIR(client.lstat(path).st_mode or 0)
        except OSError:
            is_dir = False
        if is_dir:
            raise InvalidInput("is a directory (use a recursive remove)", url=str(url),
                               operation="remove") from None
        raise


def _remove_tree(client: paramiko.SFTPClient, root: str, keep_root: bool) -> None:
    if not stat.S_ISDIR(client.lstat(root).st_mode or 0):
        if not keep_root:
            _ignore_missing(lambda: client.remove(root))
        return
    for entry in client.listdir_attr(root):
        child = posixpath.join(root, entry.filename)
        if stat.S_ISDIR(entry.st_mode or 0):
            _remove_tree(client, child, False)
        else:
            _ignore_missing(lambda: client.remove(child))
    if not keep_root:
        _ignore_missing(lambda: client.rmdir(root))


def _ignore_missing(action: Callable[[], None]) -> None:
    try:
        action()
    except OSError as err:
        if err.errno != errno.ENOENT:
            raise

