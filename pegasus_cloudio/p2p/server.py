"""The cache daemon's HTTP(S) server: serves node-cache entries to the pool's peers.

Protocol (one resource per entry; ``<digest>`` is the SHA-256 of the cache key, which is
how the node cache names its files)::

    GET|HEAD /v1/<user>/<digest>       Authorization: Bearer <pool token>
                                       X-Pcio-Proof: <proof>   [Range: bytes=a-b]
    200 / 206  Content-Length, X-Sha256 (as the cache recorded it), Content-Range on 206
    401 no or wrong token (the connection is then closed); 404 unknown user, entry, invalid
    path, or no valid proof (the same answer: a reader without the scope learns nothing);
    416 range past the end; 503 the cap on concurrent serves is reached (the client moves on)

Who gets an entry (``docs/security.md``): a request whose proof
(:func:`transfer.peers.proof`) matches one of the capabilities the producing job left in
``<digest>.peers``, bound to this daemon's certificate, that is, a reader of the same store
identity and bucket who reached this very daemon. The pool token only keeps strangers from using the daemon.

Only the caches of the configured users are served, only complete entries (the cache's
size and mtime check against its metadata, the key's digest matching the name), each file
opened once (:mod:`.files`: no links, regular files of the cache's owner only, bounded
reads) so eviction during a serve cannot change what is sent. Connections are bounded in
number and time (:mod:`.limits`), a request's line and headers to :data:`MAX_HEADER_BYTES`. HTTP/1.1 keep-alive; TLS with the pool's certificate
unless plain HTTP was configured explicitly.
"""

from __future__ import annotations

import hmac
import http.client
import io
import logging
import os
import re
import socket
import socketserver
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Mapping, Optional, Tuple

from transfer.cache.layout import GRANT_LINE, MAX_GRANTS, Meta, digest_of
from transfer.lean import field, record
from transfer.p2p.client import PROOF_HEADER, certificate_binding, plain_binding
from transfer.peers import proof

from .files import open_entry_file, open_root, read_grants, read_meta_fd
from .limits import ConnectionLimits, Connections, Slot

__all__ = ["CacheServer", "ConnectionLimits", "ServeConfig"]

_log = logging.getLogger("pegasus_cloudio.p2p")
_PATH = re.compile(r"^/v1/([A-Za-z0-9._-]{1,64})/([0-9a-f]{64})$")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_MAX_DIGITS = 18  # beyond this a range bound is past the end of any file (and int() stays cheap)
BUFFER = 1 << 20
MAX_HEADER_BYTES = 16 * 1024  # a reader's request line and headers take well under 1 KiB


@record(frozen=True)
class ServeConfig:
    """What one daemon serves: user -> cache directory, the pool token, TLS files (both
    None only with ``plain_http``), the bound address, the cap on concurrent serves, each user's uid
    (a cache directory owned by anyone else is not served) and the connection limits."""

    caches: Mapping[str, str]
    token: str
    bind: Tuple[str, int]
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    plain_http: bool = False
    max_serves: int = 32
    owners: Mapping[str, int] = field(default_factory=dict)
    limits: ConnectionLimits = ConnectionLimits()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a burst of peers waits in the kernel, not in a SYN-ACK retry
    config: ServeConfig
    slots: threading.BoundedSemaphore
    tls: Optional[ssl.SSLContext]
    connections: Connections
    binding: str
    admitted: Dict[int, Slot]

    def server_bind(self) -> None:
        """Bind, without ``HTTPServer``'s reverse lookup of the address (``getfqdn``, a DNS
        query that may hang: ``serve``'s root process binds again on its loop)."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

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

    def process_request(self, request: Any, client_address: Any) -> None:
        """Admit the connection (a slot and a deadline) or close it at once, threadless."""
        address = str(client_address[0]) if isinstance(client_address, tuple) else str(client_address)
        slot = self.connections.admit(request, address)
        if slot is None:
            self.shutdown_request(request)
            return
        self.admitted[id(request)] = slot
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request: Any) -> None:
        slot = self.admitted.pop(id(request), None)
        if slot is not None:
            self.connections.release(slot)


class _HeaderBudget:
    """The connection's reader, giving each request at most ``limit`` bytes of request line
    and headers (http.server alone takes 100 lines of 64 KiB, before the token is checked):
    past it, ``readline`` raises LineTooLong (answered 431, or the connection closed)."""

    def __init__(self, raw: Any, limit: int) -> None:
        self._raw, self._limit, self._left = raw, limit, limit

    def next_request(self) -> None:
        self._left = self._limit

    def readline(self, size: int = -1) -> bytes:
        want = self._left + 1 if size is None or size < 0 else min(size, self._left + 1)
        line: bytes = self._raw.readline(want)
        self._left -= len(line)
        if self._left < 0:
            raise http.client.LineTooLong(f"request headers over {self._limit} bytes")
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        self.slot = self.server.admitted[id(self.request)]
        super().setup()
        self.rfile = self._budget = _HeaderBudget(self.rfile, MAX_HEADER_BYTES)  # type: ignore[assignment]
        self.connection.settimeout(self.server.config.limits.handshake_seconds)
        if isinstance(self.connection, ssl.SSLSocket):
            try:
                self.connection.do_handshake()
            except (OSError, ssl.SSLError) as err:
                _log.debug("TLS handshake with %s failed: %s", self.client_address, err)
                self.close_connection = True
                raise ConnectionAbortedError() from err

    def handle(self) -> None:
        """Requests until the client or a deadline closes the connection."""
        self.close_connection = True
        self._next_request()
        while not self.close_connection:
            self._next_request()

    def _next_request(self) -> None:
        self.connection.settimeout(self.server.config.limits.idle_seconds)
        self._budget.next_request()
        self.handle_one_request()
        self.slot.expire_in(self.server.config.limits.idle_seconds)

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self._serve(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(body=False)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        _log.debug("%s " + format, self.client_address[0], *args)

    def _serve(self, body: bool) -> None:
        self.slot.expire_in(None)  # headers are in: the response has its own send timeouts
        self.connection.settimeout(self.server.config.limits.send_seconds)
        if not self._authorised():
            self.close_connection = True
            return self._refuse(401, "missing or wrong pool token")
        match = _PATH.match(self.path)
        user = match.group(1) if match else ""
        directory = self.server.config.caches.get(user)
        if match is None or directory is None:
            return self._refuse(404, "no such cache")
        if not self.server.slots.acquire(blocking=False):
            return self._refuse(503, "too many concurrent serves", retry=True)
        try:
            root = open_root(directory, self.server.config.owners.get(user))
            if root is None:
                return self._refuse(404, "no such cache")
            try:
                self._serve_entry(root, match.group(2), body)
            finally:
                os.close(root)
        finally:
            self.server.slots.release()

    def _authorised(self) -> bool:
        header = self.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        expected = self.server.config.token.encode()
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected)

    def _proven(self, root: int, digest: str) -> bool:
        """The request's proof matches a capability granted for this entry."""
        given = self.headers.get(PROOF_HEADER, "").strip().lower()
        if len(given) != 64:
            return False
        fd = open_entry_file(root, digest, ".peers")
        grants = read_grants(fd, MAX_GRANTS * GRANT_LINE) if fd is not None else frozenset()
        here = self.server.binding
        return any(hmac.compare_digest(proof(c, here, digest), given) for c in grants)

    def _entry(self, root: int, digest: str) -> Tuple[Optional[Meta], Optional[int]]:
        """The entry's metadata and open data file, when both are sound and agree."""
        meta_fd = open_entry_file(root, digest, ".meta")
        meta = read_meta_fd(meta_fd) if meta_fd is not None else None
        if meta is None or digest_of(meta.key) != digest:
            return None, None
        fd = open_entry_file(root, digest)
        if fd is not None and not meta.matches(os.fstat(fd)):
            os.close(fd)
            fd = None
        return meta, fd

    def _serve_entry(self, root: int, digest: str, body: bool) -> None:
        if not self._proven(root, digest):
            return self._refuse(404, "no such entry")
        meta, fd = self._entry(root, digest)
        if meta is None or fd is None:
            return self._refuse(404, "no such entry")
        with os.fdopen(fd, "rb") as fh:
            span = _span(self.headers.get("Range"), meta.size)
            if span is None:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{meta.size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start, end, partial = span
            self.send_response(206 if partial else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start))
            self.send_header("X-Sha256", meta.sha256)
            if partial:
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
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def _send_span(sock: socket.socket, fh: io.BufferedReader, start: int, count: int) -> None:
    """Bytes ``start..start+count`` of ``fh`` to ``sock``, never more: ``sendfile`` on a
    plain socket; over TLS, 1 MiB reads (``socket.sendfile`` would fall back to 8 KiB sends)."""
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


def _first_certificate(path: str) -> bytes:
    """DER of the first certificate in a PEM chain file (the server's own)."""
    with open(path, encoding="ascii") as fh:
        text = fh.read()
    end = "-----END CERTIFICATE-----"
    return ssl.PEM_cert_to_DER_cert(text[: text.index(end) + len(end)])


def _bound(digits: str) -> int:
    """A range bound; one of more than 18 digits is past the end of any file."""
    return int(digits) if len(digits) <= _MAX_DIGITS else 1 << 63


def _span(header: Optional[str], size: int) -> Optional[Tuple[int, int, bool]]:
    """The byte span [start, end) a Range header asks for and whether the answer is partial
    (206); (0, size, False) without one, or with one this server cannot parse or does not
    support (``bytes=abc``, ``items=0-1``): RFC 9110 (14.2) says to ignore such a field and
    send the whole body as a 200. None when the range starts past the end (416)."""
    if not header:
        return 0, size, False
    match = _RANGE.match(header.strip())
    if match is None or match.group(1) == match.group(2) == "":
        return 0, size, False
    first, last = match.group(1), match.group(2)
    if first == "":  # suffix range: the last N bytes
        n = _bound(last)
        return (max(0, size - n), size, True) if n > 0 else None
    start = _bound(first)
    end = min(size, _bound(last) + 1) if last else size
    if start >= size or end <= start:
        return None
    return start, end, True


class CacheServer:
    """A running daemon (``start``/``stop`` or a ``with`` block); ``address`` is where it listens."""

    def __init__(self, config: ServeConfig) -> None:
        if not config.plain_http and not (config.cert_file and config.key_file):
            raise ValueError("the cache daemon needs a certificate and key (or plain HTTP, "
                             "configured explicitly)")
        self._config = config
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self._address: Optional[Tuple[str, int]] = None

    @property
    def config(self) -> ServeConfig:
        return self._config

    @property
    def connections(self) -> Connections:
        assert self._server is not None
        return self._server.connections

    @property
    def address(self) -> Tuple[str, int]:
        """Where it listens (known from :meth:`bind` on, also after :meth:`close_listener`)."""
        assert self._address is not None
        return self._address

    def bind(self) -> "CacheServer":
        """Listen and load the TLS key (both may need privileges), start no thread (the
        process may fork and drop privileges before :meth:`run`)."""
        server = _Server(self._config.bind, _Handler)
        server.config = self._config
        server.slots = threading.BoundedSemaphore(self._config.max_serves)
        server.admitted = {}
        host, port = server.server_address[:2]
        self._address = (str(host), int(port))
        server.binding = plain_binding(*self._address)
        server.tls = None
        if not self._config.plain_http:
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(str(self._config.cert_file), str(self._config.key_file))
            server.tls = tls
            server.binding = certificate_binding(_first_certificate(str(self._config.cert_file)))
        self._server = server
        return self

    def announce(self, host: str, port: int) -> None:
        """Peers dial this daemon at ``host:port`` (its URL in the index, after :meth:`bind`):
        over plain HTTP, readers' proofs are bound to that address."""
        assert self._server is not None
        if self._config.plain_http:
            self._server.binding = plain_binding(host, port)

    def run(self) -> "CacheServer":
        """Serve in a thread (after :meth:`bind`)."""
        server = self._server
        assert server is not None
        server.connections = Connections(self._config.limits)
        self._thread = threading.Thread(target=server.serve_forever, name="p2p-serve", daemon=True)
        self._thread.start()
        return self

    def start(self) -> "CacheServer":
        return self.bind().run()

    def close_listener(self) -> None:
        """Close the listening socket without serving (a forked sibling's)."""
        server, self._server = self._server, None
        if server is not None:
            server.server_close()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None and self._thread is not None:
            server.shutdown()
            server.server_close()
            server.connections.close()
        elif server is not None:
            server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> "CacheServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
