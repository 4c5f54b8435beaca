"""The cache daemon and the peer client on loopback: TLS, token, Range, verification, faults."""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import threading

import pytest

from pegasus_cloudio_testbed.certs import make_tls_files
from pegasus_cloudio_testbed.faults import Fault
from pegasus_cloudio_testbed.proxy import TcpProxy
from transfer.cache.layout import digest_of
from transfer.p2p.config import parse_networks
from p2p_support import TOKEN, client_config, corrupt_in_place, fetch, holder, new_cache, put, serve, url_of
from p2p_support import auth as auth_for


@pytest.fixture
def tls(tmp_path):
    return make_tls_files(tmp_path / "tls")


@pytest.fixture
def node_a(tmp_path, tls):
    cache = new_cache(tmp_path / "a")
    server = serve(tmp_path / "a", tls=tls)
    yield cache, server
    server.stop()


def raw_get(server, tls, path, headers):
    context = ssl.create_default_context(cafile=str(tls.ca_cert))
    conn = http.client.HTTPSConnection(*server.address, context=context, timeout=5)
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


def test_a_peer_serves_verified_bytes_over_tls_and_keeps_the_connection(node_a, tls):
    cache, server = node_a
    small, big = put(cache, "s3://b/small#e1", b"x" * 300), put(cache, "s3://b/big#e2", os.urandom(3 << 20))
    with TcpProxy(server.address) as proxy:
        url = url_of(server, port=proxy.port)
        from transfer.p2p.client import PeerClient
        from p2p_support import MemorySink
        client = PeerClient(client_config(tls))
        sinks = [MemorySink(), MemorySink()]
        reports = [client.fetch(r.key, [holder("a", url, r)], s, r.scope) for r, s in zip((small, big), sinks)]
        client.close()
        assert [r.size for r in reports] == [300, 3 << 20] and not reports[0].failures
        assert bytes(sinks[0].data) == b"x" * 300
        with cache.pin(big.key) as path:
            assert bytes(sinks[1].data) == open(path, "rb").read()
        assert proxy.snapshot()["connections"] == 1  # keep-alive: both over one TLS connection


def test_range_requests_and_ranges_past_the_end(node_a, tls):
    cache, server = node_a
    put(cache, "k", b"0123456789")
    path = f"/v1/alice/{digest_of('k')}"
    auth = auth_for(server, "k")
    status, headers, body = raw_get(server, tls, path, {**auth, "Range": "bytes=3-5"})
    assert (status, body, headers["Content-Range"]) == (206, b"345", "bytes 3-5/10")
    status, headers, body = raw_get(server, tls, path, {**auth, "Range": "bytes=10-"})
    assert (status, headers["Content-Range"], body) == (416, "bytes */10", b"")
    status, _, body = raw_get(server, tls, path, {**auth, "Range": "bytes=-4"})
    assert (status, body) == (206, b"6789")


@pytest.mark.parametrize("headers, user, expected", [
    ({}, "alice", 401),
    ({"Authorization": "Bearer wrong-token"}, "alice", 401),
    ({"Authorization": f"Bearer {TOKEN}"}, "mallory", 404),
])
def test_wrong_token_and_unconfigured_users_are_refused(node_a, tls, headers, user, expected):
    cache, server = node_a
    put(cache, "k", b"secret")
    status, _, body = raw_get(server, tls, f"/v1/{user}/{digest_of('k')}", headers)
    assert status == expected and b"secret" not in body


def test_the_client_with_a_wrong_token_delivers_nothing(node_a, tls):
    cache, server = node_a
    r = put(cache, "k", b"data")
    report, sink = fetch(client_config(tls, token="wrong"), "k", [holder("a", url_of(server), r)])
    assert report.size is None and "401" in report.failures[0] and sink.data == b""


def test_corrupt_peer_bytes_are_never_delivered_and_the_next_peer_is_asked(tmp_path, tls):
    bad, good = new_cache(tmp_path / "bad"), new_cache(tmp_path / "good")
    data = os.urandom(100_000)
    r = put(bad, "k", data)
    put(good, "k", data)
    corrupt_in_place(bad, "k")
    with serve(tmp_path / "bad", tls=tls) as s1, serve(tmp_path / "good", tls=tls) as s2:
        report, sink = fetch(client_config(tls, rack="r1"), "k",
                             [holder("bad", url_of(s1), r, rack="r1"), holder("good", url_of(s2), r)])
        assert report.size == len(data) and bytes(sink.data) == data and sink.resets == 1
        assert "do not match the registered SHA-256" in report.failures[0]
        report, sink = fetch(client_config(tls), "k", [holder("bad", url_of(s1), r)])
        assert report.size is None and sink.data == b""


def test_a_peer_dying_mid_body_is_continued_from_another_with_a_range(tmp_path):
    a, b = new_cache(tmp_path / "a"), new_cache(tmp_path / "b")
    data = os.urandom(2 << 20)
    r = put(a, "k", data)
    put(b, "k", data)
    with serve(tmp_path / "a") as s1, serve(tmp_path / "b") as s2, TcpProxy(s1.address) as p1, \
            TcpProxy(s2.address) as p2:
        s1.announce("127.0.0.1", p1.port)  # readers dial the proxies: plain proofs are bound to them
        s2.announce("127.0.0.1", p2.port)
        p1.set_faults([Fault.truncate(after_bytes=700_000)])
        report, sink = fetch(client_config(node="a"), "k",
                             [holder("a", url_of(s1, tls=False, port=p1.port), r, host="a"),
                              holder("b", url_of(s2, tls=False, port=p2.port), r)])
        assert report.size == len(data) and bytes(sink.data) == data and sink.resets == 0
        assert "peer a" in report.failures[0]
        assert p2.snapshot()["bytes_down"] < len(data)  # only the rest came from b


def test_a_peer_outside_the_pool_networks_is_never_contacted(node_a, tls):
    cache, server = node_a
    r = put(cache, "k", b"data")
    with TcpProxy(server.address) as proxy:
        config = client_config(tls, networks=parse_networks("10.0.0.0/8"))
        report, sink = fetch(config, "k", [holder("a", url_of(server, port=proxy.port), r)])
        assert report.size is None and "outside the pool's networks (127.0.0.1)" in report.failures[0]
        assert proxy.snapshot()["connections"] == 0


def test_plain_http_peers_are_refused_unless_configured(tmp_path):
    cache = new_cache(tmp_path / "a")
    r = put(cache, "k", b"data")
    with serve(tmp_path / "a") as server:
        report, _ = fetch(client_config(plain_http=False), "k", [holder("a", url_of(server, tls=False), r)])
        assert report.size is None and "plain http" in report.failures[0]
        report, sink = fetch(client_config(), "k", [holder("a", url_of(server, tls=False), r)])
        assert report.size == 4 and bytes(sink.data) == b"data"


def fake_peer(response: bytes):
    """A one-shot HTTP server answering every request with ``response``."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(response)
    threading.Thread(target=run, daemon=True).start()
    return listener


@pytest.mark.parametrize("response", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n123456789",            # oversized
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\ndata\r\n0\r\n\r\n",  # no length
    b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nda",                   # short, then closed
])
def test_oversized_short_or_unframed_responses_are_refused(response):
    listener = fake_peer(response)
    try:
        port = listener.getsockname()[1]
        from transfer.peers import Replica
        import hashlib
        r = Replica("k", 4, hashlib.sha256(b"data").hexdigest())
        report, sink = fetch(client_config(), "k", [holder("x", f"http://127.0.0.1:{port}/v1/alice", r)])
        assert report.size is None and report.failures and sink.data == b""
    finally:
        listener.close()


def test_a_stalled_peer_costs_the_first_byte_budget_only(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (backlog) but never answers
    try:
        from transfer.peers import Replica
        r = Replica("k", 4, "00" * 32)
        import time
        start = time.monotonic()
        report, _ = fetch(client_config(first_byte_timeout=0.3), "k",
                          [holder("x", f"http://127.0.0.1:{listener.getsockname()[1]}/v1/alice", r)])
        assert report.size is None and "timed out" in report.failures[0]
        assert time.monotonic() - start < 3
    finally:
        listener.close()


def test_the_serve_cap_answers_503(node_a, tls, tmp_path):
    cache, _ = node_a
    r = put(cache, "k", b"data")
    with serve(tmp_path / "a", tls=tls, max_serves=1) as server:
        server._server.slots.acquire()  # one serve in progress
        report, _ = fetch(client_config(tls), "k", [holder("a", url_of(server), r)])
        assert report.size is None and "503" in report.failures[0]


def test_symlinks_and_files_of_other_owners_in_a_cache_are_never_served(node_a, tls, tmp_path):
    cache, server = node_a
    for key in ("link", "foreign"):
        put(cache, key, b"0123456789")
    secret = tmp_path / "secret"
    secret.write_bytes(b"root-only!")  # same size as the entries
    with cache.pin("link") as path:
        st = os.stat(path)
        os.unlink(path)
        os.symlink(secret, path)
        os.utime(secret, ns=(st.st_atime_ns, st.st_mtime_ns))  # passes the cache's size+mtime check
    with cache.pin("foreign") as path:
        os.chown(path, 12345, 12345)
    for key in ("link", "foreign"):
        status, _, body = raw_get(server, tls, f"/v1/alice/{digest_of(key)}", auth_for(server, key))
        assert status == 404 and b"root-only" not in body and b"0123456789" not in body


def test_peers_on_the_same_host_then_rack_come_first_and_equals_are_shuffled():
    import random
    from transfer.p2p.client import PeerClient
    from transfer.peers import Replica
    r = Replica("k", 1, "00" * 32)
    holders = [holder(n, "https://10.0.0.1/v1/alice", r, host=h, rack=k)
               for n, h, k in [("far1", "x", "r9"), ("rack1", "y", "r1"), ("self", "me", "r1"),
                               ("far2", "z", "r8"), ("rack2", "w", "r1")]]
    seen = set()
    for seed in range(20):
        client = PeerClient(client_config(node="me", rack="r1"), rng=random.Random(seed))
        order = [h.info.node for h in client.order(holders)]
        assert order[0] == "self" and set(order[1:3]) == {"rack1", "rack2"} and set(order[3:]) == {"far1", "far2"}
        seen.add(tuple(order))
    assert len(seen) == 4  # random among equals: both orders of each pair occur


@pytest.mark.parametrize("env, message", [
    ({}, "PEGASUS_CLOUDIO_P2P_BIND must be address:port"),
    ({"PEGASUS_CLOUDIO_P2P_BIND": "127.0.0.1:0"}, "PEGASUS_CLOUDIO_P2P_CERT and PEGASUS_CLOUDIO_P2P_KEY are required"),
    ({"PEGASUS_CLOUDIO_P2P_BIND": "127.0.0.1:0", "PEGASUS_CLOUDIO_P2P_PLAIN_HTTP": "1"},
     "PEGASUS_CLOUDIO_P2P_USERS must name the users"),
    ({"PEGASUS_CLOUDIO_P2P_BIND": "127.0.0.1:0", "PEGASUS_CLOUDIO_P2P_PLAIN_HTTP": "1",
      "PEGASUS_CLOUDIO_P2P_USERS": "alice=/tmp/x", "PEGASUS_CLOUDIO_P2P_TOKEN_FILE": "{token}"},
     "readable by group or others"),
])
def test_serve_refuses_bad_settings_with_one_line(tmp_path, env, message):
    import subprocess
    import sys
    token = tmp_path / "token"
    token.write_text("t")
    token.chmod(0o644)
    env = {k: v.format(token=token) for k, v in env.items()}
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "serve"], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PEGASUS_CLOUDIO_CONFIG=os.devnull, **env))
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_peer_client_never_takes_the_stagers_warm_sockets(node_a, tls):
    """The stager's warm sockets are the stores' (a job's copy adopts them in
    ``transfer.http.warm``); a peer read on the same HTTP pool must dial its own, and not
    report the peer's address as one to keep warm."""
    from transfer.http import warm
    cache, server = node_a
    replica = put(cache, "s3://b/w#e", b"w" * 10)
    warm.discard()  # (the process's earlier tests' stores are in its record of addresses used)
    lure = socket.create_connection(server.address)  # a warm socket to the peer's own address
    warm.adopt(server.address, [lure])
    try:
        report, sink = fetch(client_config(tls), replica.key, [holder("a", url_of(server), replica)])
        assert report.size == 10 and bytes(sink.data) == b"w" * 10, report.failures
        assert warm.on_hand(server.address) == 1 and server.address not in warm.used() and warm.used() == []
    finally:
        warm.discard()



def _ipv6_front(target):
    """A listener on [::1] forwarding its one connection to ``target`` (the daemon binds IPv4)."""
    listener = socket.create_server(("::1", 0), family=socket.AF_INET6)

    def pump(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
            b.shutdown(socket.SHUT_WR)
        except OSError:  # the other side closed first (the client's close ends both ways)
            pass

    def serve_one():
        conn, _ = listener.accept()
        back = socket.create_connection(target)
        threading.Thread(target=pump, args=(back, conn), daemon=True).start()
        pump(conn, back)

    threading.Thread(target=serve_one, daemon=True).start()
    return listener


def test_a_peer_at_an_ipv6_address_is_read(tmp_path):
    """A peer's URL may name an IPv6 address (in brackets): the pool's origin keeps them (over
    TLS, whose proof is bound to the certificate, not to the address dialled)."""
    tls = make_tls_files(tmp_path / "tls6", ips=("127.0.0.1", "::1"))
    cache = new_cache(tmp_path / "v6")
    server = serve(tmp_path / "v6", tls=tls)
    front = _ipv6_front(server.address)
    try:
        replica = put(cache, "s3://b/v6#e", b"6" * 100)
        url = f"https://[::1]:{front.getsockname()[1]}/v1/alice"
        config = client_config(tls, networks=parse_networks("::1/128"))
        report, sink = fetch(config, replica.key, [holder("a", url, replica)])
        assert report.size == 100 and bytes(sink.data) == b"6" * 100, report.failures
    finally:
        front.close()
        server.stop()
