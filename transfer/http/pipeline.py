"""Many small GETs from one thread: HTTP/1.1 pipelining over a few keep-alive connections.

Why: a small GET through worker threads costs the client more CPU in hand-offs than in the
request itself: the interpreter lock changes hands at every system call of five threads
(18 futex calls per file), and every request is one send and one receive. Here the calling
thread keeps up to ``depth`` requests in flight on each of up to ``connections`` keep-alive
connections leased from the pool (plain or TLS), writes each connection's new requests in one
send, and parses every response that one receive brought (RFC 9112, section 9.3.2: a server
answers pipelined requests in order; GET is idempotent, so unanswered ones may be sent again).

Contract of :func:`fetch` (never raises for the network or the server):

* each item (an index) is either taken -- ``deliver(index, status, headers, body, sent)``
  called once, in this thread, with a whole Content-Length body of at most ``max_body``
  bytes and the monotonic time its request went out, returned True -- or returned among the
  indexes left over, for the caller's ordinary one-request path, which makes its own
  attempts and reports its own errors;
* a connection closed or reset with requests unanswered: those are sent again on a new
  connection, each at most ``_MAX_SENDS`` times in all (then left over); a fresh connection
  that closes before answering anything is not replaced; once a server closed two
  connections after ``n`` answers each (a keep-alive request limit), no connection carries
  more than ``n``;
* left over as well: an answer this reader does not take (chunked or close-delimited body,
  a body over ``max_body``, a malformed head) and, after ``_MAX_UNREADABLE`` such answers,
  everything not yet answered (large objects are the ordinary path's: ranged reads); every
  item of a run that heard nothing for the pool's read timeout or, once anything was
  answered, for ``_STALL_FACTOR`` times the slowest answer so far (``_STALL_MIN`` seconds at
  the least) when that is shorter: an intermediary that drops pipelined requests costs
  seconds, not the read timeout, and a false alarm costs a second request for each item left
  over; everything not answered once ``cancel`` is set;
* a ``head(index)`` or ``deliver`` that raises leaves that item over (the ordinary path meets
  the same error and reports it); a ``deliver`` that raises :class:`GiveUp` ends the run:
  everything not yet taken is left over;
* a ``head(index)`` may wait (a paced pass: its request's token): a head that took longer
  than ``_WAITED`` goes out at once with those gathered before it, and the silence that ends
  a run is counted from the later of the last answer and the last send;
* an answer that says ``Connection: close`` (or HTTP/1.0) ends its connection: the requests it
  carried after it go out again elsewhere, and the connection is closed, never given back to
  the pool, whatever ``deliver`` did (moto answers a bad signature with 403 and close, and a
  pooled connection then held the next request for the whole read timeout);
* a connection starts with one request in flight and doubles that with each answer taken, up
  to ``depth`` (a store that answers nothing useful costs one request per connection); with
  ``eager``, each of the first connections starts with ``depth`` (a caller whose objects were
  just listed, waiting on round trips: they all go out at once, and a store that answers
  nothing useful costs ``depth`` requests per connection); a connection opened to replace one
  the server closed starts with one again; a connection is topped up, in one send, once half
  its requests are answered (the other half keep it busy meanwhile: one thread serves every
  connection); connections come back to the pool clean, or closed;
* memory is bounded: the requests sent and not yet answered (heads and bodies: a PUT's body is
  part of its request) come to at most ``max_bytes`` in all, but for a single larger request
  sent alone; a request made and held back by that cap is the only one kept for later (it goes
  out first, on whichever connection has room); an answer is kept only until it is whole, so
  the answers held are at most one partly received per connection (``max_body`` plus one
  receive), whatever ``depth``.
"""

from __future__ import annotations

import _socket
import select
import time
from collections import deque

from transfer.errors import TransferError
from transfer.http.message import header_lines, status_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Deque, Dict, List, Optional, Tuple

    from transfer._threads import Cancel
    from transfer.http.connection import Connection
    from transfer.http.pool import ConnectionPool

    Deliver = Callable[[int, int, Dict[str, str], bytes, float], bool]

__all__ = ["GiveUp", "fetch"]

_MAX_HEAD = 65536
_RECEIVE = 1 << 18
_MAX_SENDS = 3
_MAX_UNREADABLE = 2
_STALL_MIN = 5.0  # seconds of silence, at the least, after which a run that was answered gives up
_STALL_FACTOR = 10
_CANCEL_POLL_S = 0.5
_WAITED = 0.01  # seconds a head() took, past which it waited (for its token: a paced pass)
_DONTWAIT = getattr(_socket, "MSG_DONTWAIT", 0)
_SPREAD = 8  # items per connection, at least, before another connection is opened
MAX_BYTES = 64 << 20  # request bytes in flight at most, by default (module doc)


class GiveUp(Exception):
    """Raised by a ``deliver`` to end the run (its item and every unanswered one are left over)."""


class _Entry:
    """One item on its way: its index, how often it was sent, when last (monotonic seconds),
    and the bytes of its request as last sent."""

    __slots__ = ("index", "sends", "sent", "size")

    def __init__(self, index: int) -> None:
        self.index = index
        self.sends = 0
        self.sent = 0.0
        self.size = 0


class _Link:
    """A leased connection, its unparsed bytes and the requests it still owes answers to."""

    __slots__ = ("conn", "sock", "fd", "pending", "buffer", "waiting", "sent", "answered", "fresh", "alive", "limit",
                 "bytes")

    def __init__(self, conn: Connection, sock: _socket.socket, limit: int) -> None:
        self.conn = conn
        self.sock = sock
        self.fd = sock.fileno()
        # TLS: decrypted bytes a receive left in the TLS layer, which poll() cannot see
        self.pending: Optional[Callable[[], int]] = getattr(sock, "pending", None)
        self.buffer = bytearray()
        self.waiting: Deque[_Entry] = deque()
        self.sent = 0
        self.answered = 0
        self.fresh = not conn.reused  # a warm socket is one kept alive: it may be stale
        self.alive = True
        self.limit = limit  # requests in flight at most: doubled by each answer taken, up to the depth
        self.bytes = 0  # request bytes of ``waiting``

    def answered_one(self) -> _Entry:
        """The oldest request, answered: no longer waiting."""
        entry = self.waiting.popleft()
        self.bytes -= entry.size
        self.answered += 1
        return entry

    def forget(self) -> List[_Entry]:
        """Every request still waiting, no longer waiting on this link."""
        entries = list(self.waiting)
        self.waiting.clear()
        self.bytes = 0
        return entries


class _Run:
    """The state of one :func:`fetch`."""

    def __init__(self, pool: ConnectionPool, count: int, head: Callable[[int], bytes], deliver: Deliver,
                 depth: int, max_body: int, max_bytes: int) -> None:
        self.pool = pool
        self.pending: Deque[_Entry] = deque(_Entry(index) for index in range(count))
        self.head = head
        self.deliver = deliver
        self.depth = max(1, depth)
        self.max_body = max_body
        self.max_bytes = max_bytes
        self.ready: Optional[Tuple[_Entry, bytes]] = None  # a request made, held back by max_bytes
        self.left: List[int] = []
        self.links: Dict[int, _Link] = {}
        self.poller = select.poll()
        self.unreadable = 0
        self.cap = 0  # requests per connection after which the server closes them (0: none seen)
        self.closed_after: Dict[int, int] = {}  # answers -> connections closed after that many
        self.stopped = False  # a deliver gave up
        self.slowest = 0.0  # seconds from a request's send to its answer, the most seen
        self.last_send = 0.0  # monotonic time the last requests went out
        self.endpoint = pool.base_url

    # -- connections ------------------------------------------------------------------

    def open(self, wait: bool, limit: int = 1) -> bool:
        """Lease one more connection, to start with ``limit`` requests in flight; False when
        none is free (``wait`` false) or none connects."""
        try:
            conn = self.pool.lease(wait)
        except TransferError:
            return False
        if conn is None:
            return False
        sock = conn.live_socket
        if sock is None:
            self.pool.release(conn)
            return False
        link = _Link(conn, sock, limit)
        self.links[link.fd] = link
        self.poller.register(link.fd, select.POLLIN)
        return True

    def drop(self, link: _Link, close: bool = True) -> None:
        """Stop using ``link`` (its unanswered requests are the caller's to place first)."""
        link.alive = False
        self.poller.unregister(link.fd)
        del self.links[link.fd]
        if close:
            link.conn.close()
        self.pool.release(link.conn)

    def lost(self, link: _Link, suspect: bool = True) -> None:
        """``link`` is unusable (closed or reset by the server, or not trusted): its unanswered
        requests go out again on a new connection, each up to ``_MAX_SENDS`` sends, first in
        line but for the ``suspect`` one (the oldest, which the server may have closed over:
        it goes last, so it cannot take the others down with it again); a fresh link that
        answered nothing is not replaced."""
        if link.waiting and link.answered:  # a keep-alive request limit shows as the same count twice
            seen = self.closed_after[link.answered] = self.closed_after.get(link.answered, 0) + 1
            if seen >= 2 and (not self.cap or link.answered < self.cap):
                self.cap = link.answered
        waiting = link.forget()
        again = [entry for entry in waiting if entry.sends < _MAX_SENDS]
        self.left.extend(entry.index for entry in waiting if entry.sends >= _MAX_SENDS)
        if suspect and again and again[0] is waiting[0]:
            self.pending.append(again.pop(0))
        self.pending.extendleft(reversed(again))
        replace = link.answered > 0 or not link.fresh
        if not link.answered:
            link.conn.unanswered()  # the replacement dials: no other warm socket, as stale
        self.drop(link)
        if replace and self.has_work():
            self.open(wait=not self.links)

    def unreadable_answer(self, link: _Link) -> None:
        """The answer at the head of ``link`` is not read here (chunked, close-delimited, too
        large, malformed): its item goes to the ordinary path, and so does everything else
        once ``_MAX_UNREADABLE`` such answers came (large objects: ranged reads there)."""
        self.left.append(link.answered_one().index)
        self.unreadable += 1
        if self.unreadable >= _MAX_UNREADABLE:
            self.left.extend(entry.index for entry in link.forget())
            self.leave_unsent()
        self.lost(link, suspect=False)

    def leave_all(self) -> None:
        """Everything not yet answered goes to the ordinary path; clean connections go back
        to the pool, the others are closed."""
        for link in list(self.links.values()):
            clean = not link.waiting and not link.buffer
            self.left.extend(entry.index for entry in link.forget())
            self.drop(link, close=not clean)
        self.leave_unsent()

    def leave_unsent(self) -> None:
        """Every item not sent yet (the one held back included) goes to the ordinary path."""
        if self.ready is not None:
            self.left.append(self.ready[0].index)
            self.ready = None
        self.left.extend(entry.index for entry in self.pending)
        self.pending.clear()

    def has_work(self) -> bool:
        """Whether an item waits to be sent."""
        return bool(self.pending) or self.ready is not None

    def in_flight(self) -> int:
        """Request bytes sent and not yet answered, over every link."""
        return sum(link.bytes for link in self.links.values())

    # -- sending ----------------------------------------------------------------------

    def top_up(self) -> None:
        """Send on every link at most half full; replace the links the server's request limit
        has used up."""
        for link in list(self.links.values()):
            if self.cap and link.sent >= self.cap and not link.waiting:
                self.drop(link)
                if self.has_work():
                    self.open(wait=not self.links)
        for link in list(self.links.values()):
            if link.alive and self.has_work() and len(link.waiting) <= link.limit // 2:
                self.send(link)

    def make(self) -> Optional[Tuple[_Entry, bytes, bool]]:
        """The next request: (its entry, its bytes, whether its head waited); None when no item
        is left to send. An item whose head raised is left over."""
        if self.ready is not None:
            (entry, data), self.ready = self.ready, None
            return entry, data, False
        while self.pending:
            entry = self.pending.popleft()
            asked = time.monotonic()
            try:
                data = self.head(entry.index)
            except Exception:  # noqa: BLE001 - the ordinary path meets it again and reports it
                self.left.append(entry.index)
                continue
            return entry, data, time.monotonic() - asked > _WAITED
        return None

    def send(self, link: _Link) -> None:
        """Top ``link`` up to its limit of requests in flight and the run's of bytes, in one send."""
        heads: List[bytes] = []
        batch: List[_Entry] = []
        room = link.limit - len(link.waiting)
        if self.cap:
            room = min(room, self.cap - link.sent)
        load = self.in_flight()
        while len(batch) < room:
            made = self.make()
            if made is None:
                break
            entry, data, waited = made
            if load and load + len(data) > self.max_bytes:  # alone, a larger request still goes
                self.ready = (entry, data)
                break
            entry.size = len(data)
            load += entry.size
            heads.append(data)
            batch.append(entry)
            if waited:  # a paced head: its request goes out now, not with the next ones'
                break
        if not batch:
            return
        now = self.last_send = time.monotonic()
        for entry in batch:
            entry.sends += 1
            entry.sent = now
            link.bytes += entry.size
        link.waiting.extend(batch)
        link.sent += len(batch)
        link.conn.requests_sent += len(batch)
        self.pool.stats.count(requests=len(batch))
        try:
            link.sock.sendall(b"".join(heads))  # blocking, up to the kernel's send timeout
        except OSError:
            self.lost(link)

    # -- receiving --------------------------------------------------------------------

    def receive(self, link: _Link) -> None:
        try:
            data = _receive(link)
        except BlockingIOError:
            return
        except OSError:  # a reset, a timeout, a TLS failure: as if closed
            data = b""
        if not data:
            self.lost(link)
            return
        link.buffer += data
        used = self.parse(link)
        if not link.alive:
            return
        if used:
            del link.buffer[:used]
        if link.buffer and not link.waiting:  # bytes nobody asked for: the connection is not trusted
            self.lost(link)

    def parse(self, link: _Link) -> int:
        """Deliver every whole response in ``link``'s buffer; returns the bytes used."""
        buffer = link.buffer
        position = 0
        while link.waiting:
            end = buffer.find(b"\r\n\r\n", position, position + _MAX_HEAD)
            if end < 0:
                if len(buffer) - position >= _MAX_HEAD:
                    self.unreadable_answer(link)
                return position
            answer = self.answer_head(bytes(buffer[position:end + 2]))
            if answer is None:
                self.unreadable_answer(link)
                return position
            status, headers, length, closing = answer
            if status == 100:
                position = end + 4
                continue
            if length is None or length > self.max_body:
                self.unreadable_answer(link)
                return position
            start = end + 4
            if len(buffer) < start + length:
                return position
            position = start + length
            if not self.answered(link, status, headers, bytes(buffer[start:position]), closing):
                return position
        return position

    def answered(self, link: _Link, status: int, headers: Dict[str, str], body: bytes, closing: bool) -> bool:
        """Deliver one whole response, the answer to ``link``'s oldest request (see
        :func:`fetch`); whether parsing goes on on this link."""
        entry = link.waiting.popleft()  # link.answered_one(), spelt out: one call less per small GET
        link.bytes -= entry.size
        link.answered += 1
        link.conn.bytes_moved += len(body)  # the body, as Connection counts it
        took = time.monotonic() - entry.sent
        if took > self.slowest:
            self.slowest = took
        try:
            taken = self.deliver(entry.index, status, headers, body, entry.sent)
        except GiveUp:
            self.left.append(entry.index)
            self.stopped = True
            if closing:  # never back to the pool: the next request on it would wait out the read timeout
                self.left.extend(waiting.index for waiting in link.forget())
                self.drop(link)
            return False
        except Exception:  # noqa: BLE001 - the ordinary path meets it again and reports it
            taken = False
        if taken:
            link.limit = min(self.depth, 2 * link.limit)
        else:
            self.left.append(entry.index)
        if closing:  # the server closes after this answer: the rest go out again elsewhere
            self.lost(link, suspect=False)
            return False
        return True

    def answer_head(self, head: bytes) -> Optional[Tuple[int, Dict[str, str], Optional[int], bool]]:
        """(status, headers, body length or None, closes after it) of a head without its
        final CRLF; None for one this reader does not take (a bare LF, a bad status line, too
        many headers)."""
        if head.count(b"\n") != head.count(b"\r\n"):
            return None
        first = head.find(b"\n") + 1
        try:
            version, status, _ = status_line(head[:first], self.endpoint)
            headers = header_lines(head[first:].decode("latin-1").split("\r\n")[:-1], self.endpoint)
        except TransferError:
            return None
        closing = version == b"HTTP/1.0" or "close" in headers.get("connection", "").lower()
        if status == 100 or status in (204, 304):
            return status, headers, 0, closing and status != 100
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return status, headers, None, closing
        text = headers.get("content-length")
        return status, headers, int(text) if text is not None and text.isdigit() else None, closing


def _receive(link: _Link) -> bytes:
    """What has arrived on ``link``: plain sockets without waiting; TLS ones wait (up to the
    read timeout) for the rest of a record poll() saw the start of, then drain the TLS layer."""
    if link.pending is None:
        return link.sock.recv(_RECEIVE, _DONTWAIT)
    data = link.sock.recv(_RECEIVE)
    while data and link.pending():
        data += link.sock.recv(link.pending())
    return data


def fetch(pool: ConnectionPool, count: int, head: Callable[[int], bytes], deliver: Deliver, *,
          connections: int, depth: int, max_body: int, cancel: Optional[Cancel] = None,
          eager: bool = False, max_bytes: int = MAX_BYTES) -> List[int]:
    """Send requests ``0 .. count - 1`` (``head(index)`` gives each request: its head, and a
    PUT's body) and deliver their answers; returns the indexes left over for the ordinary path
    (see the module doc)."""
    if not count or not _DONTWAIT:
        return list(range(count))
    run = _Run(pool, count, head, deliver, depth, max_body, max_bytes)
    links = max(1, min(connections, -(-count // min(run.depth, _SPREAD))))
    try:
        while len(run.links) < links and run.open(wait=not run.links, limit=run.depth if eager else 1):
            pass
        read = pool.timeouts.read
        heard = time.monotonic()
        while run.links and not run.stopped:
            if cancel is not None and cancel.is_set():
                break
            run.top_up()
            if not any(link.waiting for link in run.links.values()):
                break
            quiet = min(read, max(_STALL_MIN, _STALL_FACTOR * run.slowest)) if run.slowest else read
            left = max(heard, run.last_send) + quiet - time.monotonic()  # (a paced head may wait long)
            if left <= 0:
                break  # nothing heard for that long: the ordinary path takes over
            # a cancel set by another thread is seen within _CANCEL_POLL_S
            events = run.poller.poll(int(1000 * (left if cancel is None else min(left, _CANCEL_POLL_S))) + 1)
            if not events:
                continue
            heard = time.monotonic()
            for fd, _ in events:
                ready = run.links.get(fd)
                if ready is not None and not run.stopped:
                    run.receive(ready)
    finally:
        run.leave_all()
    return sorted(run.left)
