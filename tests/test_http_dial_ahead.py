"""Connections dialled ahead of need (:meth:`ConnectionPool.dial_ahead`, :mod:`transfer.http.sockets`):
the pipelined pass that follows a directory's listing finds its connections connected, within
``max_open``, never through a proxy, without sockets the store closed meanwhile, TLS handshakes
started together and the store's name still verified; a node stager's warm sockets first."""

import os
import select
import socket
import threading
import time

import pytest

from transfer.http.connection import Timeouts
from transfer.http.pipeline import fetch
from transfer.http.pool import ConnectionPool
from test_http_pipeline import IdleClosingServer, RawServer, Taker, closed_by_peer, eager_pass, head, ok, wait_for


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

    from pegasus_cloudio_testbed.proxy import TcpProxy

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

        from pegasus_cloudio_testbed.certs import make_tls_files

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
    from transfer.http.sockets import connected, hung_up

    server = RawServer(lambda number, nth, target: ok(target))
    try:
        pool = ConnectionPool(server.endpoint, max_idle=4, max_open=4, timeouts=Timeouts(5, 5))
        pool.dial_ahead(2)
        gone = pool._started[0]
        gone.close()
        assert hung_up(gone) and not connected(gone, 0)
        pool.dial_ahead(2)
        assert len(pool._started) == 2 and all(sock.fileno() >= 0 for sock in pool._started)
        taker = Taker()
        assert fetch(pool, 4, head, taker, connections=2, depth=2, max_body=1 << 20, eager=True) == []
        pool.close()
    finally:
        server.close()
