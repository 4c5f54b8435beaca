"""Warm connections: the node stager dials the endpoints its jobs used and hands those
connections to the next job's process, which sends its first request on one instead of
dialling; a warm connection the server closed meanwhile costs a retry, never a failure."""

import errno
import json
import os
import socket

import boto3

from pegasus_cloudio.stager import warm as stager_warm
from pegasus_cloudio.testbed.stager import StagerProcess
from transfer.http import warm
from transfer.http.pool import ConnectionPool

from test_stager import entry, job_env, run_job, served, wait_for


def test_a_second_job_sends_its_request_on_a_connection_the_stager_opened_before(native_dropin, proxied, minio,
                                                                                bucket, tmp_path):
    proxy, env = proxied
    boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                 aws_secret_access_key=minio.secret_key, region_name="us-east-1").put_object(
        Bucket=bucket, Key="obj", Body=b"warm bytes")
    with StagerProcess() as stager:
        for n in range(3):
            if n:  # the first job taught the stager the endpoint: it dials ahead, after each job
                wait_for(lambda: proxy.open_connections == stager_warm.PER_ENDPOINT, "the stager's warm connections")
            before = proxy.connections
            spec = [entry(f"s3://test@minio/{bucket}/obj", f"file://{tmp_path}/out{n}", "minio", "local")]
            done = run_job(native_dropin, [], job_env(stager.socket_path, **env), tmp_path,
                           stdin=json.dumps(spec).encode())
            assert done.returncode == 0, done.stderr.decode()
            assert (tmp_path / f"out{n}").read_bytes() == b"warm bytes"
            wait_for(lambda: len(served(stager)) == n + 1, "the job's process to end")
            if n:  # only the stager's refill was dialled during the job: the job dialled nothing
                wait_for(lambda: proxy.open_connections == stager_warm.PER_ENDPOINT, "the refill")
                assert proxy.connections - before == stager_warm.PER_ENDPOINT


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
    assert stager_warm.parse_report(b"127.0.0.1 9000") == ("127.0.0.1", 9000)
    assert stager_warm.parse_report(b"s3.example.org 443") == ("s3.example.org", 443)
    for bad in (b"", b"host", b"host 0", b"host 70000", b"host x", b"a b c", b"\xff 80", b"ho\x00st 80",
                b"h" * 300 + b" 80"):
        assert stager_warm.parse_report(bad) is None, bad


def test_the_stager_keeps_a_bounded_number_of_endpoints_and_connections(tmp_path):
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(stager_warm.MAX_ENDPOINTS + 2)]
    sockets = stager_warm.WarmSockets()
    try:
        stager_warm.report(sockets.reports_w, [("127.0.0.1", s.getsockname()[1]) for s in listeners])
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


def test_a_name_that_does_not_resolve_is_not_looked_up_on_every_report(monkeypatch):
    """Name lookups block the stager's loop: a failed one is remembered (no DNS query leaves
    this machine: the lookup is answered here, as a resolver would for an unknown name)."""
    asked = []

    def getaddrinfo(host, *args, **kwargs):
        asked.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(stager_warm.socket, "getaddrinfo", getaddrinfo)
    sockets = stager_warm.WarmSockets()
    try:
        for _ in range(3):
            stager_warm.report(sockets.reports_w, [("store.unresolvable.invalid", 443)])
            sockets.drain_reports()
        assert asked == ["store.unresolvable.invalid"]
        assert sockets.held() == [] and sockets.hand_out() == {}
    finally:
        sockets.close()


def test_a_name_that_moves_is_followed_not_dialled_at_its_old_address_for_ever(monkeypatch):
    """An endpoint in steady use is looked up again now and then: once its name points
    elsewhere (a store's fail-over), the connections handed to jobs go where the job's own
    dialling would, not to the address the name had when the stager first learnt it."""
    old, new = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    points_to = [old.getsockname()]

    def getaddrinfo(host, port, *args, **kwargs):  # answered here: no DNS query leaves this machine
        assert host == "store.test"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", points_to[0])]

    monkeypatch.setattr(stager_warm.socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(stager_warm, "RESOLVE_S", 0.0)
    sockets = stager_warm.WarmSockets()
    try:
        stager_warm.report(sockets.reports_w, [("store.test", 443)])
        sockets.drain_reports()
        assert {s.getpeername() for s in sockets.held()} == {old.getsockname()}
        points_to[0] = new.getsockname()
        stager_warm.report(sockets.reports_w, [("store.test", 443)])  # still in use
        sockets.drain_reports()
        handed = sockets.hand_out()[("store.test", 443)]
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
