"""A threaded TCP relay that counts HTTP/1.1 traffic, adds latency and injects faults.

`TcpProxy` listens on 127.0.0.1 and relays every accepted connection to one
target. It sits in the benchmark path (counting connections, requests and
bytes; a `Shaping` emulates a WAN path: delay, jitter, bandwidth cap) and in fault tests (resets,
truncated bodies, stalls and error statuses on chosen requests).

Per connection there is one reader thread per direction, plus, when shaping is
set, one sender thread per direction that delivers time-stamped chunks when
they are due (so latency is added without limiting throughput).

The client-to-server stream is framed as HTTP/1.1 requests (Content-Length and
chunked bodies are skipped, never parsed as requests). Clients are assumed not
to pipeline, so the response bytes that follow a forwarded request belong to
it. A stream that does not look like HTTP (e.g. TLS) is relayed untouched and
counted in bytes only.
"""

from __future__ import annotations

import itertools
import socket
import struct
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import (
    Any, Callable, Dict, Iterable, List, Optional, Set, Tuple, Type,
)

from pegasus_cloudio_testbed.faults import (
    CORRUPT, RESET, SLOW_DOWN_BODY, STATUS, TRUNCATE, Fault, FaultBook, Match, status_response,
)
from pegasus_cloudio_testbed.counters import Counters
from pegasus_cloudio_testbed.links import DelayedLink, DirectLink, Link, Shaping
from pegasus_cloudio_testbed.httpframe import RequestFramer, RequestHead

__all__ = ["Fault", "Match", "SLOW_DOWN_BODY", "Shaping", "TcpProxy"]

_RECV_SIZE = 128 * 1024
_ACCEPT_POLL_S = 0.2
_CONNECT_TIMEOUT_S = 10.0
_JOIN_TIMEOUT_S = 5.0

# --------------------------------------------------------------------------- connections


class _Armed:
    """A response fault waiting for its byte threshold."""

    def __init__(self, fault: Fault) -> None:
        self.fault = fault
        self.left = fault.after_bytes

    def split(self, data: bytes) -> Tuple[bytes, bool]:
        """(bytes still to forward, whether the fault fires after them)."""
        if len(data) < self.left:
            self.left -= len(data)
            return data, False
        allowed, self.left = data[:self.left], 0
        return allowed, True


def _quietly(action: Callable[[], Any]) -> None:
    try:
        action()
    except OSError:
        pass


def _nodelay(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass(frozen=True)
class _Shared:
    """What every connection of one proxy needs from it."""

    target: Tuple[str, int]
    shaping: Shaping
    counters: Counters
    faults: FaultBook
    stopping: threading.Event     # set by TcpProxy.stop
    forget: Callable[["_Connection"], None]
    name: str                     # thread name prefix


class _Connection:
    """One relayed client connection and the threads serving it.

    The last thread to exit closes both sockets; `abort` wakes every thread
    (socket shutdowns plus closing the links) so that happens promptly.
    """

    def __init__(self, shared: _Shared, client: socket.socket, number: int) -> None:
        self._shared = shared
        self._client = client
        self._upstream: Optional[socket.socket] = None
        self._name = f"{shared.name}-{number}"
        self._lock = threading.Lock()
        self._threads: List[threading.Thread] = []
        self._running = 0
        self._aborted = False
        self._armed: Optional[_Armed] = None
        self._links: List[Link] = []
        self._to_upstream: Link  # set by _run once upstream is connected
        self._to_client: Link
        self._framer: RequestFramer  # set by _pump_up, before any request head is seen

    def start(self) -> None:
        self._spawn(self._run, "setup")

    def threads(self) -> List[threading.Thread]:
        with self._lock:
            return list(self._threads)

    def abort(self, rst: bool = False) -> None:
        """Tear the connection down; with ``rst`` the client gets a TCP reset."""
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            upstream, links = self._upstream, list(self._links)
        if rst:  # SHUT_RD wakes our reader without sending FIN; the close sends RST
            linger = struct.pack("ii", 1, 0)
            _quietly(lambda: self._client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger))
            _quietly(lambda: self._client.shutdown(socket.SHUT_RD))
        else:
            _quietly(lambda: self._client.shutdown(socket.SHUT_RDWR))
        if upstream is not None:
            _quietly(lambda: upstream.shutdown(socket.SHUT_RDWR))
        for link in links:
            link.close()

    def _spawn(self, target: Callable[[], None], role: str) -> None:
        thread = threading.Thread(target=self._thread_main, args=(target,),
                                  name=f"{self._name}-{role}", daemon=True)
        with self._lock:
            self._threads.append(thread)
            self._running += 1
        thread.start()

    def _thread_main(self, target: Callable[[], None]) -> None:
        try:
            target()
        except OSError:
            self.abort()
        finally:
            self._thread_exit()

    def _thread_exit(self) -> None:
        with self._lock:
            self._running -= 1
            last = self._running == 0
        if last:
            self._client.close()
            if self._upstream is not None:
                self._upstream.close()
            self._shared.forget(self)

    def _run(self) -> None:
        """Pay the handshake delay, connect upstream, then relay both directions."""
        shaping = self._shared.shaping
        if shaping.delay_ms and self._shared.stopping.wait(2 * shaping.delay_ms / 1000.0):
            return
        upstream = socket.create_connection(self._shared.target, timeout=_CONNECT_TIMEOUT_S)
        upstream.settimeout(None)
        _nodelay(upstream)
        with self._lock:
            self._upstream = upstream
            aborted = self._aborted
        if aborted:
            return
        self._to_upstream = self._make_link(upstream, shaping, "send-up")
        self._to_client = self._make_link(self._client, shaping, "send-down")
        self._spawn(self._pump_up, "up")
        self._pump_down()

    def _make_link(self, sock: socket.socket, shaping: Shaping, role: str) -> Link:
        link: Link = DelayedLink(sock, shaping, self._spawn, role) if shaping.active else DirectLink(sock)
        with self._lock:
            self._links.append(link)
            aborted = self._aborted
        if aborted:  # abort() ran before this link existed
            link.close()
        return link

    def _pump_up(self) -> None:
        """Client to server: frame requests, apply request faults, forward."""
        framer = self._framer = RequestFramer(self._on_request_head)
        counters, recv, link = self._shared.counters, self._client.recv, self._to_upstream
        while True:
            data = recv(_RECV_SIZE)
            if not data:
                break
            counters.add_up(len(data))
            out = framer.feed(data)
            if out:
                link.send(out)
        link.call(self._half_close_upstream)
        link.finish()

    def _pump_down(self) -> None:
        """Server to client: forward, firing an armed response fault at its threshold."""
        counters, recv, link = self._shared.counters, self._upstream_recv(), self._to_client
        while True:
            data = recv(_RECV_SIZE)
            if not data:
                break
            armed = self._armed
            if armed is not None:
                data, fire = armed.split(data)
                if fire:
                    self._fire(armed.fault, data)
                    return
            counters.add_down(len(data))
            link.send(data)
        link.call(self._half_close_client)
        link.finish()

    def _upstream_recv(self) -> Callable[[int], bytes]:
        assert self._upstream is not None
        return self._upstream.recv

    def _fire(self, fault: Fault, last: bytes) -> None:
        """Forward the last allowed bytes, then queue the fault's action."""
        self._armed = None
        if last:
            self._shared.counters.add_down(len(last))
            self._to_client.send(last)
        if fault.kind == RESET:
            self._to_client.call(lambda: self.abort(rst=True))
        elif fault.kind == TRUNCATE:
            self._to_client.call(self.abort)
        else:
            self._to_client.call(lambda: self._stall(fault.seconds))
        self._to_client.finish()

    def _stall(self, seconds: float) -> None:
        self._shared.stopping.wait(seconds)
        self.abort()

    def _on_request_head(self, head: RequestHead) -> bool:
        """Count the request and decide its fate; False swallows it."""
        counters = self._shared.counters
        counters.add_request(head.method)
        fault = self._shared.faults.take(head.method, head.target)
        if fault is None:
            self._armed = None
            return True
        counters.add_fault()
        if fault.kind == CORRUPT:
            self._armed = None
            self._framer.flip = fault.after_bytes
            return True
        if fault.kind != STATUS:
            self._armed = _Armed(fault)
            return True
        self._armed = None
        close = head.expect_continue
        response = status_response(fault, head, close)
        counters.add_down(len(response))
        self._to_client.send(response)
        if close:
            self._to_client.call(self.abort)
        return False

    def _half_close_upstream(self) -> None:
        if self._upstream is not None:
            _quietly(lambda: self._upstream.shutdown(socket.SHUT_WR))  # type: ignore[union-attr]

    def _half_close_client(self) -> None:
        _quietly(lambda: self._client.shutdown(socket.SHUT_WR))


# --------------------------------------------------------------------------- proxy


class TcpProxy:
    """A TCP relay on ``127.0.0.1:<free port>`` to ``target``.

    Use as a context manager, or call `start` / `stop`. Counters and faults are
    safe to use from any thread while traffic flows.

    ``shaping`` (see `Shaping`) emulates a WAN path: one-way delay and jitter on
    every chunk in both directions (without limiting throughput), a bandwidth cap
    per direction, plus one round trip before a new connection is relayed,
    emulating the TCP handshake. ``delay_ms`` alone is ``Shaping(delay_ms)``;
    ``--rtt-ms 4`` is ``delay_ms=2``.
    """

    def __init__(self, target: Tuple[str, int], *, delay_ms: float = 0.0,
                 shaping: Optional[Shaping] = None, host: str = "127.0.0.1") -> None:
        if shaping is not None and delay_ms:
            raise ValueError("give delay_ms or shaping, not both")
        self.target = (target[0], int(target[1]))
        self.shaping = shaping if shaping is not None else Shaping(float(delay_ms))
        self.delay_ms = self.shaping.delay_ms
        self.host = host
        self.port = 0
        self._counters = Counters()
        self._faults = FaultBook()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._live: Set[_Connection] = set()
        self._peak = 0
        self._listener: Optional[socket.socket] = None
        self._acceptor: Optional[threading.Thread] = None

    # -- lifecycle

    def __enter__(self) -> "TcpProxy":
        return self.start()

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.stop()

    def start(self) -> "TcpProxy":
        """Bind the listener and start accepting; returns self."""
        if self._listener is not None:
            raise RuntimeError("proxy already started")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((self.host, 0))
        listener.listen(512)
        listener.settimeout(_ACCEPT_POLL_S)
        self._listener, self.port = listener, listener.getsockname()[1]
        shared = _Shared(
            target=self.target, shaping=self.shaping, counters=self._counters,
            faults=self._faults, stopping=self._stopping, forget=self._forget,
            name=f"tcpproxy-{self.port}",
        )
        self._acceptor = threading.Thread(target=self._accept_loop, args=(listener, shared),
                                          name=f"tcpproxy-{self.port}-accept", daemon=True)
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Close the listener and every live connection; join the threads.

        Idempotent. Threads are daemons, so a thread that fails to exit within
        the join timeout cannot hang the interpreter.
        """
        if self._listener is None or self._stopping.is_set():
            return
        self._stopping.set()
        if self._acceptor is not None:
            self._acceptor.join(_JOIN_TIMEOUT_S)
        self._listener.close()
        with self._lock:
            live = list(self._live)
        for conn in live:
            conn.abort()
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        for thread in itertools.chain.from_iterable(c.threads() for c in live):
            thread.join(max(0.0, deadline - time.monotonic()))

    # -- addresses

    @property
    def address(self) -> Tuple[str, int]:
        """``(host, port)`` the proxy listens on."""
        return (self.host, self.port)

    def url(self, scheme: str = "http") -> str:
        """``scheme://127.0.0.1:PORT``."""
        return f"{scheme}://{self.host}:{self.port}"

    # -- counters

    @property
    def connections(self) -> int:
        """Client connections accepted."""
        return int(self._counters.snapshot()["connections"])

    @property
    def requests(self) -> int:
        """HTTP request heads seen from clients (including ones a fault answered)."""
        return int(self._counters.snapshot()["requests"])

    @property
    def requests_by_method(self) -> Dict[str, int]:
        """A copy of the per-method request counts."""
        return dict(self._counters.snapshot()["requests_by_method"])

    @property
    def bytes_up(self) -> int:
        """Bytes received from clients."""
        return int(self._counters.snapshot()["bytes_up"])

    @property
    def bytes_down(self) -> int:
        """Bytes handed to clients (relayed plus synthetic fault responses)."""
        return int(self._counters.snapshot()["bytes_down"])

    @property
    def open_connections(self) -> int:
        """Client connections currently being relayed."""
        with self._lock:
            return len(self._live)

    @property
    def peak_open_connections(self) -> int:
        """The most client connections relayed at once since start (or reset_counters)."""
        with self._lock:
            return self._peak

    def reset_counters(self) -> None:
        """Zero all counters (faults are unaffected)."""
        self._counters.reset()
        with self._lock:
            self._peak = len(self._live)

    def snapshot(self) -> Dict[str, Any]:
        """All counters at one instant: connections, requests,
        requests_by_method, bytes_up, bytes_down, faults_triggered."""
        return self._counters.snapshot()

    # -- faults

    def set_faults(self, faults: Iterable[Fault]) -> None:
        """Replace the pending faults. Each request takes the first pending
        fault whose match fits it; a fault is dropped after ``times`` hits."""
        self._faults.replace(faults)

    def clear_faults(self) -> None:
        """Drop all pending faults."""
        self._faults.replace(())

    def pending_faults(self) -> int:
        """Hits left over all pending faults."""
        return self._faults.pending()

    # -- internals

    def _accept_loop(self, listener: socket.socket, shared: _Shared) -> None:
        numbers = itertools.count(1)
        while not self._stopping.is_set():
            try:
                client, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stopping.wait(0.05):
                    return
                continue
            self._admit(_Connection(shared, client, next(numbers)), client)

    def _admit(self, conn: _Connection, client: socket.socket) -> None:
        client.settimeout(None)
        _nodelay(client)
        self._counters.add_connection()
        with self._lock:
            if self._stopping.is_set():  # stop() has already taken its snapshot
                client.close()
                return
            self._live.add(conn)
            self._peak = max(self._peak, len(self._live))
        conn.start()

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._live.discard(conn)


