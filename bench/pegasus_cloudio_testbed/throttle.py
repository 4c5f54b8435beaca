"""A rate-limiting front for MinIO, fake-gcs-server or Azurite: a store that says "slow down".

`ThrottleFront` is an HTTP/1.1 reverse proxy on ``127.0.0.1:<free port>`` (or another local
address: the bridge of network-namespace nodes). Each request is
charged to its prefix (see `throttle_policy.prefix_of`): within the prefix's token bucket
(``rate`` per second, ``burst`` at once) it goes to the store unchanged (Host included, since
SigV4 signs it); beyond it the front answers itself, as S3 (``503 SlowDown``) or GCS (``429``
``rateLimitExceeded``) would, with ``Retry-After`` if asked, and reads and drops the request's
body so the connection stays usable.

Clients pipeline, so answers must leave in request order. Per client connection one thread
reads requests and queues a slot per request (the front's own answer, or "the store's next
response"); a second thread empties the queue in order, framing the store's responses with
`ResponseRelay`. Each client connection has one upstream connection, opened on its first
forwarded request and kept alive.
"""

from __future__ import annotations

import itertools
import queue
import socket
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Callable, Dict, List, Optional, Set, Tuple, Type, Union

from pegasus_cloudio_testbed.httpframe import RequestFramer, RequestHead
from pegasus_cloudio_testbed.responseframe import ResponseRelay
from pegasus_cloudio_testbed.throttle_policy import SHAPES, PrefixLimiter, prefix_of, throttle_answer

__all__ = ["ThrottleFront"]

_RECV_SIZE = 128 * 1024
_ACCEPT_POLL_S = 0.2
_CONNECT_TIMEOUT_S = 10.0
_JOIN_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class _Forward:
    """The store's next response answers this request."""
    method: str


@dataclass(frozen=True)
class _Answer:
    """The front's own answer; ``close`` ends the connection after it."""
    data: bytes
    close: bool


_RAW = object()      # the stream stopped looking like HTTP: relay the rest as bytes
_END = object()      # the client is done sending
_Slot = Union[_Forward, _Answer, object]


@dataclass(frozen=True)
class _Config:
    target: Tuple[str, int]
    limiter: PrefixLimiter
    shape: str
    status: int
    retry_after: Optional[float]
    depth: int


def _quietly_shutdown(sock: Optional[socket.socket], how: int = socket.SHUT_RDWR) -> None:
    if sock is not None:
        try:
            sock.shutdown(how)
        except OSError:
            pass


class _Connection:
    """One client connection: a reader thread (requests in) and a writer thread (answers out)."""

    def __init__(self, config: _Config, client: socket.socket, name: str) -> None:
        self._config, self._client, self._name = config, client, name
        self._upstream: Optional[socket.socket] = None
        self._slots: "queue.Queue[_Slot]" = queue.Queue()
        self._lock = threading.Lock()
        self._running = 2
        self._raw_queued = False
        self.threads = [threading.Thread(target=self._guard, args=(run,), name=f"{name}-{role}", daemon=True)
                        for run, role in ((self._read_requests, "in"), (self._write_answers, "out"))]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def abort(self) -> None:
        """Wake both threads; the last to leave closes the sockets."""
        _quietly_shutdown(self._client)
        _quietly_shutdown(self._upstream)
        self._slots.put(_END)

    def _guard(self, run: Callable[[], None]) -> None:
        try:
            run()
        except (OSError, EOFError, ValueError):
            self.abort()
        finally:
            with self._lock:
                self._running -= 1
                last = self._running == 0
            if last:
                self._client.close()
                if self._upstream is not None:
                    self._upstream.close()

    def _read_requests(self) -> None:
        framer = RequestFramer(self._on_head)
        try:
            while True:
                data = self._client.recv(_RECV_SIZE)
                if not data:
                    break
                out = framer.feed(data)
                if framer.raw and not self._raw_queued:
                    self._connect()
                    self._raw_queued = True
                    self._slots.put(_RAW)
                if out:
                    assert self._upstream is not None
                    self._upstream.sendall(out)
        finally:
            self._slots.put(_END)
            _quietly_shutdown(self._upstream, socket.SHUT_WR)

    def _on_head(self, head: RequestHead) -> bool:
        config = self._config
        if config.limiter.admit(prefix_of(head.target, config.depth)):
            self._connect()
            self._slots.put(_Forward(head.method))
            return True
        close = head.expect_continue  # it may never send the body we would have to drop
        answer = throttle_answer(config.shape, config.status, config.retry_after, head, close)
        self._slots.put(_Answer(answer, close))
        return False

    def _connect(self) -> None:
        if self._upstream is None:
            upstream = socket.create_connection(self._config.target, timeout=_CONNECT_TIMEOUT_S)
            upstream.settimeout(None)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._upstream = upstream

    def _write_answers(self) -> None:
        relay: Optional[ResponseRelay] = None
        try:
            while True:
                slot = self._slots.get()
                if slot is _END:
                    return
                if isinstance(slot, _Answer):
                    self._client.sendall(slot.data)
                    if slot.close:
                        return
                    continue
                if relay is None:
                    assert self._upstream is not None
                    relay = ResponseRelay(self._upstream.recv, self._client.sendall)
                if slot is _RAW:
                    relay.relay_rest()
                    return
                assert isinstance(slot, _Forward)
                if not relay.relay_one(slot.method):
                    return
        finally:
            self.abort()


class ThrottleFront:
    """A rate-limiting reverse proxy on ``host`` (``127.0.0.1``) in front of ``target_host:target_port``.

    ``rate``: requests per second per prefix; ``burst``: tokens at once (default: one second's
    worth); ``shape``: ``"s3"`` (503 SlowDown XML), ``"gcs"`` (429 JSON rateLimitExceeded) or
    ``"azure"`` (503 ServerBusy XML, with ``x-ms-error-code``);
    ``status`` overrides the answer's code (GCS also answers 503); ``retry_after``: seconds to
    put in ``Retry-After``, or None for none; ``depth``: key directories in a prefix; ``clock``:
    the buckets' time source (tests pass one they advance by hand); ``trace``: keep each
    request's arrival for `arrivals` (``bench throttle --trace``).
    Use as a context manager; `endpoint` is the URL to give clients, `stats` the counts.
    """

    def __init__(self, target_host: str, target_port: int, *, rate: float,
                 burst: Optional[float] = None, shape: str = "s3",
                 retry_after: Optional[float] = None, status: Optional[int] = None,
                 depth: int = 1, clock: Callable[[], float] = time.monotonic, host: str = "127.0.0.1",
                 trace: bool = False) -> None:
        if shape not in SHAPES:
            raise ValueError(f"ThrottleFront shape must be one of {', '.join(SHAPES)}, not {shape!r}")
        code = status if status is not None else (429 if shape == "gcs" else 503)
        self._limiter = PrefixLimiter(rate, burst if burst is not None else max(1.0, rate), clock, trace)
        self._config = _Config((target_host, int(target_port)), self._limiter, shape, code,
                               retry_after, depth)
        self.host, self.port = host, 0
        self._lock = threading.Lock()
        self._live: Set[_Connection] = set()
        self._stopping = threading.Event()
        self._listener: Optional[socket.socket] = None
        self._acceptor: Optional[threading.Thread] = None
        self._connections = 0

    def __enter__(self) -> "ThrottleFront":
        return self.start()

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """``http://HOST:PORT``."""
        return f"http://{self.host}:{self.port}"

    def stats(self) -> Dict[str, object]:
        """Requests and throttled answers in total and per prefix, and client connections:
        ``{"requests", "throttled", "connections", "prefixes": {prefix: {"requests", "throttled"}},
        "throttled_by_second"}`` (the throttled answers in each second from the first request)."""
        counts = self._limiter.stats()
        with self._lock:
            counts["connections"] = self._connections
        return counts

    def arrivals(self) -> List[Tuple[float, bool]]:
        """With ``trace``: (epoch seconds, passed) of each request, in the order they came."""
        return self._limiter.arrivals()

    def reset_stats(self) -> None:
        """Zero the counts; the token buckets keep their state."""
        self._limiter.reset()
        with self._lock:
            self._connections = 0

    def start(self) -> "ThrottleFront":
        """Bind, start accepting; returns self."""
        if self._listener is not None:
            raise RuntimeError("throttle front already started")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((self.host, 0))
        listener.listen(1024)
        listener.settimeout(_ACCEPT_POLL_S)
        self._listener, self.port = listener, listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, args=(listener,),
                                          name=f"throttle-{self.port}-accept", daemon=True)
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Close the listener and every connection; join their threads. Idempotent."""
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
        threads: List[threading.Thread] = list(itertools.chain.from_iterable(c.threads for c in live))
        for thread in threads:
            thread.join(_JOIN_TIMEOUT_S)

    def _accept_loop(self, listener: socket.socket) -> None:
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
            client.settimeout(None)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self._config, client, f"throttle-{self.port}-{next(numbers)}")
            with self._lock:
                self._connections += 1
                self._live.add(conn)
            conn.start()
            self._prune()

    def _prune(self) -> None:
        """Forget connections whose threads are gone (stop joins only the live ones)."""
        with self._lock:
            self._live = {c for c in self._live if any(t.is_alive() for t in c.threads)}
