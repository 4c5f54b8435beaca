"""The cache daemon's HTTP(S) server: serves node-cache entries to the pool's peers.

Protocol (one resource per entry; ``<digest>`` is the SHA-256 of the cache key, which is
how the node cache names its files)::

    GET|HEAD /v1/<user>/<digest>       Authorization: Bearer <pool token>   [Range: bytes=a-b]
    200 / 206  Content-Length, X-Sha256 (as the cache recorded it), Content-Range on 206
    401 no or wrong token; 404 unknown user, entry or invalid path; 416 range past the end;
    503 the cap on concurrent serves is reached (the client moves on to another replica)

Only the caches of the configured users are served, only complete entries (the cache's
size and mtime check against its metadata, the key's digest matching the name), each file
opened once so eviction during a serve cannot change what is sent. HTTP/1.1 keep-alive;
TLS with the pool's certificate unless plain HTTP was configured explicitly.
"""

from __future__ import annotations

import hmac
import io
import logging
import os
import re
import socket
import ssl
import stat
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Mapping, Optional, Tuple

from transfer.cache.layout import Layout, digest_of, read_meta

__all__ = ["CacheServer", "ServeConfig"]

_log = logging.getLogger("pegasus_cloudio.p2p")
_PATH = re.compile(r"^/v1/([A-Za-z0-9._-]{1,64})/([0-9a-f]{64})$")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
IDLE_TIMEOUT_S = 30.0
BUFFER = 1 << 20


@dataclass(frozen=True)
class ServeConfig:
    """What one daemon serves: user -> cache directory, the pool token, TLS files (both
    None only with ``plain_http``), the bound address and the cap on concurrent serves."""

    caches: Mapping[str, str]
    token: str
    bind: Tuple[str, int]
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    plain_http: bool = False
    max_serves: int = 32


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    config: ServeConfig
    slots: threading.BoundedSemaphore
    tls: Optional[ssl.SSLContext]

    def handle_error(self, request: object, client_address: object) -> None:
        _log.debug("connection from %s ended with an error", client_address, exc_info=True)

    def get_request(self) -> Tuple[socket.socket, object]:
        sock, addr = super().get_request()
        # headers and body go out as separate writes: without this, Nagle holds the body
        # back until the client's delayed ACK (40 ms per small file)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_S
    server: _Server

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            try:
                self.connection.do_handshake()
            except (OSError, ssl.SSLError) as err:
                _log.debug("TLS handshake with %s failed: %s", self.client_address, err)
                self.close_connection = True
                raise ConnectionAbortedError() from err

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self._serve(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(body=False)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        _log.debug("%s " + format, self.client_address[0], *args)

    def _serve(self, body: bool) -> None:
        if not self._authorised():
            return self._refuse(401, "missing or wrong pool token")
        match = _PATH.match(self.path)
        directory = self.server.config.caches.get(match.group(1)) if match else None
        if match is None or directory is None:
            return self._refuse(404, "no such cache")
        if not self.server.slots.acquire(blocking=False):
            return self._refuse(503, "too many concurrent serves", retry=True)
        try:
            self._serve_entry(Layout(directory), match.group(2), body)
        finally:
            self.server.slots.release()

    def _authorised(self) -> bool:
        header = self.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        expected = self.server.config.token.encode()
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected)

    def _serve_entry(self, layout: Layout, digest: str, body: bool) -> None:
        paths = layout.paths_for_digest(digest)
        meta = read_meta(paths.meta)
        fh = _open_entry(paths.data, layout.root)
        if fh is None:
            return self._refuse(404, "no such entry")
        with fh:
            st = os.fstat(fh.fileno())
            if meta is None or digest_of(meta.key) != digest or not meta.matches(st):
                return self._refuse(404, "no such entry")
            span = _span(self.headers.get("Range"), meta.size)
            if span is None:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{meta.size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start, end = span
            self.send_response(206 if self.headers.get("Range") else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start))
            self.send_header("X-Sha256", meta.sha256)
            if self.headers.get("Range"):
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{meta.size}")
            self.end_headers()
            if body and end > start:
                _send_span(self.connection, fh, start, end - start)

    def _refuse(self, status: int, reason: str, retry: bool = False) -> None:
        data = (reason + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        if retry:
            self.send_header("Retry-After", "1")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def _open_entry(path: str, root: str) -> Optional[io.BufferedReader]:
    """The entry file, or None. The daemon may run as root and serves directories its users
    write, so a symlink (O_NOFOLLOW) or a file not owned by the cache's owner (a hard link to
    someone else's file) is never served."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.stat(root).st_uid:
            os.close(fd)
            return None
    except OSError:
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def _send_span(sock: socket.socket, fh: io.BufferedReader, start: int, count: int) -> None:
    """Bytes ``start..start+count`` of ``fh`` to ``sock``: ``sendfile`` on a plain socket; over
    TLS, 1 MiB reads (``socket.sendfile`` would fall back to 8 KiB sends)."""
    if not isinstance(sock, ssl.SSLSocket):
        sock.sendfile(fh, start, count)
        return
    fh.seek(start)
    buffer = bytearray(min(BUFFER, count))
    view = memoryview(buffer)
    while count > 0:
        n = fh.readinto(view[: min(len(buffer), count)])
        if not n:
            raise ConnectionAbortedError("the entry shrank while being served")
        sock.sendall(view[:n])
        count -= n


def _span(header: Optional[str], size: int) -> Optional[Tuple[int, int]]:
    """The byte span [start, end) a Range header asks for; (0, size) without one (or with
    one this server does not support, as RFC 9110 allows); None when it starts past the end."""
    if not header:
        return 0, size
    match = _RANGE.match(header.strip())
    if match is None or match.group(1) == match.group(2) == "":
        return 0, size
    first, last = match.group(1), match.group(2)
    if first == "":  # suffix range: the last N bytes
        n = int(last)
        return (max(0, size - n), size) if n > 0 else None
    start = int(first)
    end = min(size, int(last) + 1) if last else size
    if start >= size or end <= start:
        return None
    return start, end


class CacheServer:
    """A running daemon (``start``/``stop`` or a ``with`` block); ``address`` is where it listens."""

    def __init__(self, config: ServeConfig) -> None:
        if not config.plain_http and not (config.cert_file and config.key_file):
            raise ValueError("the cache daemon needs a certificate and key (or plain HTTP, "
                             "configured explicitly)")
        self._config = config
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def address(self) -> Tuple[str, int]:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> "CacheServer":
        server = _Server(self._config.bind, _Handler)
        server.config = self._config
        server.slots = threading.BoundedSemaphore(self._config.max_serves)
        server.tls = None
        if not self._config.plain_http:
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(str(self._config.cert_file), str(self._config.key_file))
            server.tls = tls
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="p2p-serve", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> "CacheServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
