"""A scripted HTTP/1.1 server on loopback that records every request byte for byte.

Tests use it to see exactly what a client sends (request line, every header in order, the
body) and to play a server's part: a handler maps each recorded :class:`Captured` request to
a :class:`Reply`. Keep-alive is honoured, so a client's connection reuse is exercised too.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

__all__ = ["Captured", "Reply", "ScriptedServer"]


@dataclass(frozen=True)
class Captured:
    """One request as it arrived: ``headers`` keep order, case and repeats."""

    method: str
    target: str
    headers: Tuple[Tuple[str, str], ...]
    body: bytes
    raw_head: bytes

    def header(self, name: str) -> Optional[str]:
        """The first value of ``name`` (case-insensitive), or None."""
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    def all(self, name: str) -> List[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]


@dataclass(frozen=True)
class Reply:
    status: int = 200
    headers: Dict[str, str] = field(default_factory=dict)
    body: bytes = b""


Handler = Callable[[Captured], Reply]


class ScriptedServer:
    """``with ScriptedServer(handler) as server:``; ``server.requests`` lists what arrived."""

    def __init__(self, handler: Handler = lambda _req: Reply()) -> None:
        self.handler = handler
        self.requests: List[Captured] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._threads: List[threading.Thread] = []
        self._stopping = False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ScriptedServer":
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        rfile = conn.makefile("rb")
        try:
            while True:
                request = _read_request(rfile)
                if request is None:
                    return
                with self._lock:
                    self.requests.append(request)
                reply = self.handler(request)
                conn.sendall(_encode(reply, request.method))
        except OSError:
            return
        finally:
            rfile.close()
            conn.close()


def _read_request(rfile) -> Optional[Captured]:  # type: ignore[no-untyped-def]
    line = rfile.readline(1 << 20)
    if not line:
        return None
    raw = [line]
    headers: List[Tuple[str, str]] = []
    while True:
        header = rfile.readline(1 << 20)
        raw.append(header)
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        headers.append((name, value.strip()))
    method, target, _ = line.decode("latin-1").split(" ", 2)
    length = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
    body = rfile.read(length) if length else b""
    return Captured(method, target, tuple(headers), body, b"".join(raw))


def _encode(reply: Reply, method: str) -> bytes:
    headers = dict(reply.headers)
    headers.setdefault("Content-Length", str(len(reply.body)))
    head = f"HTTP/1.1 {reply.status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1") + b"\r\n" + (b"" if method == "HEAD" else reply.body)
