"""Warm connections lent, not given: the stager lends each job's copy a descriptor of its warm
sockets and keeps its own; when the copy is reaped, a socket comes back to the pool only if the
kernel says it carried nothing (tests/lending_support.py has the store and the copies)."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import time

from pegasus_cloudio.stager import warm as stager_warm
from transfer.http import warm
from transfer.http.pool import ConnectionPool

from test_stager import wait_for
from lending_support import Store, warmed, _state, _job, _reaped  # noqa: F401 - warmed is a fixture


def test_a_socket_lent_to_a_job_that_sent_nothing_comes_back_and_is_handed_to_the_next_job(warmed):
    store, sockets = warmed
    assert store.accept_all() == stager_warm.PER_ENDPOINT
    first = sockets.hand_out()[store.address]
    pid = _job({store.address: first})
    sockets.lend(pid)
    sockets.refill()  # what is available is dialled again, not what is lent
    wait_for(lambda: store.accept_all() == 2 * stager_warm.PER_ENDPOINT, "the refill's connections")
    assert _reaped(pid) == 0
    sockets.give_back(pid)
    assert set(first) <= set(sockets.idle())
    second = sockets.hand_out()[store.address]
    assert second == first  # the oldest first: connected the longest
    pid = _job({store.address: second})
    sockets.lend(pid)
    sockets.refill()
    assert _reaped(pid) == 0
    sockets.give_back(pid)
    assert store.accept_all() == 2 * stager_warm.PER_ENDPOINT  # the second job cost no connection
    assert all(sock.fileno() >= 0 for sock in first)


def test_a_socket_a_job_sent_a_request_on_is_closed_and_never_handed_again(warmed):
    store, sockets = warmed
    handed = sockets.hand_out()
    used, unused = handed[store.address]
    pid = _job(handed, lambda _: used.sendall(b"GET /obj HTTP/1.1\r\nHost: store\r\n\r\n"))
    sockets.lend(pid)
    assert _reaped(pid) == 0
    peer = store.peer_of(used)
    assert peer.recv(100).startswith(b"GET /obj")
    sockets.give_back(pid)
    assert used.fileno() == -1 and used not in sockets.held()
    assert unused in sockets.idle()
    assert peer.recv(100) == b""  # the store sees the stager hang up
    for _ in range(3):
        assert used not in sockets.hand_out().get(store.address, [])
        sockets.lend(-1)


def test_a_socket_the_server_sent_bytes_on_is_closed_whether_or_not_the_job_read_them(warmed):
    store, sockets = warmed
    handed = sockets.hand_out()
    unread, read = handed[store.address]
    for sock in (unread, read):
        store.peer_of(sock).sendall(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
    pid = _job(handed, lambda _: read.recv(100))
    sockets.lend(pid)
    assert _reaped(pid) == 0
    sockets.give_back(pid)
    assert unread.fileno() == -1 and read.fileno() == -1
    assert sockets.held() == []


def test_the_sockets_of_a_job_killed_mid_run_come_back_only_if_untouched(warmed):
    store, sockets = warmed
    handed = sockets.hand_out()
    half, untouched = handed[store.address]

    def half_a_request(_):
        half.sendall(b"PUT /obj HTTP/1.1\r\nContent-Length: 100\r\n\r\n")
        while True:
            time.sleep(1)

    pid = _job(handed, half_a_request)
    sockets.lend(pid)
    peer = store.peer_of(half)
    assert peer.recv(100).startswith(b"PUT /obj")
    os.kill(pid, signal.SIGKILL)
    assert _reaped(pid) == -signal.SIGKILL
    sockets.give_back(pid)
    assert half.fileno() == -1 and sockets.idle() == [untouched]


def test_sockets_still_lent_are_kept_until_the_copy_is_reaped_and_closed_with_the_stager(warmed):
    store, sockets = warmed
    handed = sockets.hand_out()
    reader, writer = os.pipe()
    pid = _job(handed, lambda _: os.read(reader, 1))  # still running (its inserts after the answer)
    sockets.lend(pid)
    peers = [store.peer_of(sock) for sock in handed[store.address]]
    sockets.give_back(pid + 100000)  # another pid: nothing of this one's moves
    assert all(sock in sockets.held() and sock not in sockets.idle() for sock in handed[store.address])
    sockets.close()
    assert all(sock.fileno() == -1 for sock in handed[store.address])
    os.write(writer, b"x")
    assert _reaped(pid) == 0
    sockets.give_back(pid)  # after close: nothing left to give back, nothing raised
    assert all(peer.recv(10) == b"" for peer in peers)
    os.close(reader)
    os.close(writer)


def test_the_idle_sockets_come_back_capped_at_twice_the_per_endpoint_count_the_oldest_closed(warmed):
    store, sockets = warmed
    lent = []
    for _ in range(3):  # three jobs at once, none using its sockets
        handed = sockets.hand_out()
        pid = _job(handed)
        sockets.lend(pid)
        sockets.refill()
        lent.append((pid, handed[store.address]))
    wait_for(lambda: store.accept_all() == 4 * stager_warm.PER_ENDPOINT, "the refills' connections")
    for pid, _ in lent:
        assert _reaped(pid) == 0
        sockets.give_back(pid)
    idle = sockets.idle()
    assert len(idle) == stager_warm.MAX_IDLE == 2 * stager_warm.PER_ENDPOINT
    oldest = lent[0][1] + lent[1][1]  # dialled first
    assert all(sock.fileno() == -1 for sock in oldest)
    assert set(idle) == set(lent[2][1]) | set(sockets.held()) - set(oldest)
    handed = sockets.hand_out()[store.address]
    assert handed == lent[2][1]  # the oldest of those kept
    sockets.lend(-1)  # no copy was forked: the stager closes them
    assert all(sock.fileno() == -1 for sock in handed)


def test_a_job_is_handed_at_most_per_endpoint_sockets_an_endpoint(warmed):
    store, sockets = warmed
    pid = _job(sockets.hand_out())
    sockets.lend(pid)
    sockets.refill()
    assert _reaped(pid) == 0
    sockets.give_back(pid)
    assert len(sockets.idle()) == 2 * stager_warm.PER_ENDPOINT
    handed = sockets.hand_out()
    assert len(handed[store.address]) == stager_warm.PER_ENDPOINT
    assert len(sockets.idle()) == stager_warm.PER_ENDPOINT
    sockets.lend(-1)


def test_the_tcp_info_reading_tells_a_connection_that_carried_nothing_from_one_that_did():
    """``struct tcp_info`` (include/uapi/linux/tcp.h) read on this kernel, real sockets: the
    SYN counts in ``tcpi_bytes_acked`` (1) and in ``tcpi_unacked`` while the connect waits."""
    store = Store()
    full = socket.socket()
    try:
        def connected():
            sock = socket.create_connection(store.address)
            return sock, store.peer_of(sock)

        idle, _ = connected()
        sent, sent_peer = connected()
        sent.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert sent_peer.recv(100)
        wait_for(lambda: not stager_warm.untouched(sent.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)),
                 "the request's ack")
        received, received_peer = connected()
        received_peer.sendall(b"x")
        wait_for(lambda: received.recv(1, socket.MSG_PEEK) == b"x", "the byte")
        read, read_peer = connected()
        read_peer.sendall(b"x")
        assert read.recv(1) == b"x"
        hung_up, hung_up_peer = connected()
        hung_up_peer.close()
        wait_for(lambda: hung_up.recv(1, socket.MSG_PEEK) == b"", "the store's FIN")
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        queued = socket.create_connection(full.getsockname())  # the accept queue is full now
        connecting = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        assert connecting.connect_ex(full.getsockname()) == errno.EINPROGRESS
        assert _state(connecting) == 2  # TCP_SYN_SENT
        assert stager_warm.pristine(idle) and stager_warm.pristine(connecting)
        for sock in (sent, received, read, hung_up):
            assert not stager_warm.pristine(sock)
        info = idle.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        assert stager_warm.untouched(info)
        assert not stager_warm.untouched(info[:stager_warm.TCP_INFO_BYTES - 1])  # an older kernel's: unknown
        for sock in (sent, received, read):
            assert not stager_warm.untouched(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256))
        for sock in (idle, sent, received, read, hung_up, queued, connecting):
            sock.close()
        assert not stager_warm.pristine(idle)  # a closed socket: its getsockopt fails
    finally:
        full.close()
        store.close()


def test_a_copy_that_ends_during_a_dispatch_is_reaped_and_gives_its_sockets_back_after_it(warmed):
    """The reaper (SIGCHLD's handler) runs between any two bytecodes, the dispatch's too: a
    copy that ends while the stager hands out, forks and dials is reaped only once the
    dispatch is done with the pool. Nor is its pid freed before: the next copy, which may get
    that pid, must never be given back the sockets lent to the one that had it before."""
    from pegasus_cloudio.stager import server

    store, sockets = warmed
    stager = server.Stager("/nonexistent/s.sock")
    stager._warm = sockets
    handed = sockets.hand_out()[store.address]
    pid = _job({store.address: handed})
    sockets.lend(pid)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # it ended; not reaped yet
    stager._dispatching = True
    stager._reap(signal.SIGCHLD, None)
    assert stager.served == 0 and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None
    assert all(sock in sockets.held() and sock not in sockets.idle() for sock in handed)
    stager._dispatching = False  # the dispatch's end: it reaps what ended meanwhile
    assert stager._reap_again
    stager._reap(signal.SIGCHLD, None)
    assert stager.served == 1 and set(handed) <= set(sockets.idle())


def test_bytes_the_store_sent_on_an_idle_warm_connection_never_reach_a_job_as_its_answer():
    """A warm connection sits idle between its dial and a job's first request; a store (or a
    box on the way) that sends something meanwhile (an idle timeout's ``408``, garbage) must not
    have it read as the answer to the job's request: the job dials afresh instead. A real HTTP
    server; the early bytes are a well-formed answer with other bytes than the object's."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import threading

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"RIGHT")

        def log_message(self, *args):
            pass

    web = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    early = socket.create_server(("127.0.0.1", 0))
    try:
        sent = socket.create_connection(early.getsockname())
        peer, _ = early.accept()
        peer.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nWRONG")  # before any request
        wait_for(lambda: sent.recv(1, socket.MSG_PEEK) == b"H", "the early bytes")
        address = web.server_address
        warm.adopt(address, [sent])
        pool = ConnectionPool(f"http://{address[0]}:{address[1]}", max_idle=2)
        with pool.request("GET", "/obj") as response:
            assert response.status == 200
            assert response.read() == b"RIGHT"
        assert warm.take(address) is None
        pool.close()
        peer.close()
    finally:
        warm.discard()
        early.close()
        web.shutdown()
        web.server_close()


def test_the_stager_hands_out_no_idle_socket_the_store_sent_on_or_hung_up(warmed):
    """An idle socket the store sent bytes on, or closed, while it waited in the pool is
    closed at hand-out, not lent (it would give the job bytes that are no answer of its, or
    cost it a failed attempt)."""
    store, sockets = warmed
    spoken, closed = sockets.idle()
    store.peer_of(spoken).sendall(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
    store.peer_of(closed).close()
    wait_for(lambda: spoken.recv(1, socket.MSG_PEEK) == b"H", "the store's bytes")
    wait_for(lambda: closed.recv(1, socket.MSG_PEEK) == b"", "the store's FIN")
    assert sockets.hand_out() == {}
    assert spoken.fileno() == -1 and closed.fileno() == -1
    sockets.refill()
    assert len(sockets.hand_out()[store.address]) == stager_warm.PER_ENDPOINT
    sockets.lend(-1)


def test_no_program_a_copy_starts_holds_a_lent_socket(warmed, tmp_path):
    """A copy hands the entries it does not serve to the stock tool (a child process): the
    sockets lent to it are close-on-exec, so no program it starts holds one (and uses it, or
    keeps it open) once the copy is reaped and the socket lent to the next job, whatever the
    way the program is started (here even ``close_fds=False``)."""
    store, sockets = warmed
    handed = sockets.hand_out()
    listing = tmp_path / "fds"

    def run_a_program(lent):
        program = f'ls -l /proc/$$/fd > {listing}'  # the shell's descriptors
        subprocess.run(["sh", "-c", program], close_fds=False, check=True)

    pid = _job(handed, run_a_program)
    sockets.lend(pid)
    assert _reaped(pid) == 0
    inodes = {f"socket:[{os.fstat(sock.fileno()).st_ino}]" for sock in handed[store.address]}
    assert listing.read_text() and not inodes & set(listing.read_text().split())
    sockets.give_back(pid)
    assert all(sock in sockets.idle() for sock in handed[store.address])


def test_a_lent_socket_a_copy_began_tls_on_is_closed_not_handed_again(warmed):
    """A copy wraps a lent socket in TLS for an ``https`` endpoint: its ClientHello is data
    sent (the kernel counts it), so the socket never comes back, even when the handshake
    failed (here the store never answers it)."""
    import ssl

    store, sockets = warmed
    handed = sockets.hand_out()
    hello, untouched = handed[store.address]

    def begin_tls(_):
        context = ssl.create_default_context()
        hello.settimeout(0.2)
        try:
            context.wrap_socket(hello, server_hostname="store.test")
        except (TimeoutError, ssl.SSLError):
            pass

    pid = _job(handed, begin_tls)
    sockets.lend(pid)
    assert _reaped(pid) == 0
    assert store.peer_of(hello).recv(1) == b"\x16"  # a TLS handshake record reached the store
    sockets.give_back(pid)
    assert hello.fileno() == -1 and sockets.idle() == [untouched]


def test_an_ipv6_endpoint_is_lent_and_its_untouched_sockets_come_back():
    store = socket.create_server(("::1", 0), family=socket.AF_INET6)
    port = store.getsockname()[1]
    sockets = stager_warm.WarmSockets()
    try:
        os.write(sockets.reports_w, f"store.test {port} ::1\n".encode())
        sockets.drain_reports()
        for sock in sockets.idle():
            wait_for(lambda: _state(sock) == 1, "the stager's connect")
        handed = sockets.hand_out()
        lent = handed[("store.test", port)]
        assert {sock.family for sock in lent} == {socket.AF_INET6}
        pid = _job(handed)
        sockets.lend(pid)
        assert _reaped(pid) == 0
        sockets.give_back(pid)
        assert set(lent) <= set(sockets.idle())
    finally:
        sockets.close()
        store.close()


def test_a_socket_lent_while_connecting_comes_back_and_is_handed_once_its_connect_completes():
    """A copy gives up on a warm socket still connecting (its connect timeout) and closes its
    descriptor; the stager's stays, SYN_SENT, carrying nothing: it comes back, and once the
    store's SYN-ACK arrives it is handed out as an established connection that carried nothing."""
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    queued = socket.create_connection(full.getsockname())  # the accept queue is full now
    sockets = stager_warm.WarmSockets()
    accepted = []
    try:
        stager_warm.report(sockets.reports_w, [full.getsockname()], look_up=True)
        sockets.drain_reports()
        handed = sockets.hand_out()
        connecting = handed[full.getsockname()]
        assert {_state(sock) for sock in connecting} == {2}  # TCP_SYN_SENT
        pid = _job(handed)
        sockets.lend(pid)
        assert _reaped(pid) == 0
        sockets.give_back(pid)
        assert set(connecting) <= set(sockets.idle())
        full.setblocking(False)

        def accept_and_check():
            try:
                accepted.append(full.accept()[0])  # room in the queue: the SYNs sent again get through
            except BlockingIOError:
                pass
            return all(_state(sock) == 1 for sock in connecting)

        wait_for(accept_and_check, "the store's SYN-ACKs", timeout=60)
        assert set(sockets.hand_out()[full.getsockname()]) == set(connecting)
        sockets.lend(-1)
    finally:
        sockets.close()
        for sock in accepted + [queued, full]:
            sock.close()


def test_past_the_lending_cap_the_stager_gives_its_sockets_away_and_holds_no_more(warmed):
    """At most MAX_LENT sockets are lent at once (a descriptor the stager holds each, however
    many copies a client makes it fork and however long they run); past that, a copy's
    sockets are given (the stager closes its descriptors), and none ever comes back."""
    store, sockets = warmed
    pids = iter(range(10 ** 7, 10 ** 7 + 10 ** 6))  # no process has these: the copies never end here
    lent = []
    while sum(len(found) for found in lent) < stager_warm.MAX_LENT:
        handed = sockets.hand_out()[store.address]
        sockets.lend(next(pids))
        sockets.refill()
        lent.append(handed)
    given = sockets.hand_out()[store.address]
    sockets.lend(next(pids))
    assert all(sock.fileno() == -1 for sock in given)
    assert len(sockets.held()) <= stager_warm.MAX_LENT + stager_warm.MAX_IDLE
    assert all(sock.fileno() >= 0 for found in lent for sock in found)
    sockets.close()
    assert sockets.held() == [] and all(sock.fileno() == -1 for found in lent for sock in found)


def test_sockets_past_the_age_limit_are_neither_handed_out_nor_taken_back(warmed):
    store, sockets = warmed
    endpoint = sockets._endpoints[store.address]
    old, young = [sock for _, sock in endpoint.sockets]
    endpoint.sockets = [(time.monotonic() - stager_warm.MAX_AGE_S - 1, old), (time.monotonic(), young)]
    assert sockets.hand_out()[store.address] == [young] and old.fileno() == -1
    pid = _job({store.address: [young]})
    sockets.lend(pid)
    assert _reaped(pid) == 0
    (address, endpoint, made, sock), = sockets._lent[pid]
    sockets._lent[pid] = [(address, endpoint, made - stager_warm.MAX_AGE_S - 1, sock)]
    sockets.give_back(pid)
    assert young.fileno() == -1 and young not in sockets.held()
