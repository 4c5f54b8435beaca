"""Warm connections: the node stager dials the endpoints its jobs used and hands those
connections to the next job's process, which sends its first request on one instead of
dialling; a warm connection the server closed meanwhile costs a retry, never a failure."""

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time

import boto3
import pytest

from pegasus_cloudio.stager import warm as stager_warm
from pegasus_cloudio.testbed.stager import StagerProcess
from transfer.http import warm
from transfer.http.pool import ConnectionPool

from test_stager import entry, job_env, run_job, served, wait_for


def test_a_second_job_sends_its_request_on_a_connection_the_stager_opened_before(native_dropin, proxied, minio,
                                                                                bucket, tmp_path):
    """The first job teaches the stager the endpoint; each later job is lent PER_ENDPOINT
    connections and dials none itself: the stager dials again only what the jobs used (the
    connection a request went out on is closed at the job's end, the other comes back)."""
    proxy, env = proxied
    boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                 aws_secret_access_key=minio.secret_key, region_name="us-east-1").put_object(
        Bucket=bucket, Key="obj", Body=b"warm bytes")
    with StagerProcess() as stager:
        for n in range(4):
            before = proxy.connections
            spec = [entry(f"s3://test@minio/{bucket}/obj", f"file://{tmp_path}/out{n}", "minio", "local")]
            done = run_job(native_dropin, [], job_env(stager.socket_path, **env), tmp_path,
                           stdin=json.dumps(spec).encode())
            assert done.returncode == 0, done.stderr.decode()
            assert (tmp_path / f"out{n}").read_bytes() == b"warm bytes"
            wait_for(lambda: len(served(stager)) == n + 1, "the job's process to end")
            # idle after the job: 2 dialled on learning the endpoint; then 2 dialled for the
            # first warm job plus its unused one back; then one dialled, one back, each job
            idle = stager_warm.PER_ENDPOINT if n == 0 else stager_warm.PER_ENDPOINT + 1
            wait_for(lambda: proxy.open_connections == idle, "the stager's warm connections")
            if n == 1:  # both were lent: the stager dialled 2, the job none
                assert proxy.connections - before == stager_warm.PER_ENDPOINT
            if n > 1:  # the stager dialled again the one the job used, the job none
                assert proxy.connections - before == 1


def test_jobs_that_send_no_request_cost_no_new_connection(native_dropin, proxied, minio, bucket, tmp_path):
    """A job whose stage-in needs no request (a node-cache hit; here a local copy) hands back
    the connections lent to it untouched, and the next job is lent those: no connection is
    dialled for it. A later job's request on a connection that came back gets its own answer."""
    proxy, env = proxied
    boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                 aws_secret_access_key=minio.secret_key, region_name="us-east-1").put_object(
        Bucket=bucket, Key="obj", Body=b"warm bytes")
    (tmp_path / "local").write_bytes(b"local bytes")

    def job(n, src):
        done = run_job(native_dropin, [], job_env(stager.socket_path, **env), tmp_path,
                       stdin=json.dumps([entry(src, f"file://{tmp_path}/out{n}", "minio", "local")]).encode())
        assert done.returncode == 0, done.stderr.decode()
        wait_for(lambda: len(served(stager)) == n + 1, "the job's process to end")

    with StagerProcess() as stager:
        job(0, f"s3://test@minio/{bucket}/obj")  # teaches the stager the endpoint
        wait_for(lambda: proxy.open_connections == stager_warm.PER_ENDPOINT, "the stager's warm connections")
        job(1, f"file://{tmp_path}/local")  # lent both: 2 dialled to stay ready, both come back
        wait_for(lambda: proxy.open_connections == stager_warm.MAX_IDLE, "the lent connections back")
        before = proxy.connections
        for n in range(2, 5):
            job(n, f"file://{tmp_path}/local")
            assert (tmp_path / f"out{n}").read_bytes() == b"local bytes"
        assert proxy.connections == before and proxy.open_connections == stager_warm.MAX_IDLE
        job(5, f"s3://test@minio/{bucket}/obj")
        assert (tmp_path / "out5").read_bytes() == b"warm bytes"
        assert proxy.connections == before  # the job's request went out on a connection that came back


def test_a_warm_connection_the_server_closed_is_retried_on_a_fresh_one(minio, proxied, bucket):
    proxy, _ = proxied
    listener = socket.create_server(("127.0.0.1", 0))
    dead = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    accepted.close()  # the "server" closed the idle connection before the job used it
    listener.close()
    address = (proxy.host, proxy.port)
    warm.adopt(address, [dead])
    try:
        pool = ConnectionPool(proxy.url(), max_idle=2)
        with pool.request("GET", "/minio/health/live") as response:
            response.read()
            assert response.status == 200
        assert warm.take(address) is None  # consumed (and the failure dropped any others)
        assert address in warm.used()
        pool.close()
    finally:
        warm.discard()


def test_a_warm_connection_the_tls_handshake_fails_on_is_replaced_by_a_fresh_one(minio_tls):
    """Over TLS a closed warm connection fails in the handshake, before any request: the
    connection dials afresh (dropping the other warm ones) instead of failing an attempt."""
    import ssl

    address = (minio_tls.host, minio_tls.port)
    dead = socket.create_connection(address)
    dead.sendall(b"not a TLS hello\r\n\r\n")  # the server gives up on this connection
    assert dead.recv(4096, socket.MSG_PEEK) is not None
    spare = socket.create_connection(address)
    spare.sendall(b"not a TLS hello\r\n\r\n")
    warm.adopt(address, [spare, dead])  # taken last first: `dead`, then `spare` if not dropped
    try:
        context = ssl.create_default_context(cafile=str(minio_tls.ca_file))
        pool = ConnectionPool(f"https://{minio_tls.host}:{minio_tls.port}", max_idle=2, ssl_context=context)
        with pool.request("GET", "/minio/health/live") as response:
            response.read()
            assert response.status == 200
        assert warm.take(address) is None  # the handshake's failure dropped the spare one too
        pool.close()
    finally:
        warm.discard()


def test_reports_from_copies_are_parsed_strictly():
    assert stager_warm.parse_report(b"127.0.0.1 9000") == (("127.0.0.1", 9000), None)
    assert stager_warm.parse_report(b"s3.example.org 443") == (("s3.example.org", 443), None)
    assert stager_warm.parse_report(b"s3.example.org 443 192.0.2.7") == (("s3.example.org", 443), "192.0.2.7")
    assert stager_warm.parse_report(b"s3.example.org 443 -") == (("s3.example.org", 443), "-")
    for bad in (b"", b"host", b"host 0", b"host 70000", b"host x", b"a b c d", b"host 80 ", b"\xff 80",
                b"ho\x00st 80", b"h" * 300 + b" 80", b"host 80 a\x00b"):
        assert stager_warm.parse_report(bad) is None, bad


def test_the_stager_keeps_a_bounded_number_of_endpoints_and_connections(tmp_path):
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(stager_warm.MAX_ENDPOINTS + 2)]
    sockets = stager_warm.WarmSockets()
    try:
        stager_warm.report(sockets.reports_w, [("127.0.0.1", s.getsockname()[1]) for s in listeners], look_up=True)
        os.write(sockets.reports_w, b"garbage line\n")
        sockets.drain_reports()
        held = sockets.held()
        assert len(held) == stager_warm.MAX_ENDPOINTS * stager_warm.PER_ENDPOINT
        handed = sockets.hand_out()
        assert len(handed) == stager_warm.MAX_ENDPOINTS and sockets.held() == []
        assert all(len(v) == stager_warm.PER_ENDPOINT for v in handed.values())
        for found in handed.values():
            for sock in found:
                sock.close()
    finally:
        sockets.close()
        for listener in listeners:
            listener.close()


def test_the_stager_dials_the_addresses_its_copies_looked_up_and_none_it_would_have_to():
    """The stager looks no name up (a lookup may wait for the resolver's timeout): a name a
    copy reports without an address teaches it nothing; a name that no longer resolves (the
    copy found none) is dropped."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sockets = stager_warm.WarmSockets()
    try:
        os.write(sockets.reports_w, f"store.test {port}\n".encode())
        sockets.drain_reports()
        assert sockets.held() == [] and sockets.fresh() == set()
        os.write(sockets.reports_w, f"store.test {port} 127.0.0.1\n".encode())
        sockets.drain_reports()
        assert {s.getpeername() for s in sockets.held()} == {("127.0.0.1", port)}
        assert sockets.fresh() == {("store.test", port)}
        os.write(sockets.reports_w, f"store.test {port} -\n".encode())
        sockets.drain_reports()
        assert sockets.held() == [] and sockets.hand_out() == {}
    finally:
        sockets.close()
        listener.close()


def test_a_name_that_moves_is_followed_not_dialled_at_its_old_address_for_ever():
    """An endpoint in steady use is looked up again now and then (by a copy, after its job):
    once its name points elsewhere (a store's fail-over), the connections handed to jobs go
    where the job's own dialling would, not to the address the name had when the stager
    first learnt it."""
    old = socket.create_server(("127.0.0.1", 0))
    port = old.getsockname()[1]
    new = socket.create_server(("127.0.0.2", port))
    sockets = stager_warm.WarmSockets()
    try:
        os.write(sockets.reports_w, f"store.test {port} 127.0.0.1\n".encode())
        sockets.drain_reports()
        assert {s.getpeername() for s in sockets.held()} == {old.getsockname()}
        os.write(sockets.reports_w, f"store.test {port} 127.0.0.2\n".encode())  # still in use, looked up again
        sockets.drain_reports()
        handed = sockets.hand_out()[("store.test", port)]
        assert handed and {s.getpeername() for s in handed} == {new.getsockname()}
        for sock in handed:
            sock.close()
    finally:
        sockets.close()
        old.close()
        new.close()


def test_a_warm_connection_still_connecting_costs_the_connect_timeout_not_the_read_timeout(minio, proxied):
    """The stager dials without waiting; a socket whose connect never completed (the store's
    listen queue was full, its SYNs dropped) is given up after the job's connect timeout and
    the request goes out on a fresh connection, instead of its first send waiting out the
    read timeout."""
    import time

    from transfer.http.connection import Timeouts

    proxy, _ = proxied
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    queued = [socket.create_connection(full.getsockname())]  # listen(0): the accept queue holds one, now full
    stuck = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    assert stuck.connect_ex(full.getsockname()) == errno.EINPROGRESS
    address = (proxy.host, proxy.port)
    warm.adopt(address, [stuck])
    try:
        pool = ConnectionPool(proxy.url(), max_idle=2, timeouts=Timeouts(1.0, 30.0))
        started = time.monotonic()
        with pool.request("GET", "/minio/health/live") as response:
            response.read()
            assert response.status == 200
        waited = time.monotonic() - started
        assert waited < 10, f"{waited:.1f} s: the read timeout (30 s), not the connect timeout (1 s)"
        assert warm.take(address) is None
        pool.close()
    finally:
        warm.discard()
        for sock in queued + [full]:
            sock.close()


# Runs in a private network and mount namespace (the test below): a DNS server on 127.0.0.1:53
# that answers the first lookup of each kind (the job's own) and holds every later query
# unanswered, an HTTP server, the stager, and two jobs run through the native client.
_SLOW_RESOLVER_WORLD = r"""
import json, os, socket, subprocess, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pegasus_cloudio.testbed.stager import StagerProcess

client, work = json.loads(sys.argv[1]), sys.argv[2]
held, answered = [], set()
dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dns.bind(("127.0.0.1", 53))

def answer():
    while True:
        query, peer = dns.recvfrom(4096)
        end = query.index(b"\0", 12) + 5  # the question: labels, then type and class
        qtype = query[end - 4:end - 2]
        if qtype in answered:
            held.append(query)  # never answered: the resolver waits out its timeout
            continue
        answered.add(qtype)
        record = b"\xc0\x0c\0\x01\0\x01\0\0\0\0\0\x04" + socket.inet_aton("127.0.0.1") if qtype == b"\0\x01" else b""
        dns.sendto(query[:2] + b"\x81\x80\0\x01" + (b"\0\x01" if record else b"\0\0") + b"\0\0\0\0" + query[12:end]
                   + record, peer)

threading.Thread(target=answer, daemon=True).start()

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"bytes")
    def log_message(self, *args):
        pass

web = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=web.serve_forever, daemon=True).start()

def job(stager, src, dst, timeout):
    spec = [{"type": "transfer", "src_urls": [{"site_label": "web", "url": src}],
             "dest_urls": [{"site_label": "local", "url": dst}]}]
    env = {"PATH": os.environ["PATH"], "HOME": work, "PEGASUS_CLOUDIO_CONFIG": os.devnull,
           "PEGASUS_CLOUDIO_CACHE_DIR": "off", "PEGASUS_CLOUDIO_STAGER": stager.socket_path}
    return subprocess.run(client, input=json.dumps(spec).encode(), capture_output=True, env=env, cwd=work,
                          timeout=timeout)

with StagerProcess() as stager:
    first = job(stager, f"http://store.test:{web.server_address[1]}/obj", f"file://{work}/one", 60)
    assert first.returncode == 0, first.stderr.decode()
    deadline = time.monotonic() + 30
    while not held:  # someone looks the name up again (the stager learning the endpoint) and waits
        assert time.monotonic() < deadline, "nobody looked the name up again"
        time.sleep(0.05)
    try:
        second = job(stager, f"file://{work}/one", f"file://{work}/two", 20)  # the resolver holds for 60 s
        print("served" if second.returncode == 0 else second.stderr.decode())
    except subprocess.TimeoutExpired:
        print("stalled: the stager did not take a job while a name lookup waited")
    finally:
        dns.close()  # the held lookup fails at once
"""


def test_a_hanging_name_lookup_does_not_hold_up_the_next_job(native_dropin, tmp_path):
    """The stager learns the endpoints its jobs used (host names) and keeps connections open
    to them; looking a name up may take the resolver's whole timeout (a DNS server that does
    not answer: a zone's servers down, a slow network). That wait must not be the stager's
    loop's: every job of the user on the node would wait behind it. Real resolver (glibc,
    ``/etc/resolv.conf``) against a DNS server that answers the job's lookup and holds the next."""
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:30 attempts:2\n")
    shell = 'ip link set lo up && mount --bind "$1" /etc/resolv.conf && exec "$2" -c "$3" "$4" "$5"'
    done = subprocess.run(["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c", shell, "sh",
                           str(resolv), sys.executable, _SLOW_RESOLVER_WORLD, json.dumps(native_dropin), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "served", done.stdout


# --------------------------------------------------------------------------- lent, not given
# The stager lends each job's copy a descriptor of its warm sockets and keeps its own; when the
# copy is reaped, a socket comes back to the pool only if the kernel says it carried nothing.


class Store:
    """A TCP server that accepts and counts connections (the store's side of each)."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.accepted = []

    @property
    def address(self):
        return self.listener.getsockname()

    def accept_all(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return len(self.accepted)
            self.accepted.append(conn)

    def peer_of(self, sock):
        """The store's side of the client socket ``sock``."""
        self.accept_all()
        return next(conn for conn in self.accepted if conn.getpeername() == sock.getsockname())

    def close(self):
        for conn in self.accepted + [self.listener]:
            conn.close()


@pytest.fixture
def warmed():
    """(store, the stager's warm sockets): PER_ENDPOINT connected to the store, ready."""
    store, sockets = Store(), stager_warm.WarmSockets()
    try:
        stager_warm.report(sockets.reports_w, [store.address], look_up=True)
        sockets.drain_reports()
        for sock in sockets.idle():
            wait_for(lambda: _state(sock) == 1, "the stager's connect")  # TCP_ESTABLISHED
        yield store, sockets
    finally:
        sockets.close()
        store.close()


def _state(sock):
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


def _job(handed, act=lambda sockets: None):
    """A job's copy: a forked process holding the handed sockets, doing ``act`` with them,
    then closing its descriptors (as ``transfer.http.warm.discard`` does); its pid."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            act([sock for found in handed.values() for sock in found])
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return pid


def _reaped(pid):
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


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


def _at_each_bytecode(code, k, interrupt, callees=()):
    """A tracer that calls ``interrupt()`` once, before the ``k``-th bytecode run by the first
    frame of ``code`` or by the frames it calls whose code is in a file of ``callees``, as a
    signal handler would run there; the tracer's own state (fired)."""
    state = {"frame": None, "seen": 0, "fired": False}

    def local(frame, event, arg):
        if event == "opcode" and not state["fired"]:
            if state["seen"] == k:
                state["fired"] = True
                interrupt()
            state["seen"] += 1
        return local

    def calls(frame, event, arg):
        if state["fired"]:
            return None
        if state["frame"] is None and frame.f_code is code:
            state["frame"] = frame
        elif state["frame"] is None or frame.f_code.co_filename not in callees:
            return None
        frame.f_trace_opcodes = True
        return local

    return calls, state


def test_a_copy_that_ends_while_the_reaper_runs_is_reaped_before_it_returns_whatever_the_bytecode(warmed):
    """SIGCHLD's handler runs between any two bytecodes, the reaper's own too (it then only
    notes that a child ended). A copy that ends at any point of the reaper must be reaped, and
    its sockets given back, before the reaper returns: no later SIGCHLD comes for it, so a
    missed one would leave it a zombie holding its loans (and its job unlogged) until some
    other job comes."""
    from pegasus_cloudio.stager import server

    store, sockets = warmed
    code = server.Stager._reap.__code__
    k = 0
    while True:
        stager = server.Stager("/nonexistent/s.sock")
        stager._warm = sockets
        first = _job({})
        os.waitid(os.P_PID, first, os.WEXITED | os.WNOWAIT)
        handed = sockets.hand_out()
        reader, writer = os.pipe()
        second = _job(handed, lambda _: os.read(reader, 1))
        sockets.lend(second)

        def sigchld():
            os.write(writer, b"x")
            os.waitid(os.P_PID, second, os.WEXITED | os.WNOWAIT)  # it ended
            stager._reap(signal.SIGCHLD, None)  # the handler, run here

        tracer, state = _at_each_bytecode(code, k, sigchld)
        sys.settrace(tracer)
        try:
            stager._reap(signal.SIGCHLD, None)
        finally:
            sys.settrace(None)
        if not state["fired"]:  # k is past the reaper's last bytecode
            os.write(writer, b"x")
            assert _reaped(second) == 0
            sockets.give_back(second)
            break
        assert stager.served == 2, f"a copy that ended before bytecode {k} of the reaper was left unreaped"
        assert all(sock in sockets.idle() for sock in handed[store.address])
        for fd in (reader, writer):
            os.close(fd)
        k += 1
    assert k > 20


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


def test_a_copy_that_ends_at_any_bytecode_of_a_dispatch_never_mixes_its_loans_with_the_new_copys(warmed):
    """SIGCHLD's handler run before each bytecode of a real dispatch, the stager's and the
    pool's functions it calls included (an opcode tracer; a real client connection, a real
    forked copy kept waiting for its request): the copy that
    ended is reaped by the dispatch's end, its sockets back in the pool; the new copy's
    sockets are lent under the new copy's pid and none is in the pool while it runs."""
    from pegasus_cloudio.stager import server, wire

    store, sockets = warmed
    code = server.Stager._dispatch.__code__
    me = os.getpid()
    k = 0
    while True:
        stager = server.Stager("/nonexistent/s.sock")
        stager._warm = sockets
        stager._listener = socket.socket(socket.AF_UNIX)
        handed = sockets.hand_out()
        reader, writer = os.pipe()
        ending = _job(handed, lambda _: os.read(reader, 1))
        sockets.lend(ending)
        sockets.refill()
        wait_for(lambda: store.accept_all() and all(_state(s) == 1 for s in sockets.idle()), "the refill's connects")
        client, conn = socket.socketpair()

        def sigchld():
            if os.getpid() != me:
                return
            os.write(writer, b"x")
            os.waitid(os.P_PID, ending, os.WEXITED | os.WNOWAIT)
            stager._reap(signal.SIGCHLD, None)

        tracer, state = _at_each_bytecode(code, k, sigchld, (server.__file__, stager_warm.__file__))
        sys.settrace(tracer)
        try:
            stager._dispatch(conn)
        finally:
            sys.settrace(None)
        if not state["fired"]:
            os.write(writer, b"x")
        copy = next(pid for pid in sockets._lent if pid != ending)
        mine = [loan[3] for loan in sockets._lent[copy]]
        assert mine and not set(mine) & set(sockets.idle()), f"bytecode {k}"
        if state["fired"]:
            assert ending not in sockets._lent and stager.served == 1, f"bytecode {k}"
            back = set(sockets.idle()) | set(mine)  # back in the pool, or lent again to the new copy
            assert set(handed[store.address]) <= back, f"bytecode {k}"
        client.sendall(b"\0" * wire.LENGTH_BYTES)  # a request without the job's streams: the copy ends
        client.close()
        os.waitid(os.P_PID, copy, os.WEXITED | os.WNOWAIT)
        stager._reap(signal.SIGCHLD, None)
        assert not sockets._lent and stager.served == 2
        for fd in (reader, writer):
            os.close(fd)
        stager._listener.close()
        if not state["fired"]:
            break
        k += 1
    assert k > 20


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
