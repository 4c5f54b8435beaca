"""transfer.http.pipeline against a scripted server: pipelined GETs are answered in order,
a connection closed mid-pipeline costs nothing but a resend of its unanswered requests,
and whatever the reader does not take (odd answers, no answer, a cancel) is handed back
for the ordinary path, never lost nor delivered twice."""

import select
import socket
import threading
import time

import pytest

from pegasus_cloudio_testbed.scripted import ScriptedServer
from transfer._threads import Event
from transfer.http.connection import Timeouts
from transfer.http.pipeline import GiveUp, fetch
from transfer.http.pool import ConnectionPool

CLOSE = object()


class RawServer(ScriptedServer):
    """Answers each request with ``answer(connection, nth_on_it, target)``: bytes to send,
    CLOSE to close the connection there, or (bytes, CLOSE) for both. Records how many requests
    had arrived unanswered each time it answered one (more than one: pipelining)."""

    def __init__(self, answer):
        super().__init__()
        self.answer = answer
        self.targets = []
        self.queued = []
        self._served = 0
        self.__enter__()

    def close(self):
        self.__exit__()

    def _serve(self, conn):
        with self._lock:
            self._served += 1
            number = self._served
        self._exchange(conn, number)

    def _exchange(self, conn, number):
        buffer, nth = b"", 0
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    try:
                        data = conn.recv(65536)
                    except OSError:  # reset by the client
                        return
                    if not data:
                        return
                    buffer += data
                with self._lock:
                    self.queued.append(buffer.count(b"\r\n\r\n"))
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                target = head.split(b" ")[1].decode()
                with self._lock:
                    self.targets.append(target)
                reply = self.answer(number, nth, target)
                nth += 1
                if reply is CLOSE:
                    return
                last = isinstance(reply, tuple)  # (bytes, CLOSE): send, then close
                reply = reply[0] if last else reply
                try:
                    conn.sendall(reply)
                except OSError:  # the client closed first
                    return
                if last:
                    return


def ok(target, extra=""):
    body = f"body of {target}".encode()
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}{extra}\r\n\r\n".encode() + body


def head(k):
    return f"GET /k{k} HTTP/1.1\r\nHost: test\r\n\r\n".encode()


class Taker:
    def __init__(self, refuse=()):
        self.taken = []
        self.refuse = set(refuse)

    def __call__(self, k, status, headers, body, sent):
        assert sent > 0
        if k in self.refuse or status != 200 or body != f"body of /k{k}".encode():
            return False
        self.taken.append(k)
        return True


def eager_pass(pool, count, connections, depth):
    """An eager pass of ``count`` items over ``pool``: every one is taken, once."""
    taker = Taker()
    assert fetch(pool, count, head, taker, connections=connections, depth=depth, max_body=1 << 20, eager=True) == []
    assert sorted(taker.taken) == list(range(count))


@pytest.fixture
def serve():
    servers = []

    def start(answer):
        server = RawServer(answer)
        servers.append(server)
        return server, ConnectionPool(server.endpoint, max_idle=4, max_open=4, timeouts=Timeouts(5, 5))

    yield start
    for server in servers:
        server.close()


def test_every_request_is_answered_once_over_few_pipelined_connections(serve):
    server, pool = serve(lambda number, nth, target: ok(target))
    taker = Taker()
    left = fetch(pool, 40, head, taker, connections=2, depth=8, max_body=1 << 20)
    assert left == [] and sorted(taker.taken) == list(range(40)) and len(set(taker.taken)) == 40
    assert server.connections == 2 and len(server.targets) == 40
    assert max(server.queued) > 1  # several requests were on the wire at once
    assert pool.stats.requests_sent == 40


def test_a_server_closing_after_three_answers_costs_only_resends(serve):
    server, pool = serve(lambda number, nth, target: CLOSE if nth == 3 else ok(target))
    taker = Taker()
    left = fetch(pool, 30, head, taker, connections=2, depth=8, max_body=1 << 20)
    assert left == [] and sorted(taker.taken) == list(range(30))  # each delivered exactly once
    assert server.connections >= 10
    assert 30 < len(server.targets) <= 30 + 2 * 5  # resent: what the first two carried past the limit


def test_fresh_connections_closed_before_any_answer_hand_everything_back(serve):
    server, pool = serve(lambda number, nth, target: CLOSE)
    taker = Taker()
    left = fetch(pool, 20, head, taker, connections=2, depth=4, max_body=1 << 20)
    assert left == list(range(20)) and taker.taken == []
    assert server.connections <= 2  # a connection that answered nothing is not replaced


def test_a_request_the_server_always_closes_over_is_handed_back_alone(serve):
    server, pool = serve(lambda number, nth, target: ok(target) if target != "/k5" else CLOSE)
    taker = Taker()
    left = fetch(pool, 12, head, taker, connections=1, depth=4, max_body=1 << 20)
    assert left == [5] and sorted(taker.taken) == [k for k in range(12) if k != 5]
    assert 2 <= server.targets.count("/k5") <= 3


def test_odd_answers_are_handed_back_and_the_rest_is_read(serve):
    def answer(number, nth, target):
        if target == "/k3":
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        return ok(target)

    server, pool = serve(answer)
    taker = Taker()
    left = fetch(pool, 10, head, taker, connections=1, depth=4, max_body=1 << 20)
    assert left == [3] and sorted(taker.taken) == [k for k in range(10) if k != 3]


def test_after_two_large_bodies_everything_unanswered_goes_to_the_ordinary_path(serve):
    def answer(number, nth, target):
        if target in ("/k2", "/k4"):
            return b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000
        return ok(target)

    server, pool = serve(answer)
    taker = Taker()
    left = fetch(pool, 20, head, taker, connections=1, depth=2, max_body=1000)
    assert 2 in left and 4 in left and sorted(left + taker.taken) == list(range(20))
    assert len(server.targets) < 20 + 4  # no more sending once it gave up


def test_connection_close_answers_are_taken_and_the_rest_resent(serve):
    server, pool = serve(lambda number, nth, target: ok(target, "\r\nConnection: close") if nth == 1 else ok(target))
    taker = Taker()
    left = fetch(pool, 16, head, taker, connections=1, depth=4, max_body=1 << 20)
    assert left == [] and sorted(taker.taken) == list(range(16))
    assert server.connections == 8


def test_bytes_that_belong_to_no_request_distrust_the_connection(serve):
    server, pool = serve(lambda number, nth, target: ok(target) + (ok("/extra") if target == "/k0" else b""))
    taker = Taker()
    left = fetch(pool, 6, head, taker, connections=1, depth=1, max_body=1 << 20)
    assert 0 in taker.taken and sorted(taker.taken + left) == list(range(6))
    assert server.connections >= 2


def test_a_refused_or_failing_delivery_hands_that_item_back(serve):
    server, pool = serve(lambda number, nth, target: ok(target))
    taker = Taker(refuse={1})

    def deliver(k, status, headers, body, sent):
        if k == 2:
            raise RuntimeError("a bug")
        return taker(k, status, headers, body, sent)

    left = fetch(pool, 5, head, deliver, connections=1, depth=8, max_body=1 << 20)
    assert left == [1, 2] and sorted(taker.taken) == [0, 3, 4]


def test_a_failing_head_hands_that_item_back_unsent(serve):
    server, pool = serve(lambda number, nth, target: ok(target))
    taker = Taker()

    def bad_head(k):
        if k == 3:
            raise ValueError("no")
        return head(k)

    left = fetch(pool, 6, bad_head, taker, connections=1, depth=8, max_body=1 << 20)
    assert left == [3] and "/k3" not in server.targets


def test_a_silent_server_hands_everything_back_after_the_read_timeout(serve):
    server, _ = serve(lambda number, nth, target: (threading.Event().wait(2), CLOSE)[1])  # reads, never answers
    pool = ConnectionPool(server.endpoint, max_idle=2, max_open=2, timeouts=Timeouts(5, 0.3))
    taker = Taker()
    assert fetch(pool, 4, head, taker, connections=1, depth=8, max_body=1 << 20) == [0, 1, 2, 3]
    assert taker.taken == []


def test_a_cancelled_run_hands_everything_back(serve):
    server, pool = serve(lambda number, nth, target: ok(target))
    cancel = Event()
    cancel.set()
    assert fetch(pool, 5, head, Taker(), connections=2, depth=8, max_body=1 << 20, cancel=cancel) == list(range(5))


def test_connections_go_back_to_the_pool_clean():
    server = RawServer(lambda number, nth, target: ok(target))
    try:
        pool = ConnectionPool(server.endpoint, max_idle=4, max_open=4)
        fetch(pool, 8, head, Taker(), connections=2, depth=8, max_body=1 << 20)
        with pool.request("GET", "/k0", [("Host", "test")]) as response:  # reuses a pipelined connection
            assert response.read() == b"body of /k0"
        assert server.connections == 1
    finally:
        server.close()


@pytest.mark.parametrize("cut", [b"HTTP/1.1 200 OK\r\nContent-Le", b"HTTP/1.1 200 OK\r\nETag: \"x\"\r\n"])
def test_a_response_cut_inside_its_head_is_an_error_not_an_empty_body(serve, cut):
    """The ordinary path too: a head that ends with the connection is no answer (it once read
    as a complete response with no length, an empty body, and an empty file)."""
    from transfer.errors import TransientError
    server, pool = serve(lambda number, nth, target: (cut, CLOSE))
    with pytest.raises(TransientError, match="inside the response head"):
        with pool.request("GET", "/k0", [("Host", "test")]) as response:
            response.read()


def test_a_delivery_that_gives_up_ends_the_run_and_hands_back_the_rest(serve):
    server, pool = serve(lambda number, nth, target: ok(target))
    taker = Taker()

    def deliver(k, status, headers, body, sent):
        if k == 9:
            raise GiveUp()
        return taker(k, status, headers, body, sent)

    left = fetch(pool, 40, head, deliver, connections=1, depth=8, max_body=1 << 20)
    assert 9 in left and sorted(left + taker.taken) == list(range(40))
    assert len(server.targets) < 40


def test_a_store_with_nothing_to_give_costs_one_request_per_connection(serve):
    server, pool = serve(lambda number, nth, target: b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    def deliver(k, status, headers, body, sent):
        assert status == 404
        raise GiveUp()

    left = fetch(pool, 50, head, deliver, connections=3, depth=8, max_body=1 << 20)
    assert left == list(range(50))
    assert len(server.targets) <= 3  # each connection starts with one request in flight


def test_one_early_close_is_not_taken_for_a_request_limit(serve):
    server, pool = serve(lambda number, nth, target: CLOSE if number == 1 and nth == 1 else ok(target))
    taker = Taker()
    left = fetch(pool, 60, head, taker, connections=1, depth=8, max_body=1 << 20)
    assert left == [] and sorted(taker.taken) == list(range(60))
    assert server.connections == 2  # the second connection carried all the rest


def test_an_intermediary_that_drops_pipelined_requests_costs_seconds_not_the_read_timeout(serve):
    """It answers the first request of each connection and never the ones sent behind it: the
    run hands those back once ten times its slowest answer (five seconds at the least) passed
    in silence, long before the 30 s read timeout, and each item is taken or handed back once."""
    release = threading.Event()

    def answer(number, nth, target):
        if nth:
            release.wait(60)
            return CLOSE
        return ok(target)

    server, _ = serve(answer)
    pool = ConnectionPool(server.endpoint, max_idle=4, max_open=4, timeouts=Timeouts(5, 30))
    taker = Taker()
    started = time.monotonic()
    try:
        left = fetch(pool, 12, head, taker, connections=2, depth=8, max_body=1 << 20)
    finally:
        release.set()
    waited = time.monotonic() - started
    assert waited < 15, f"the run waited {waited:.1f} s: the 30 s read timeout, not the stall rule"
    assert taker.taken and sorted(taker.taken + left) == list(range(12))
    assert max(server.queued) > 1, "nothing was pipelined: the test shows nothing"


def test_a_cancel_from_another_thread_ends_a_silent_run_at_once(serve):
    """A library caller cancels from its own thread while the run waits on a silent server:
    the run hands everything back within a second, not after the 30 s read timeout."""
    release = threading.Event()
    server, _ = serve(lambda number, nth, target: (release.wait(60), CLOSE)[1])  # reads, never answers
    pool = ConnectionPool(server.endpoint, max_idle=2, max_open=2, timeouts=Timeouts(5, 30))
    cancel = Event()
    threading.Timer(0.5, cancel.set).start()
    started = time.monotonic()
    try:
        left = fetch(pool, 4, head, Taker(), connections=1, depth=8, max_body=1 << 20, cancel=cancel)
    finally:
        release.set()
    waited = time.monotonic() - started
    assert left == [0, 1, 2, 3]
    assert waited < 10, f"the run waited {waited:.1f} s after the cancel"


class IdleClosingServer(RawServer):
    """Closes a connection idle for ``idle`` seconds, as servers do with keep-alive ones."""

    def __init__(self, answer, idle):
        self.idle = idle
        super().__init__(answer)

    def _serve(self, conn):
        conn.settimeout(self.idle)
        super()._serve(conn)


def closed_by_peer(sock):
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable) and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""


def wait_for(predicate, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_warm_sockets_the_server_closed_idle_are_replaced_by_a_fresh_connection():
    """A stager's warm socket is a kept-alive connection: one the server closed while idle
    fails at the first pipelined send, and the pass goes on over a freshly dialled connection
    (the other warm sockets to the address, as old, are dropped), instead of ending."""
    from transfer.http import warm

    server = IdleClosingServer(lambda number, nth, target: ok(target), idle=0.2)
    address = ("127.0.0.1", server.port)
    stale = [socket.create_connection(address) for _ in range(2)]
    try:
        wait_for(lambda: all(closed_by_peer(sock) for sock in stale), "the server to close the idle sockets")
        warm.adopt(address, stale)
        pool = ConnectionPool(server.endpoint, max_idle=4, max_open=4, timeouts=Timeouts(5, 5))
        taker = Taker()
        left = fetch(pool, 20, head, taker, connections=1, depth=8, max_body=1 << 20)
        assert left == [] and sorted(taker.taken) == list(range(20))
        assert warm.take(address) is None
    finally:
        warm.discard()
        server.close()


def test_a_kept_alive_connection_the_server_closed_idle_is_replaced_by_a_fresh_one():
    server = IdleClosingServer(lambda number, nth, target: ok(target), idle=0.2)
    try:
        pool = ConnectionPool(server.endpoint, max_idle=4, max_open=4, timeouts=Timeouts(5, 5))
        assert fetch(pool, 4, head, Taker(), connections=1, depth=8, max_body=1 << 20) == []
        kept = pool.lease()
        wait_for(lambda: closed_by_peer(kept.live_socket), "the server to close the idle connection")
        pool.release(kept)
        taker = Taker()
        left = fetch(pool, 20, head, taker, connections=1, depth=8, max_body=1 << 20)
        assert left == [] and sorted(taker.taken) == list(range(20))
        assert server.connections == 2
    finally:
        server.close()


class GatedServer(RawServer):
    """Answers nothing until ``expected`` requests have arrived over all its connections (or
    ``patience`` seconds passed), reading meanwhile; records how many had arrived when the
    first answer went out."""

    def __init__(self, expected, patience=3.0):
        self.gate = threading.Event()
        self.expected = expected
        self.patience = patience
        self.arrived = 0
        self.arrived_at_first_answer = None
        super().__init__(lambda number, nth, target: ok(target))

    def _exchange(self, conn, number):
        buffer, answered, seen = b"", 0, 0
        deadline = time.monotonic() + self.patience
        with conn:
            while True:
                waiting = not self.gate.is_set() and time.monotonic() < deadline
                if b"\r\n\r\n" not in buffer or waiting:
                    if not select.select([conn], [], [], 0.02)[0]:
                        continue
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                    heads = answered + buffer.count(b"\r\n\r\n")
                    with self._lock:
                        self.arrived += heads - seen
                        if self.arrived >= self.expected:
                            self.gate.set()
                    seen = heads
                    continue
                with self._lock:
                    if self.arrived_at_first_answer is None:
                        self.arrived_at_first_answer = self.arrived
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                answered += 1
                conn.sendall(ok(head.split(b" ")[1].decode()))


def test_an_eager_pass_sends_every_request_before_the_first_answer():
    """Objects just listed: each connection starts with ``depth`` requests in flight, so
    12 requests over 4 connections all go out in the first round trip (without ``eager``, one
    per connection: 4, then more as answers come)."""
    server = GatedServer(expected=12)
    try:
        pool = ConnectionPool(server.endpoint, max_idle=4, max_open=4, timeouts=Timeouts(5, 5))
        taker = Taker()
        left = fetch(pool, 12, head, taker, connections=4, depth=3, max_body=1 << 20, eager=True)
        assert left == [] and sorted(taker.taken) == list(range(12))
        assert server.arrived_at_first_answer == 12 and server.connections == 4
    finally:
        server.close()


def test_a_pass_that_is_not_eager_starts_each_connection_with_one_request():
    server = GatedServer(expected=12, patience=0.5)
    try:
        pool = ConnectionPool(server.endpoint, max_idle=4, max_open=4, timeouts=Timeouts(5, 5))
        taker = Taker()
        assert fetch(pool, 12, head, taker, connections=4, depth=3, max_body=1 << 20) == []
        assert server.arrived_at_first_answer == 4
    finally:
        server.close()


def test_a_head_that_waits_for_its_token_goes_out_alone_and_is_not_taken_for_silence(serve):
    """A paced pass: each ``head`` waits 0.4 s (its token), longer than the pool's read timeout
    (0.3 s). Each request goes out as its head returns, not gathered with the next ones, and the
    run waits for answers from the last send, so nothing is handed back for a silence."""
    server, _ = serve(lambda number, nth, target: ok(target))
    pool = ConnectionPool(server.endpoint, max_idle=2, max_open=2, timeouts=Timeouts(5, 0.3))

    def paced(k):
        time.sleep(0.4)
        return head(k)

    taker = Taker()
    assert fetch(pool, 5, paced, taker, connections=1, depth=8, max_body=1 << 20, eager=True) == []
    assert sorted(taker.taken) == list(range(5)) and max(server.queued) == 1


class HoldingServer(RawServer):
    """Reads requests with their bodies as fast as they come and answers those it holds only
    once nothing more arrives for a moment: what a client has in flight piles up here.
    Records the most request bytes it held unanswered at once, over all its connections."""

    def __init__(self):
        self.held = 0
        self.most_held = 0
        super().__init__(lambda number, nth, target: ok(target))

    def _exchange(self, conn, number):
        buffer, sizes = bytearray(), []  # sizes: whole requests received, not yet answered
        with conn:
            while True:
                if not sizes or select.select([conn], [], [], 0.02)[0]:
                    data = conn.recv(1 << 20)
                    if not data:
                        return
                    self._received(buffer, data, sizes)
                    continue
                replies = b"".join(ok(target) for target, _ in sizes)
                with self._lock:
                    self.held -= sum(size for _, size in sizes)
                sizes.clear()
                conn.sendall(replies)

    def _received(self, buffer, data, sizes):
        with self._lock:
            self.held += len(data)
            self.most_held = max(self.most_held, self.held)
        buffer += data
        while b"\r\n\r\n" in buffer:
            end = buffer.index(b"\r\n\r\n") + 4
            head = bytes(buffer[:end])
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(buffer) < end + length:
                return
            sizes.append((head.split(b" ")[1].decode(), end + length))
            del buffer[:end + length]


def test_request_bytes_in_flight_stay_under_the_cap_whatever_the_depth():
    """Uploads of 512 KiB bodies, 32 deep on each of 2 connections, capped at 2 MiB: without
    the cap the first sends alone would put 32 MiB on the wire and in this process's memory;
    with it, the server never holds more than 2 MiB unanswered (what the client has in flight
    is at least that), and the process's peak stays a few caps high."""
    import tracemalloc

    size, cap, count = 512 << 10, 2 << 20, 64

    put = _puts_of(size)

    server = HoldingServer()
    try:
        pool = ConnectionPool(server.endpoint, max_idle=2, max_open=2, timeouts=Timeouts(5, 5))
        taker = Taker()
        tracemalloc.start()
        try:
            left = fetch(pool, count, put, taker, connections=2, depth=32, max_body=1 << 16, eager=True,
                         max_bytes=cap)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert left == [] and sorted(taker.taken) == list(range(count))
        assert size < server.most_held <= cap  # pipelined, and never past the cap
        assert peak < 6 * cap
    finally:
        server.close()


def test_a_request_larger_than_the_cap_goes_out_alone():
    size = 300 << 10

    put = _puts_of(size)

    server = HoldingServer()
    try:
        pool = ConnectionPool(server.endpoint, max_idle=1, max_open=1, timeouts=Timeouts(5, 5))
        taker = Taker()
        assert fetch(pool, 4, put, taker, connections=1, depth=8, max_body=1 << 16, eager=True,
                     max_bytes=size // 2) == []
        assert sorted(taker.taken) == list(range(4))
        assert size < server.most_held < 2 * size  # one at a time
    finally:
        server.close()


def _puts_of(size):
    """``head(k)`` of pipelined PUTs of ``size`` zero bytes each, to ``/k<k>``."""
    def put(k):
        return f"PUT /k{k} HTTP/1.1\r\nHost: test\r\nContent-Length: {size}\r\n\r\n".encode() + bytes(size)
    return put
