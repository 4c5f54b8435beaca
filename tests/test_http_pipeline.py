"""transfer.http.pipeline against a scripted server: pipelined GETs are answered in order,
a connection closed mid-pipeline costs nothing but a resend of its unanswered requests,
and whatever the reader does not take (odd answers, no answer, a cancel) is handed back
for the ordinary path, never lost nor delivered twice."""

import os
import select
import socket
import threading
import time

import pytest

from pegasus_cloudio.testbed.scripted import ScriptedServer
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


def test_connections_dialled_ahead_are_the_ones_the_next_requests_use():
    """``dial_ahead`` starts the connects without waiting (the server accepts them before any
    request); the pass then sends on them and dials none of its own; ``close`` closes the
    ones nothing took."""
    server = RawServer(lambda number, nth, target: ok(target))
    try:
        pool = ConnectionPool(server.endpoint, max_idle=4, max_open=4, timeouts=Timeouts(5, 5))
        pool.dial_ahead(3)
        wait_for(lambda: server.connections == 3, "the server to accept the connections dialled ahead")
        assert server.targets == []
        pool.dial_ahead(3)  # three are on hand already: none more
        eager_pass(pool, 6, connections=2, depth=3)
        assert server.connections == 3
        left = pool._started[0]
        pool.close()
        assert left.fileno() == -1  # the one nothing took is closed with the pool
    finally:
        server.close()


def test_connections_dialled_ahead_the_server_closed_are_not_taken_by_a_request():
    """Sockets dialled ahead that the store closed idle are dropped when a connection is made,
    not only by the next ``dial_ahead``: the request goes out on one fresh connection, with no
    failed attempt on a dead socket first (a stale one costs a second connection)."""
    server = IdleClosingServer(lambda number, nth, target: ok(target), idle=0.2)
    try:
        pool = ConnectionPool(server.endpoint, max_idle=4, max_open=4, timeouts=Timeouts(5, 5))
        pool.dial_ahead(2)
        wait_for(lambda: server.connections == 2, "the server to accept the connections dialled ahead")
        dead = list(pool._started)
        wait_for(lambda: all(closed_by_peer(sock) for sock in dead), "the server to close the idle sockets")
        with pool.request("GET", "/one") as response:
            assert response.status == 200 and response.read() == b"body of /one"
        assert pool.stats.connections_opened == 1 and server.connections == 3
        assert server.targets == ["/one"] and pool._started == [] and all(sock.fileno() == -1 for sock in dead)
    finally:
        server.close()


def test_a_proxied_pool_dials_nothing_ahead():
    """A proxied connection is a tunnel through the proxy: nothing is dialled to the origin,
    nor to the proxy, ahead of the request that needs it."""
    from transfer.http.proxy import Proxy

    server = RawServer(lambda number, nth, target: ok(target))
    try:
        pool = ConnectionPool(server.endpoint, max_idle=4, proxy=Proxy("127.0.0.1", server.port))
        pool.dial_ahead(3)
        assert pool._started == []
        pool.close()
    finally:
        server.close()


def test_connections_dialled_ahead_fit_in_what_max_open_leaves():
    """A directory's load dials ahead while other threads hold connections of the pool: only
    the room ``max_open`` leaves is dialled (the docs promise threads + 2 connections per
    endpoint; three more here would make five to a pool capped at three, and no pass could
    lease them before the held ones came back anyway)."""
    server = RawServer(lambda number, nth, target: ok(target))
    try:
        pool = ConnectionPool(server.endpoint, max_idle=3, max_open=3, timeouts=Timeouts(5, 5))
        held = [pool.lease() for _ in range(2)]
        pool.dial_ahead(3)
        wait_for(lambda: server.connections >= 3, "the server to accept the connection dialled ahead")
        assert len(pool._started) == 1
        for conn in held:
            pool.release(conn)
        eager_pass(pool, 9, connections=3, depth=3)
        assert server.connections == 3
        pool.close()
    finally:
        server.close()


def test_threads_dialling_ahead_at_once_stay_within_max_open():
    """Directories loaded by several threads at once each dial ahead: together they start no
    more than ``max_open`` connections."""
    server = RawServer(lambda number, nth, target: ok(target))
    try:
        for _ in range(5):
            pool = ConnectionPool(server.endpoint, max_idle=3, max_open=3, timeouts=Timeouts(5, 5))
            start = threading.Barrier(8)

            def dial():
                start.wait()
                pool.dial_ahead(3)

            threads = [threading.Thread(target=dial) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert len(pool._started) == 3
            pool.close()
    finally:
        server.close()


def test_dialling_ahead_out_of_descriptors_raises_nothing():
    """``dial_ahead`` is best effort: a process at its descriptor limit dials nothing ahead,
    and the pass goes on over the connection it has (before, EMFILE escaped a directory's load)."""
    import resource

    server = RawServer(lambda number, nth, target: ok(target))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        pool = ConnectionPool(server.endpoint, max_idle=4, max_open=4, timeouts=Timeouts(5, 5))
        assert fetch(pool, 1, head, Taker(), connections=1, depth=1, max_body=1 << 20) == []  # one idle connection
        lowest_free = os.open(os.devnull, os.O_RDONLY)
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no descriptor can be made
        try:
            pool.dial_ahead(3)
            taker = Taker()
            assert fetch(pool, 4, head, taker, connections=1, depth=4, max_body=1 << 20, eager=True) == []
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert sorted(taker.taken) == list(range(4)) and server.connections == 1
        pool.close()
    finally:
        server.close()


def test_connections_dialled_ahead_to_a_tls_store_handshake_at_once(minio_tls):
    """Over TLS a connection is ready a handshake round trip after its connect: those dialled
    ahead make theirs together (the first one taken starts the others'), so a pass over six
    costs about two round trips (handshakes, requests), not one per connection more."""
    import ssl

    from pegasus_cloudio.testbed.proxy import TcpProxy

    with TcpProxy((minio_tls.host, minio_tls.port), delay_ms=100) as proxy:  # 200 ms round trips
        context = ssl.create_default_context(cafile=str(minio_tls.ca_file))
        pool = ConnectionPool(f"https://127.0.0.1:{proxy.port}", max_idle=6, max_open=6, ssl_context=context,
                              timeouts=Timeouts(5, 5))
        pool.dial_ahead(6)
        wait_for(lambda: proxy.connections == 6, "the connects dialled ahead")  # the listing's round trip
        answered = []
        started = time.monotonic()
        left = fetch(pool, 6, head, lambda k, status, *_: answered.append(status) or True, connections=6,
                     depth=1, max_body=1 << 20, eager=True)
        took = time.monotonic() - started
        assert left == [] and len(answered) == 6 and proxy.connections == 6
        assert took < 1.0, f"six TLS connections took {took:.2f} s (200 ms round trips; one after another: 1.4 s)"
        pool.close()


def test_a_tls_handshake_started_ahead_that_fails_is_dialled_afresh(minio_tls):
    """A connection dialled ahead whose handshake was started and then broke (the store hung
    up meanwhile) is closed, and the connection that took it dials afresh."""
    import ssl

    context = ssl.create_default_context(cafile=str(minio_tls.ca_file))
    pool = ConnectionPool(f"https://127.0.0.1:{minio_tls.port}", max_idle=3, max_open=3, ssl_context=context,
                          timeouts=Timeouts(5, 5))
    pool.dial_ahead(3)
    wait_for(lambda: all(select.select([], [sock], [], 0)[1] for sock in pool._started), "the connects")
    first = pool.lease()  # starts the other two handshakes
    broken = list(pool._started)
    assert len(broken) == 2 and all(isinstance(sock, ssl.SSLSocket) for sock in broken)
    for sock in broken:  # as a hang-up would (the TLS socket's own shutdown would unwrap it)
        with socket.socket(fileno=os.dup(sock.fileno())) as same:
            same.shutdown(socket.SHUT_RDWR)
    second = pool.lease()
    with pool.request("GET", "/minio/health/live") as response:
        assert response.status == 200
    assert sum(sock.fileno() == -1 for sock in broken) >= 1  # the one taken was closed
    for conn in (first, second):
        pool.release(conn)
    pool.close()
    assert all(sock.fileno() == -1 for sock in broken)


def test_a_tls_handshake_started_ahead_still_verifies_the_store_name(minio_tls):
    import ssl

    from transfer.errors import TransferError

    context = ssl.create_default_context(cafile=str(minio_tls.ca_file))
    pool = ConnectionPool(f"https://not-the-store.example:{minio_tls.port}", max_idle=3, max_open=3,
                          ssl_context=context, timeouts=Timeouts(5, 5), connect_to=("127.0.0.1", minio_tls.port))
    pool.dial_ahead(3)
    wait_for(lambda: all(select.select([], [sock], [], 0)[1] for sock in pool._started), "the connects")
    for _ in range(3):  # the first taken starts the others' handshakes
        with pytest.raises(TransferError, match="certificate verification failed"):
            pool.lease()
    pool.close()


class IdleHangingUpServer:
    """A TLS server that answers ``ok`` to every request, and that :meth:`hang_up_idle` makes
    hang up on every connection no request came on yet, its TLS handshake finished or not
    (as a store's handshake or idle timeout does): a client finishes such a handshake with
    the server's flight it holds, and finds the connection closed at its first request."""

    def __init__(self, tmp_path):
        import ssl

        from pegasus_cloudio.testbed.certs import make_tls_files

        files = make_tls_files(tmp_path / "certs")
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(files.cert, files.key)
        self.ca_file = files.ca_cert
        self.accepted = 0
        self.hung_up = 0  # connections closed before any request came on them
        self._idle = {}  # a connection's number -> a duplicate of its socket, until a request comes
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                number = self.accepted
                self._idle[number] = socket.socket(fileno=os.dup(conn.fileno()))
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def hang_up_idle(self):
        with self._lock:
            idle, self._idle = list(self._idle.values()), {}
        for same in idle:
            same.shutdown(socket.SHUT_RDWR)
            same.close()

    def _serve(self, conn, number):
        conn.settimeout(10)
        answered = False
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls:
                buffer = b""
                while True:
                    data = tls.recv(65536)
                    if not data:
                        return
                    buffer += data
                    while b"\r\n\r\n" in buffer:
                        if not answered:
                            with self._lock:
                                same = self._idle.pop(number, None)
                            if same is not None:
                                same.close()
                        request, _, buffer = buffer.partition(b"\r\n\r\n")
                        tls.sendall(ok(request.split(b" ")[1].decode()))
                        answered = True
        except OSError:
            conn.close()
        finally:
            if not answered:
                with self._lock:
                    self.hung_up += 1

    def close(self):
        self._listener.close()
        self.hang_up_idle()


def test_a_request_on_a_started_handshake_the_store_closed_is_sent_again_on_a_fresh_connection(tmp_path):
    """Connections dialled ahead whose TLS handshakes were started and which the store then
    closed (its handshake or idle timeout) fail at their first request, like stale keep-alive
    connections: the pool sends that request again once on a freshly dialled connection, as
    it promises, not on another dialled ahead as old (which failed the request with
    StaleConnection)."""
    import ssl

    server = IdleHangingUpServer(tmp_path)
    try:
        context = ssl.create_default_context(cafile=str(server.ca_file))
        pool = ConnectionPool(f"https://127.0.0.1:{server.port}", max_idle=3, max_open=3, ssl_context=context,
                              timeouts=Timeouts(5, 5))
        pool.dial_ahead(3)
        wait_for(lambda: server.accepted == 3, "the connects dialled ahead")
        first = pool.lease()  # starts the other two handshakes
        stale = list(pool._started)
        assert len(stale) == 2 and all(isinstance(sock, ssl.SSLSocket) for sock in stale)
        wait_for(lambda: all(select.select([sock], [], [], 0)[0] or sock.cipher() for sock in stale),
                 "the store's answers to the handshakes")
        server.hang_up_idle()
        wait_for(lambda: server.hung_up == 3, "the store's hang-ups")
        with pool.request("GET", "/k1") as response:
            assert response.status == 200 and response.read() == b"body of /k1"
        assert server.accepted == 4
        first.close()
        pool.release(first)
        pool.close()
    finally:
        server.close()


def test_connections_dialled_ahead_the_store_closed_are_dialled_again():
    """A long-lived process loads a directory, and another later: connections dialled ahead
    that nothing took meanwhile and the store closed (its idle timeout) are not counted as on
    hand, nor kept open: fresh ones are dialled, and the pass runs on those."""
    server = IdleClosingServer(lambda number, nth, target: ok(target), idle=0.2)
    try:
        pool = ConnectionPool(server.endpoint, max_idle=3, max_open=3, timeouts=Timeouts(5, 5))
        pool.dial_ahead(3)
        stale = list(pool._started)
        wait_for(lambda: len(stale) == 3 and all(closed_by_peer(sock) for sock in stale), "the store's idle timeout")
        pool.dial_ahead(3)
        assert all(sock.fileno() == -1 for sock in stale)
        wait_for(lambda: server.connections == 6, "three connections dialled again")
        eager_pass(pool, 9, connections=3, depth=3)
        assert server.connections == 6
        pool.close()
    finally:
        server.close()


def test_a_stagers_warm_sockets_are_taken_before_any_dialled_ahead():
    """In a stager's copy, the sockets the stager lent, connected before the job began, are
    on hand: dialling ahead adds only what they lack, the connections take them first, and
    the address is recorded as used, so the stager keeps it warm for later jobs (a job whose
    connections all came from dialling ahead reported none, and the stager forgot the store)."""
    from transfer.http import warm

    warm.discard()  # what earlier tests' connections recorded
    server = RawServer(lambda number, nth, target: ok(target))
    address = ("127.0.0.1", server.port)
    try:
        warm.adopt(address, [socket.create_connection(address) for _ in range(2)])
        pool = ConnectionPool(server.endpoint, max_idle=3, max_open=3, timeouts=Timeouts(5, 5))
        pool.dial_ahead(3)
        eager_pass(pool, 9, connections=3, depth=3)
        assert len(server.targets) == 9
        assert warm.take(address) is None and warm.used() == [address]
        assert server.connections == 3
        pool.close()
    finally:
        warm.discard()
        server.close()


def test_a_stagers_warm_sockets_count_as_on_hand_when_dialling_ahead():
    """A stager's copy was lent warm sockets to the address: dialling ahead adds only what
    they leave short, and the pass uses the lent ones too (three connections in all)."""
    from transfer.http import warm

    server = RawServer(lambda number, nth, target: ok(target))
    address = ("127.0.0.1", server.port)
    warm.discard()
    try:
        warm.adopt(address, [socket.create_connection(address) for _ in range(2)])
        pool = ConnectionPool(server.endpoint, max_idle=4, max_open=4, timeouts=Timeouts(5, 5))
        pool.dial_ahead(3)
        assert len(pool._started) == 1
        eager_pass(pool, 9, connections=3, depth=3)
        assert server.connections == 3
        pool.close()
    finally:
        warm.discard()
        server.close()


def test_a_socket_closed_before_it_was_taken_counts_as_hung_up_not_as_an_error():
    """A started socket whose descriptor is gone (a TLS wrap that failed after detaching it)
    is dropped at the next dial_ahead, which never raises, and dialled again."""
    from transfer.http.connection import _connected, hung_up

    server = RawServer(lambda number, nth, target: ok(target))
    try:
        pool = ConnectionPool(server.endpoint, max_idle=4, max_open=4, timeouts=Timeouts(5, 5))
        pool.dial_ahead(2)
        gone = pool._started[0]
        gone.close()
        assert hung_up(gone) and not _connected(gone, 0)
        pool.dial_ahead(2)
        assert len(pool._started) == 2 and all(sock.fileno() >= 0 for sock in pool._started)
        taker = Taker()
        assert fetch(pool, 4, head, taker, connections=2, depth=2, max_body=1 << 20, eager=True) == []
        pool.close()
    finally:
        server.close()
