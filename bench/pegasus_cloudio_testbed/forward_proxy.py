"""A small threaded HTTP forward proxy on 127.0.0.1: absolute-form requests and CONNECT tunnels.

What tests of ``http_proxy``/``https_proxy`` need: proof that requests went through a proxy
(``requests`` lists each request line and its ``Proxy-Authorization``), a proxy that demands
credentials (``credentials="user:password"`` answers 407 without them), and a TLS tunnel
whose far end is the origin (the proxy relays bytes; it never sees the TLS plaintext).
One request per client connection for absolute-form requests (its body, when it has a
Content-Length, is passed on; the response gets ``Connection: close`` and ends after its
Content-Length); a tunnel lasts until either side closes.
"""

from __future__ import annotations

import base64
import socket
import threading
from dataclasses import dataclass
from typing import List, Optional
from urllib.parse import urlsplit

__all__ = ["ForwardProxy", "ProxiedRequest"]


@dataclass(frozen=True)
class ProxiedRequest:
    """One request as the proxy received it: ``method``, ``target`` (absolute URL or
    ``host:port``) and the ``Proxy-Authorization`` value, if any."""

    method: str
    target: str
    authorization: Optional[str]


class ForwardProxy:
    """``with ForwardProxy() as proxy:`` then ``http_proxy=proxy.url``."""

    def __init__(self, credentials: Optional[str] = None, fail_first: int = 0, host: str = "127.0.0.1",
                 port: int = 0, refuse: Optional[int] = None) -> None:
        """``fail_first``: answer that many absolute-form requests 502 (a failing Squid).
        ``refuse``: answer every absolute-form request with this status (a Squid whose rules
        deny the site: 403).
        ``host``/``port``: where to listen (a free port on 127.0.0.1 unless a test needs a
        fixed one, such as 80, where a proxy named without a port is looked for)."""
        self._fail_left = fail_first
        self._refuse = refuse
        self._expected = "Basic " + base64.b64encode(credentials.encode()).decode() if credentials else None
        self._listener = socket.create_server((host, port))
        self.host = host
        self.port = self._listener.getsockname()[1]
        self.requests: List[ProxiedRequest] = []
        self._lock = threading.Lock()
        self._threads: List[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> "ForwardProxy":
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept(); close() alone does not
        except OSError:
            pass
        self._listener.close()
        for thread in list(self._threads):
            thread.join(timeout=10)

    def _spawn(self, target, *args) -> None:  # type: ignore[no-untyped-def]
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._spawn(self._serve, client)

    def _serve(self, client: socket.socket) -> None:
        with client:
            head = _read_head(client)
            if head is None:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, target, _version = lines[0].split(" ", 2)
            headers = [line.split(":", 1) for line in lines[1:] if ":" in line]
            auth = next((v.strip() for k, v in headers if k.strip().lower() == "proxy-authorization"), None)
            with self._lock:
                self.requests.append(ProxiedRequest(method, target, auth))
            if self._expected is not None and auth != self._expected:
                client.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                               b"Proxy-Authenticate: Basic realm=\"p\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            with self._lock:
                fail, self._fail_left = self._fail_left > 0 and method != "CONNECT", max(0, self._fail_left - 1)
            if self._refuse is not None and method != "CONNECT":
                client.sendall(f"HTTP/1.1 {self._refuse} Refused\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                               .encode())
            elif fail:
                client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            elif method == "CONNECT":
                self._tunnel(client, target)
            else:
                self._forward(client, method, target, headers)

    def _tunnel(self, client: socket.socket, target: str) -> None:
        host, _, port = target.rpartition(":")
        try:
            upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        with upstream:
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            pump = threading.Thread(target=_relay, args=(upstream, client), daemon=True)
            pump.start()
            _relay(client, upstream)
            pump.join(timeout=30)

    def _forward(self, client: socket.socket, method: str, target: str, headers: List[List[str]]) -> None:
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            client.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            return
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        kept = [f"{k}:{v}" for k, v in headers
                if k.strip().lower() not in ("proxy-authorization", "connection", "proxy-connection")]
        request = "\r\n".join([f"{method} {path} HTTP/1.1", *kept, "Connection: close", "", ""])
        sent = next((int(v) for k, v in headers if k.strip().lower() == "content-length"), 0)
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=10) as upstream:
            upstream.sendall(request.encode("latin-1"))
            while sent > 0:  # the request's body (an upload): Content-Length bytes
                data = client.recv(min(sent, 65536))
                if not data:
                    return
                upstream.sendall(data)
                sent -= len(data)
            head = _read_head(upstream)
            if head is None:
                return
            lines = head.split(b"\r\n")
            # the client must not reuse a connection this proxy closes
            client.sendall(b"\r\n".join([lines[0], b"Connection: close", *lines[1:], b"", b""]))
            length = next((int(line.split(b":", 1)[1]) for line in lines[1:]
                           if line.lower().startswith(b"content-length:")), None)
            left = 0 if method == "HEAD" else -1 if length is None else length
            while left != 0:  # the body: Content-Length bytes, else up to the origin's close
                try:
                    data = upstream.recv(65536 if left < 0 else min(left, 65536))
                except OSError:
                    return
                if not data:
                    return
                client.sendall(data)
                if left > 0:
                    left -= len(data)


def _read_head(sock: socket.socket) -> Optional[bytes]:
    head = b""
    while b"\r\n\r\n" not in head:
        byte = sock.recv(1)
        if not byte or len(head) > 65536:
            return None
        head += byte
    return head[:-4]


def _relay(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

