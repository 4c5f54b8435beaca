"""Warm connections: the node stager dials the endpoints its jobs used and hands those
connections to the next job's process, which sends its first request on one instead of
dialling; a warm connection the server closed meanwhile costs a retry, never a failure."""

import errno
import json
import os
import socket
import subprocess
import sys

from pegasus_cloudio.stager import warm as stager_warm
from pegasus_cloudio_testbed.stager import StagerProcess
from transfer.http import warm
from transfer.http.pool import ConnectionPool

from test_stager import entry, job_env, put_object, run_job, served, wait_for, warm_sources


def test_a_second_job_sends_its_request_on_a_connection_the_stager_opened_before(native_dropin, proxied, minio,
                                                                                bucket, tmp_path):
    """The first job teaches the stager the endpoint; each later job is lent PER_ENDPOINT
    connections and dials none itself: the stager dials again only what the jobs used (the
    connection a request went out on is closed at the job's end, the other comes back)."""
    proxy, env = proxied
    put_object(minio, bucket, "obj", b"warm bytes")
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
    warm_sources(minio, bucket, tmp_path)

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
from pegasus_cloudio_testbed.stager import StagerProcess

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
