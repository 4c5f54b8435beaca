"""A byte-for-byte TCP relay that counts connections and can cut them: for SSH test beds.

`TcpProxy` frames the client stream as HTTP and holds back anything that starts with an
upper-case letter until it sees a blank line, so it cannot carry SSH (the client's first
bytes are ``SSH-2.0-...\\r\\n`` followed by binary key exchange). `RawRelay` never looks
at the bytes. It offers the counter interface `harness.measure` reads (``reset_counters``,
``snapshot``) and `drop_connections`, which resets every live connection (what a broken
link looks like to both ends).
"""

from __future__ import annotations

import socket
import struct
import threading
from types import TracebackType
from typing import Any, Dict, List, Optional, Tuple, Type

__all__ = ["RawRelay"]

_RECV = 64 * 1024
_ACCEPT_POLL_S = 0.2


class RawRelay:
    """Relays ``127.0.0.1:<free port>`` to ``target``; counts connections and bytes."""

    def __init__(self, target: Tuple[str, int], host: str = "127.0.0.1") -> None:
        self.target = (target[0], int(target[1]))
        self.host = host
        self.port = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._live: Dict[Tuple[socket.socket, socket.socket], int] = {}  # pair -> pumps running
        self._threads: List[threading.Thread] = []
        self._listener: Optional[socket.socket] = None
        self._connections = 0
        self._bytes = [0, 0]  # up, down

    def __enter__(self) -> "RawRelay":
        return self.start()

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.stop()

    @property
    def address(self) -> Tuple[str, int]:
        return (self.host, self.port)

    def start(self) -> "RawRelay":
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((self.host, 0))
        listener.listen(128)
        listener.settimeout(_ACCEPT_POLL_S)
        self._listener, self.port = listener, listener.getsockname()[1]
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        """Close the listener and every live connection; idempotent."""
        if self._listener is None or self._stopping.is_set():
            return
        self._stopping.set()
        self.drop_connections()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(5.0)
        self._listener.close()

    # -- counters (the subset of TcpProxy's that harness.measure reads)

    @property
    def connections(self) -> int:
        with self._lock:
            return self._connections

    def reset_counters(self) -> None:
        with self._lock:
            self._connections = 0
            self._bytes = [0, 0]

    def snapshot(self) -> Dict[str, Any]:
        """``connections``, ``bytes_up``, ``bytes_down``; ``requests`` is 0 (SSH is opaque)."""
        with self._lock:
            return {"connections": self._connections, "requests": 0, "bytes_up": self._bytes[0],
                    "bytes_down": self._bytes[1]}

    def drop_connections(self) -> int:
        """Reset every live connection (RST to the client, close to the server); returns how many."""
        with self._lock:
            live = list(self._live)
        for client, upstream in live:
            _reset(client)
            _reset(upstream)
        return len(live)

    # -- internals

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name=f"relay-{self.port}")
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                upstream = socket.create_connection(self.target, timeout=10.0)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):  # relay small segments at once, as the endpoints send them
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = (client, upstream)
            with self._lock:
                self._connections += 1
                self._live[pair] = 2
            self._spawn(self._pump, client, upstream, 0, pair)
            self._spawn(self._pump, upstream, client, 1, pair)

    def _pump(self, source: socket.socket, sink: socket.socket, direction: int,
              pair: Tuple[socket.socket, socket.socket]) -> None:
        try:
            while True:
                data = source.recv(_RECV)
                if not data:
                    break
                with self._lock:
                    self._bytes[direction] += len(data)
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            _reset(source)
            _reset(sink)
        with self._lock:
            self._live[pair] -= 1
            last = self._live[pair] == 0
            if last:
                del self._live[pair]
        if last:
            pair[0].close()
            pair[1].close()


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
