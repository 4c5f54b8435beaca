"""A thread-safe pool of keep-alive connections to one endpoint.

Sized to the number of threads that use it: up to ``max_idle`` connections are kept for
reuse, so a batch run with N threads opens N connections, not one per request. A request
on a reused connection that the server had already closed is retried once on a fresh
connection (the only retry at this level; per-file retries live in the engine).
"""

from __future__ import annotations

import _queue
import sys

from transfer import _threads
from transfer.errors import InvalidInput, TransferError, TransientError
from transfer.http.connection import (
    Body,
    Connection,
    FileRegion,
    Response,
    StaleConnection,
    Timeouts,
)
from transfer.http.sockets import dial_ahead, hung_up, start_handshake

TYPE_CHECKING = False
if TYPE_CHECKING:
    import _socket
    import ssl
    from typing import Callable, List, Optional, Tuple

    from transfer.http.message import HeaderList
    from transfer.http.proxy import Proxy


class PoolStats:
    """Counters a benchmark reads: connections opened and requests sent; and, once
    :meth:`meter` is called, the body bytes moved (what a progress line shows)."""

    __slots__ = ("connections_opened", "requests_sent", "_lock", "_metered", "_moved_before")

    def __init__(self) -> None:
        self.connections_opened = 0
        self.requests_sent = 0
        self._lock = _threads.Lock()
        self._metered: Optional[List[Connection]] = None  # None: nothing followed (a job's default)
        self._moved_before = 0  # the bytes of followed connections since closed

    def count(self, *, connections: int = 0, requests: int = 0) -> None:
        with self._lock:
            self.connections_opened += connections
            self.requests_sent += requests

    def count_request(self) -> None:
        """``count(requests=1)``, once per request."""
        with self._lock:
            self.requests_sent += 1

    def opened(self, conn: Connection) -> None:
        """``count(connections=1)`` for a pool's new ``conn``, followed for :meth:`bytes_moved`
        when metering."""
        with self._lock:
            self.connections_opened += 1
            if self._metered is not None:
                self._metered.append(conn)

    def meter(self) -> None:
        """Follow the connections opened from now on: their body bytes add up in
        :meth:`bytes_moved`. Off by default, so that a job that shows no progress keeps no list."""
        with self._lock:
            if self._metered is None:
                self._metered = []

    def bytes_moved(self) -> int:
        """Request and response body bytes moved on the connections opened since :meth:`meter`
        (0 before), read while they move: each connection's own count (``Connection.bytes_moved``,
        added to by the one thread holding it), closed ones folded into one total."""
        with self._lock:
            if self._metered is None:
                return 0
            live = []
            for conn in self._metered:
                if conn.live_socket is not None:  # (not is_open: one told to close may still be reading)
                    live.append(conn)
                else:  # closed for good: the pool never reopens a connection
                    self._moved_before += conn.bytes_moved
            self._metered = live
            return self._moved_before + sum(conn.bytes_moved for conn in live)


class ConnectionPool:
    """Keep-alive connections to ``scheme://host:port`` shared by all threads of a process."""

    def __init__(
        self,
        base_url: str,
        *,
        max_idle: int,
        ssl_context: Optional[ssl.SSLContext] = None,
        timeouts: Timeouts = Timeouts(),
        stats: Optional[PoolStats] = None,
        connect_to: Optional[Tuple[str, int]] = None,
        max_open: Optional[int] = None,
        proxy: Optional[Proxy] = None,
        warm: bool = True,
    ) -> None:
        """``max_open`` caps the connections in use at once (a request waits for a free one,
        up to the read timeout); ``max_idle`` how many are kept for reuse; ``proxy``: every
        connection goes through it (:mod:`transfer.http.proxy`); ``warm``: connections take
        the node stager's warm sockets (:mod:`transfer.http.warm`; False for other hosts than
        the stores', such as pool peers)."""
        self.scheme, self.host, self.port = _endpoint(base_url)
        self._connect_to = connect_to
        self._proxy = proxy
        self._warm = warm
        if self.scheme == "https" and ssl_context is None:
            import ssl
            ssl_context = ssl.create_default_context()
        self._ssl_context = ssl_context if self.scheme == "https" else None
        self._timeouts = timeouts
        self._max_idle = max(1, max_idle)
        self._idle: List[Connection] = []
        self._started: List[_socket.socket] = []  # connects started ahead, not taken yet
        self._dialling = 0  # connects another thread is starting ahead (dial_ahead)
        self._lock = _threads.Lock()
        self._max_open = max_open
        self._slots = _open_slots(max_open)
        self.stats = stats or PoolStats()

    def sibling(self, base_url: str, proxy: Optional[Proxy] = None) -> "ConnectionPool":
        """A pool for another endpoint with this one's limits, TLS context, timeouts and counters,
        through ``proxy`` (by default this pool's proxy if the scheme is the same, else none)."""
        if proxy is None and _origin(base_url)[0] == self.scheme:
            proxy = self._proxy
        return ConnectionPool(base_url, max_idle=self._max_idle, ssl_context=self._ssl_context,
                              timeouts=self._timeouts, stats=self.stats, max_open=self._max_open, proxy=proxy,
                              warm=self._warm)

    @property
    def proxy(self) -> Optional[Proxy]:
        return self._proxy

    @property
    def timeouts(self) -> Timeouts:
        return self._timeouts

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def dial_ahead(self, count: int) -> None:
        """Start connecting, without waiting, so that ``count`` connections of this pool's are
        on hand (idle ones, ones already started and a stager's warm ones count) when its next
        requests want them
        (:func:`~transfer.http.sockets.dial_ahead`: the connections made next take them,
        each checked connected then; :meth:`close` closes those none took). Over TLS, the
        first one taken starts the others' handshakes (:func:`~transfer.http.sockets.start_handshake`),
        so connections made one after another wait on their round trips together. Those the
        store closed since an earlier call are closed and dialled again. The node stager's
        warm sockets (:mod:`transfer.http.warm`) are taken first. Within
        ``max_open``: connections leased, idle, started or being started (by another thread)
        count against it, so fewer, or none, are started while others are in use (a request
        could not lease more before those come back). Not through a proxy: a proxied
        connection is the proxy's tunnel, opened when it is needed."""
        if self._proxy is not None:
            return
        with self._lock:
            self._drop_hung_up()
            wanted = self._room(count)
            if wanted <= 0:
                return
            self._dialling += wanted
        started: List[_socket.socket] = []
        try:
            started = dial_ahead(self._connect_to or (self.host, self.port), wanted)
        finally:
            with self._lock:
                self._dialling -= wanted
                kept = max(0, self._room(count))  # a request that leased meanwhile dialled its own
                self._started.extend(started[:kept])
            for sock in started[kept:]:
                sock.close()

    def _drop_hung_up(self) -> None:
        """Close the connections dialled ahead that the store closed before any was taken
        (its idle timeout, in a process that goes on long); called under the lock."""
        kept = []
        for sock in self._started:
            if hung_up(sock):
                sock.close()
            else:
                kept.append(sock)
        self._started = kept

    def _room(self, count: int) -> int:
        """How many more connections to start for ``count`` to be on hand, within the free
        ``max_open`` slots (leased connections hold the others); called under the lock."""
        on_hand = len(self._idle) + len(self._started) + self._dialling + self._warm_waiting()
        if self._slots is not None:
            count = min(count, self._slots.qsize())
        return count - on_hand

    def _warm_waiting(self) -> int:
        """The node stager's sockets to this pool's address not taken yet (they come first:
        connected before the job began; :mod:`transfer.http.warm`, consulted only when loaded)."""
        warm = sys.modules.get("transfer.http.warm") if self._warm else None
        return warm.on_hand(self._connect_to or (self.host, self.port)) if warm is not None else 0

    def _new_connection(self, ahead: bool = True) -> Connection:
        """A connected connection: on a socket dialled ahead when ``ahead`` (and no stager's
        warm socket waits), else dialled now (the retry after a stale one: those dialled
        ahead are as old as the one that failed, and may be closed as well). Those dialled ahead
        that the store closed meanwhile are dropped first: taking one costs a failed connect
        check, or over TLS a failed handshake."""
        with self._lock:
            if ahead:
                self._drop_hung_up()
            started = self._started.pop() if ahead and self._started and not self._warm_waiting() else None
            if started is not None and self._ssl_context is not None:  # the others' handshakes overlap this one's
                self._started = [start_handshake(sock, self._ssl_context, self.host) for sock in self._started]
        conn = Connection(self.host, self.port, ssl_context=self._ssl_context, timeouts=self._timeouts,
                          connect_to=self._connect_to, proxy=self._proxy, started=started, warm=self._warm)
        conn.connect()
        self.stats.opened(conn)
        return conn

    def _checkout(self) -> Connection:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if conn.is_open:
                    return conn
        return self._new_connection()

    def _take_slot(self) -> None:
        if self._slots is not None:
            try:
                self._slots.get(timeout=self._timeouts.read)
            except _queue.Empty:
                raise TransientError(f"all {self._max_open} connections stayed busy for {self._timeouts.read:.0f} s",
                                     url=self.base_url, operation="connect") from None

    def _give_slot(self) -> None:
        if self._slots is not None:
            self._slots.put(None)

    def lease(self, wait: bool = True) -> Optional[Connection]:
        """A connected connection of this pool's, taken out of it (and counted against
        ``max_open``) until :meth:`release`; None when ``wait`` is false and every one is busy.
        Raises TransientError when none could be had (busy for the read timeout, or no connect)."""
        if not wait and self._slots is not None:
            try:
                self._slots.get_nowait()
            except _queue.Empty:
                return None
        else:
            self._take_slot()
        try:
            return self._checkout()
        except BaseException:
            self._give_slot()
            raise

    def release(self, conn: Connection) -> None:
        """Give back a leased connection: kept for reuse when it is open and clean (its last
        response read whole; else the caller closes it first)."""
        self._checkin(conn)

    def _checkin(self, conn: Connection) -> None:
        """Keep ``conn`` for reuse (if open and room) and free its slot."""
        try:
            if not conn.is_open:
                return
            with self._lock:
                if len(self._idle) < self._max_idle:
                    self._idle.append(conn)
                    return
            conn.close()
        finally:
            self._give_slot()

    def request(
        self,
        method: str,
        target: str,
        headers: HeaderList = (),
        body: Body = None,
    ) -> "PooledResponse":
        """Send a request; the caller must read or discard the body (``with`` does it), which
        gives the connection back."""
        header_list = headers if type(headers) is list else list(headers)  # sent twice on a stale connection
        self._take_slot()
        conn: Optional[Connection] = None
        try:
            conn = self._checkout()
            try:
                response = conn.request(method, target, header_list, body)
            except StaleConnection:
                conn = self._new_connection(ahead=False)
                response = conn.request(method, target, header_list, body)
        except BaseException as err:
            if conn is not None and isinstance(err, InvalidInput):
                self._checkin(conn)  # refused before sending: the connection is still clean
            else:
                if conn is not None:
                    conn.close()  # an interrupted exchange leaves it in an unknown state
                self._give_slot()
            raise
        finally:
            self.stats.count_request()
        return PooledResponse(response, self._checkin, conn)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            started, self._started = self._started, []
        for conn in idle:
            conn.close()
        for sock in started:
            sock.close()


class PooledResponse:
    """A response that returns its connection to the pool once its body is consumed."""

    __slots__ = ("_response", "_release", "_conn", "status", "headers")

    def __init__(self, response: Response, release: Callable[[Connection], None], conn: Connection) -> None:
        """``release(conn)`` gives the connection back, once the body is consumed."""
        self._response = response
        self._release: Optional[Callable[[Connection], None]] = release
        self._conn = conn
        self.status = response.status
        self.headers = response.headers

    @property
    def reason(self) -> str:
        return self._response.reason

    def read(self) -> bytes:
        try:
            return self._response.read()
        finally:
            self._finish()

    def read_into(self, write: Callable[[bytes], object], url: Optional[str] = None) -> int:
        """Stream the body to ``write``. A cut body raises naming ``url`` (the object, not
        just the endpoint, which the message keeps)."""
        try:
            return self._response.read_into(write)
        except TransferError as err:
            raise _naming(err, url) from err
        finally:
            self._finish()

    def read_part(self, length: int, write: Callable[[bytes], object], url: Optional[str] = None) -> int:
        """The next ``length`` body bytes to ``write``; the connection goes back once the
        body is complete (or on an error, closed). A cut body raises naming ``url``."""
        try:
            count = self._response.read_part(length, write)
        except TransferError as err:
            self._finish()
            raise _naming(err, url) from err
        except BaseException:
            self._finish()
            raise
        if self._response.complete:
            self._finish()
        return count

    def discard(self) -> None:
        try:
            self._response.discard()
        finally:
            self._finish()

    def _finish(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release(self._conn)

    def __enter__(self) -> "PooledResponse":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._response.complete:
            self.discard()
        else:
            self._finish()


def _endpoint(base_url: str) -> Tuple[str, str, int]:
    """(scheme, host, port) of an http(s) ``base_url``; :class:`InvalidInput` for another."""
    scheme, host, port = _origin(base_url)
    if scheme not in ("http", "https") or not host:
        raise InvalidInput("endpoint must be http://HOST[:PORT] or https://HOST[:PORT]",
                           url=base_url, operation="connect")
    return scheme, host, port or (443 if scheme == "https" else 80)


def _open_slots(max_open: Optional[int]) -> Optional[_queue.SimpleQueue[None]]:
    """A token per connection that may be open at once (None: no cap). A C queue: a
    semaphore runs a condition variable's Python code on every request."""
    if not max_open:
        return None
    slots: _queue.SimpleQueue[None] = _queue.SimpleQueue()
    for _ in range(max_open):
        slots.put(None)
    return slots


def _origin(base_url: str) -> Tuple[str, str, Optional[int]]:
    """(scheme, host, port) as ``urlsplit`` reads them; plain ``scheme://host[:port][/]`` without
    importing ``urllib.parse`` (it imports ``re``), anything else through it."""
    scheme, sep, rest = base_url.partition("://")
    body = rest[:-1] if rest.endswith("/") else rest
    host, colon, port = body.partition(":")
    if sep and scheme.isalpha() and host and body.isprintable() and not any(c in body for c in " []@?#/\\") \
            and (not colon or (port.isascii() and port.isdigit() and int(port) < 65536)):
        return scheme.lower(), host.lower(), int(port) if port else None
    from urllib.parse import urlsplit
    parts = urlsplit(base_url)
    return parts.scheme, parts.hostname or "", parts.port


__all__ = ["ConnectionPool", "PooledResponse", "PoolStats", "FileRegion", "Timeouts"]


def _naming(err: TransferError, url: Optional[str]) -> TransferError:
    """``err`` naming the object ``url`` (the endpoint it came from stays in the message)."""
    if url is None or err.url == url:
        return err
    return err.relabelled(url=url, operation=err.operation or "get", message=f"{err.message} (from {err.url})")
