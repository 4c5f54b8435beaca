"""One persistent HTTP/1.1 connection: send a request, read its response.

Deliberately small: the object-store backends send thousands of tiny requests per job,
and a general-purpose client spends more CPU per request than the request itself costs.
Supports Content-Length and chunked bodies, close-delimited bodies, HEAD/204/304, TLS with
verification, and request bodies from bytes or a region of a file.

Network failures raise :class:`~transfer.errors.TransientError`; a failure to even get a
status line back on a *reused* connection raises :class:`StaleConnection` (a subclass), which
the pool answers by retrying once on a fresh connection.
"""

from __future__ import annotations

import _socket
import io
import os
import sys
import zlib

from transfer import _digests
from transfer.errors import RemoteError, TransferError, TransientError
from transfer.http.message import (MAX_LINE, buffered_head, header_lines, host_header, read_headers, request_head,
                                   status_line)
from transfer.lean import record
from transfer.http.sockets import SocketReader, connected, dial, handshaking, kernel_timeouts, sendfile

# Plain-HTTP connections use the C module _socket (socket imports enum and selectors, several
# ms of every job step's CPU); TLS connections import socket and ssl when they connect.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    import ssl
    from typing import BinaryIO, Callable, Dict, Iterator, List, Optional, Tuple, Union

    from transfer.http.message import HeaderList
    from transfer.http.proxy import Proxy

_CHUNK = 1 << 18


class StaleConnection(TransientError):
    """A kept-alive connection was closed by the server before it answered."""


@record(frozen=True)
class Timeouts:
    """Seconds to wait for a TCP/TLS connect and between bytes of a response."""

    connect: float = 10.0
    read: float = 60.0


@record(frozen=True)
class FileRegion:
    """A request body read from ``length`` bytes of ``path`` starting at ``offset``."""

    path: str
    offset: int
    length: int

    def blocks(self, size: int = 1 << 20) -> "Iterator[bytes]":
        """The region's bytes in blocks of at most ``size`` (fewer if the file is shorter than the
        region says: the caller's checksum then differs, as the store's would); OSError as open
        and read raise it."""
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            left = self.length
            while left > 0:
                block = fh.read(min(left, size))
                if not block:
                    return
                yield block
                left -= len(block)


if TYPE_CHECKING:
    Body = Union[bytes, FileRegion, None]
else:
    Body = object  # the alias above is for type checkers; typing is not imported at run time
_SMALL_FILE = 1 << 20
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def file_body(path: str) -> Tuple[int, bytes, Body]:
    """(size, MD5 digest, body) of a local file to upload: small files are read into memory
    (sent with the request head in one write), larger ones are sent from disk. Raises OSError.
    Read through the bare descriptor: ``open()``'s file object costs three more system calls
    (fstat, isatty, lseek) per file."""
    size, md5, _, body = file_body_crc32(path, crc=False)
    return size, md5, body


def file_body_crc32(path: str, crc: bool = True) -> Tuple[int, bytes, int, Body]:
    """:func:`file_body` with the file's CRC32 too (0 when ``crc`` is False), from the same
    read: zlib's CRC32 costs a fraction of the MD5 beside it."""
    fd = os.open(path, os.O_RDONLY | _CLOEXEC)
    try:
        chunks: List[bytes] = []
        size = 0
        while size <= _SMALL_FILE:
            block = os.read(fd, _SMALL_FILE + 1 - size)
            if not block:
                break
            chunks.append(block)
            size += len(block)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        crc32 = zlib.crc32(data) if crc else 0
        if size <= _SMALL_FILE:
            return size, _digests.md5(data), crc32, data
        digest = _digests.new("md5")
        digest.update(data)
        while block := os.read(fd, 1 << 20):
            digest.update(block)
            crc32 = zlib.crc32(block, crc32) if crc else 0
            size += len(block)
    finally:
        os.close(fd)
    return size, digest.digest(), crc32, FileRegion(path, 0, size)


class Response:
    """Status, headers (lower-case names) and a body that must be read or discarded."""

    __slots__ = ("status", "reason", "headers", "_conn", "_remaining", "_chunked", "_done")

    def __init__(self, conn: "Connection", status: int, reason: str, headers: Dict[str, str]):
        self.status = status
        self.reason = reason
        self.headers = headers
        self._conn = conn
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._remaining: Optional[int] = None
        if not self._chunked and length is not None:
            try:
                self._remaining = int(length)
            except ValueError:
                raise TransientError(f"bad Content-Length {length!r}") from None
        self._done = False

    @property
    def will_close(self) -> bool:
        return self._conn.must_close

    def read(self) -> bytes:
        """The whole body as bytes."""
        parts: list[bytes] = []
        self.read_into(parts.append)
        return b"".join(parts)

    def read_into(self, write: Callable[[bytes], object]) -> int:
        """Stream the body to ``write``; return the byte count. Raises TransientError on a cut body."""
        if self._done:
            return 0
        try:
            if self._chunked:
                total = self._conn.read_chunked(write)
            elif self._remaining is not None:
                total = self._conn.read_exact(self._remaining, write)
            else:
                total = self._conn.read_until_close(write)
        except OSError as err:  # ssl.SSLError included
            self._conn.close()
            self._done = True
            if isinstance(err, TransientError) or not _network_error(err):
                raise
            raise TransientError(f"body read failed: {err}", url=self._conn.endpoint,
                                 operation="read") from err
        except BaseException:
            self._conn.close()
            self._done = True
            raise
        self._done = True
        self._conn.response_done()
        return total

    def read_part(self, length: int, write: Callable[[bytes], object]) -> int:
        """Stream the next ``length`` bytes of a Content-Length body to ``write`` (fewer if
        the body ends first); the rest stays unread for later calls or :meth:`discard`."""
        if self._done or self._chunked or self._remaining is None:
            return self.read_into(write) if not self._done else 0
        wanted = min(length, self._remaining)
        try:
            self._conn.read_exact(wanted, write)
        except BaseException as err:
            self._conn.close()
            self._done = True
            if _network_error(err) and not isinstance(err, TransientError):
                raise TransientError(f"body read failed: {err}", url=self._conn.endpoint,
                                     operation="read") from err
            raise
        self._remaining -= wanted
        if self._remaining == 0:
            self._done = True
            self._conn.response_done()
        return wanted

    def discard(self) -> None:
        """Drop the body (reads it if small so the connection stays reusable)."""
        if self._done:
            return
        if self._remaining is not None and self._remaining <= _CHUNK:
            self.read_into(_ignore)
        else:
            self._conn.close()
            self._done = True

    @property
    def complete(self) -> bool:
        return self._done


def _ignore(_data: bytes) -> None:
    return None


class Connection:
    """A single keep-alive connection to ``host:port``; not thread-safe (the pool hands it out).

    ``connect_to`` dials another address while Host and TLS name stay ``host`` (like curl's
    ``--connect-to``): how tests reach a loopback server under a real cloud host name.
    ``proxy`` (:mod:`transfer.http.proxy`) is dialled instead: plain HTTP requests go to it in
    absolute form, TLS goes through a ``CONNECT`` tunnel and is verified against ``host``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: Optional[ssl.SSLContext] = None,
        server_hostname: Optional[str] = None,
        timeouts: Timeouts = Timeouts(),
        connect_to: Optional[Tuple[str, int]] = None,
        proxy: Optional[Proxy] = None,
        started: Optional[_socket.socket] = None,
        warm: bool = True,
    ) -> None:
        """``started``: a socket whose connect to this connection's address was started ahead
        (:func:`~transfer.http.sockets.dial_ahead`), used instead of dialling, as a stager's warm socket is;
        ``warm``: the node stager's warm sockets may be taken (never through a proxy)."""
        self.host = host
        self.port = port
        self._proxy = proxy
        self._address = connect_to or ((proxy.host, proxy.port) if proxy is not None else (host, port))
        self._ssl_context = ssl_context
        self._server_hostname = server_hostname or host
        self._timeouts = timeouts
        self._sock: Optional[_socket.socket] = None
        self._rfile: Optional[BinaryIO] = None
        self.must_close = False
        self.requests_sent = 0
        # body bytes sent and received on this connection: written only by the one thread that
        # holds it, read by a progress reporter (PoolStats.bytes_moved); one add per chunk
        self.bytes_moved = 0
        self.idle = True
        self._endpoint = f"{'https' if ssl_context else 'http'}://{host}:{port}"
        self._warm = False
        self._started = started if proxy is None else None
        self._takes_warm = warm and proxy is None

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def live_socket(self) -> Optional[_socket.socket]:
        """The connected socket (an ``ssl.SSLSocket`` with a timeout for TLS; a blocking one
        with kernel timeouts for plain HTTP), for :mod:`transfer.http.pipeline`, which sends
        and receives on it directly; None when not connected."""
        return self._sock

    def connect(self) -> None:
        self._warm = False
        try:
            try:
                sock, rfile = self._open()
            except OSError:
                if not self._warm:
                    raise
                self._drop_warm()  # a warm socket the TLS handshake failed on: dial afresh, once
                self._warm = False
                sock, rfile = self._open()
        except TransferError:  # a proxy's refusal of its tunnel, already named
            raise
        except OSError as err:  # ssl.SSLError included
            if type(err).__name__ == "SSLCertVerificationError":
                raise RemoteError(f"TLS certificate verification failed: {err.verify_message}",  # type: ignore[attr-defined]
                                  url=self.endpoint, operation="connect") from err
            via = f" through proxy {self._proxy}" if self._proxy is not None else ""
            # the message names the endpoint: the engine's final line names the file's URL only
            raise TransientError(f"cannot connect to {self.endpoint}{via}: {err}", url=self.endpoint,
                                 operation="connect") from err
        self._sock = sock
        self._rfile = rfile

    def _open(self) -> Tuple[_socket.socket, BinaryIO]:
        """A connected socket (a warm one if the stager left one) and its reader. Raises OSError."""
        if self._ssl_context is not None:
            sock: _socket.socket = self._tls_socket(self._ssl_context)
            sock.settimeout(self._timeouts.read)
            return sock, sock.makefile("rb", buffering=_CHUNK)  # type: ignore[attr-defined]
        warm = self._warm_socket() if self._proxy is None else None
        sock = warm or dial(self._address, self._timeouts.connect)
        kernel_timeouts(sock, self._timeouts.read)
        return sock, io.BufferedReader(SocketReader(sock), _CHUNK)

    def _tls_socket(self, context: ssl.SSLContext) -> socket.socket:
        import socket
        warm = self._warm_socket() if self._proxy is None else None
        if warm is not None and handshaking(warm):
            try:
                warm.do_handshake()  # type: ignore[attr-defined]
            except BaseException:
                warm.close()
                raise
            return warm  # type: ignore[return-value]
        if warm is not None:
            sock = socket.socket(fileno=warm.detach())
            sock.settimeout(self._timeouts.connect)
        else:
            sock = socket.create_connection(self._address, self._timeouts.connect)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._proxy is not None:
                from transfer.http.proxy import tunnel
                try:
                    tunnel(sock, self.host, self.port, self._proxy, self.endpoint)
                except BaseException:
                    sock.close()
                    raise
        return context.wrap_socket(sock, server_hostname=self._server_hostname)

    @property
    def reused(self) -> bool:
        """Whether the next request goes out on a connection the server may have closed
        meanwhile: one kept alive after a request, or a stager's warm socket."""
        return self.requests_sent > 0 or self._warm

    def unanswered(self) -> None:
        """The server closed this connection before answering anything on it: if it was a warm
        socket, the others to this address, opened about as long ago, go too."""
        if self._warm:
            warm = sys.modules.get("transfer.http.warm")
            if warm is not None:
                warm.forget(self._address)

    def _drop_warm(self) -> None:
        """A warm socket failed (its handshake or first request): see :meth:`unanswered`."""
        if self.requests_sent <= 1:
            self.unanswered()

    def _warm_socket(self) -> Optional[_socket.socket]:
        """A socket the node stager connected before this job began (:mod:`transfer.http.warm`,
        consulted only in a process that loaded it), else the one this connection was given
        started (its TLS handshake too, perhaps: :func:`~transfer.http.sockets.start_handshake`), or None."""
        warm = sys.modules.get("transfer.http.warm") if self._takes_warm else None
        sock = warm.take(self._address) if warm is not None else None  # records the address as used, too
        started, self._started = self._started, None
        if sock is None:
            sock = started
        elif started is not None:  # the pool gives one only when no warm socket waits: another thread's was
            started.close()
        if sock is not None and handshaking(sock):  # the store's first answer may be in: no check
            self._warm = True
            sock.settimeout(self._timeouts.connect)
            return sock
        if sock is not None:
            self._warm = True  # its first request is treated as one on a reused connection
            if not connected(sock, self._timeouts.connect):  # `connect` dials afresh, once
                sock.close()
                raise TimeoutError("a warm connection was not ready (not connected in time, or the server spoke first)")
            sock.settimeout(self._timeouts.connect)
        return sock

    def close(self) -> None:
        self.must_close = True
        for closeable in (self._rfile, self._sock):
            if closeable is not None:
                try:
                    closeable.close()
                except OSError:
                    pass
        self._rfile = None
        self._sock = None

    @property
    def is_open(self) -> bool:
        return self._sock is not None and not self.must_close

    def request(self, method: str, target: str, headers: HeaderList, body: Body = None) -> Response:
        """Send one request and read the response head. The body is left to the caller."""
        head = self._head(method, target, headers, body)  # raises before anything is sent
        if self._sock is None:
            self.connect()
        reused = self.requests_sent > 0 or self._warm
        self.idle = False
        self.requests_sent += 1
        try:
            self._send(head, body)
            return self._read_head(method)
        except TimeoutError as err:
            self.close()
            raise TransientError("timed out", url=self.endpoint, operation=method) from err
        except _EmptyStatus as err:
            self.close()
            self._drop_warm()
            cls = StaleConnection if reused else TransientError
            raise cls("connection closed before a response", url=self.endpoint,
                      operation=method) from err
        except OSError as err:  # ssl.SSLError included
            self.close()
            self._drop_warm()
            first_on_warm = self._warm and self.requests_sent == 1  # e.g. the stager's connect was refused
            cls = StaleConnection if first_on_warm or (reused and isinstance(err, (BrokenPipeError, ConnectionResetError))) \
                else TransientError
            raise cls(f"connection failed: {err}", url=self.endpoint, operation=method) from err

    def _send(self, head: bytes, body: Body) -> None:
        assert self._sock is not None
        try:
            if isinstance(body, bytes) and len(body) <= _CHUNK:
                self._sock.sendall(head + body)
                self.bytes_moved += len(body)
                return
            self._sock.sendall(head)
            if isinstance(body, bytes):
                self._sock.sendall(body)
                self.bytes_moved += len(body)
            elif isinstance(body, FileRegion):
                self._send_file(body)
        except BlockingIOError:  # the send timeout of a blocking plain socket ran out
            raise TimeoutError("timed out") from None

    def _head(self, method: str, target: str, headers: HeaderList, body: Body) -> bytes:
        if isinstance(body, FileRegion):
            length: Optional[int] = body.length
        elif body is not None or method in ("PUT", "POST"):
            length = len(body) if body else 0
        else:
            length = None
        if self._proxy is not None and self._ssl_context is None:
            from transfer.http.proxy import absolute_form
            target, headers = absolute_form(target, headers, self._host_header(), self._proxy)
        return request_head(method, target, headers, length, self._host_header(), self._endpoint)

    def _send_file(self, region: FileRegion) -> None:
        assert self._sock is not None
        with open(region.path, "rb") as fh:
            if self._ssl_context is None:
                sent = sendfile(self._sock, fh.fileno(), region.offset, region.length, self._timeouts.read,
                                self._moved)
                if sent != region.length:
                    raise TransientError(f"sent {sent} of {region.length} bytes of {region.path}")
                return
            fh.seek(region.offset)
            left = region.length
            while left > 0:
                data = fh.read(min(left, _CHUNK))
                if not data:
                    raise TransientError(f"{region.path} shrank while being sent")
                self._sock.sendall(data)
                left -= len(data)
                self.bytes_moved += len(data)

    def _moved(self, count: int) -> None:
        self.bytes_moved += count

    def _host_header(self) -> str:
        return host_header(self.host, self.port, self._ssl_context is not None)

    def _read_head(self, method: str) -> Response:
        rfile = self._rfile
        assert rfile is not None
        while True:
            head = buffered_head(rfile)
            if head is None:  # the head spans reads, or has odd line ends: line by line
                line = rfile.readline(MAX_LINE)
                if not line:
                    raise _EmptyStatus()
                version, status, reason = status_line(line, self.endpoint)
                headers = read_headers(rfile, self.endpoint)
            else:
                version, status, reason = status_line(head[0], self.endpoint)
                headers = header_lines(head[1], self.endpoint)
            if status != 100:
                break
        if version == b"HTTP/1.0" or "close" in headers.get("connection", "").lower():
            self.must_close = True
        response = Response(self, status, reason.strip().decode("latin-1"), headers)
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            response._remaining = 0
            response._chunked = False
        elif response._remaining is None and not response._chunked:
            self.must_close = True
        return response

    def read_exact(self, length: int, write: Callable[[bytes], object]) -> int:
        rfile = self._rfile
        assert rfile is not None
        left = length
        while left > 0:
            data = rfile.read(min(left, _CHUNK))
            if not data:
                raise TransientError(f"connection closed after {length - left} of {length} body bytes",
                                     url=self.endpoint, operation="read")
            write(data)
            left -= len(data)
            self.bytes_moved += len(data)
        return length

    def read_chunked(self, write: Callable[[bytes], object]) -> int:
        rfile = self._rfile
        assert rfile is not None
        total = 0
        while True:
            line = rfile.readline(MAX_LINE)
            if not line:
                raise TransientError("connection closed inside a chunked body", url=self.endpoint)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise TransientError(f"bad chunk size line {line[:40]!r}", url=self.endpoint) from None
            if size == 0:
                read_headers(rfile, self.endpoint)  # trailers
                return total
            total += self.read_exact(size, write)
            if rfile.readline(MAX_LINE) not in (b"\r\n", b"\n"):
                raise TransientError("chunk not terminated by CRLF", url=self.endpoint)

    def read_until_close(self, write: Callable[[bytes], object]) -> int:
        rfile = self._rfile
        assert rfile is not None
        total = 0
        while True:
            data = rfile.read1(_CHUNK)  # type: ignore[attr-defined]
            if not data:
                self.close()
                return total
            write(data)
            total += len(data)
            self.bytes_moved += len(data)

    def response_done(self) -> None:
        self.idle = True
        if self.must_close:
            self.close()


class _EmptyStatus(Exception):
    """The server closed the connection instead of sending a status line."""


def verifying_ssl_context(ca_file: Optional[str] = None) -> ssl.SSLContext:
    """A TLS context that verifies the server; ``ca_file`` replaces the system CA store."""
    import ssl
    return ssl.create_default_context(cafile=ca_file)


def _network_error(err: BaseException) -> bool:
    """A timeout, a reset or closed connection, or a TLS failure (``ssl`` is imported only by TLS
    connections, so without it there is no TLS failure)."""
    ssl = sys.modules.get("ssl")
    return isinstance(err, (TimeoutError, ConnectionError)) or (ssl is not None and isinstance(err, ssl.SSLError))
