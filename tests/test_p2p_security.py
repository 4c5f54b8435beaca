"""Attacks on the cache daemon and the peer client, on loopback (``docs/security.md``).

Each test names the attack it refuses: reading another identity's entry by its key,
replaying a proof to another daemon, links/FIFOs/devices planted as an entry's data or
metadata, huge and malformed ``Range`` headers, connection floods, and a peer client that
would trust the system CAs. The network-namespace version, with two Unix users and two store
identities, is tests/test_p2p_trust.py.
"""

from __future__ import annotations

import http.client
import os
import pwd
import resource
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pegasus_cloudio.p2p.limits import ConnectionLimits
from pegasus_cloudio_testbed.certs import make_tls_files
from transfer.cache.layout import Layout, digest_of
from transfer.errors import ConfigError
from transfer.p2p.config import peer_config_from_env
from transfer.peers import derive_scope
from p2p_support import SCOPE, TOKEN, auth, client_config, fetch, holder, new_cache, put, serve, url_of

OTHER = derive_scope("bob-store-secret", "s3", "http://store", "bob", "b")


@pytest.fixture
def tls(tmp_path):
    return make_tls_files(tmp_path / "tls")


def raw(server, tls, path, headers, method="GET", timeout=5.0):
    context = ssl.create_default_context(cafile=str(tls.ca_cert))
    conn = http.client.HTTPSConnection(*server.address, context=context, timeout=timeout)
    try:
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def entry_paths(cache, key):
    return Layout(cache.directory).paths(key)


# -- who may read ---------------------------------------------------------------------------


def test_a_reader_of_another_identity_gets_nothing_by_key(tmp_path, tls):
    cache = new_cache(tmp_path / "a")
    r = put(cache, "s3://b/private.dat", b"alice's private bytes")
    with serve(tmp_path / "a", tls=tls) as server:
        path = f"/v1/alice/{digest_of(r.key)}"
        token_only = {"Authorization": f"Bearer {TOKEN}"}
        for headers in (token_only, auth(server, r.key, OTHER)):
            status, _, body = raw(server, tls, path, headers)
            assert status == 404 and b"private" not in body
        report, sink = fetch(client_config(tls), r.key, [holder("a", url_of(server), r)], OTHER)
        assert report.size is None and "404" in report.failures[0] and sink.data == b""
        status, _, body = raw(server, tls, path, auth(server, r.key))  # alice's own scope: served
        assert (status, body) == (200, b"alice's private bytes")


def test_a_proof_collected_by_one_daemon_is_refused_by_another(tmp_path, tls):
    """A hostile daemon (its own certificate from the pool CA) sees readers' proofs; they are
    bound to its certificate, so replaying one to the real holder gets nothing."""
    cache = new_cache(tmp_path / "a")
    r = put(cache, "s3://b/f", b"payload")
    other_tls = make_tls_files(tmp_path / "tls2")  # another certificate
    with serve(tmp_path / "a", tls=tls) as real, serve(tmp_path / "a", tls=other_tls) as hostile:
        collected = auth(hostile, r.key)
        status, _, body = raw(real, tls, f"/v1/alice/{digest_of(r.key)}", collected)
        assert status == 404 and body != b"payload"


# -- what is read -------------------------------------------------------------------------


def _plant(cache, key, which, kind, tmp_path):
    """Replace the entry's data or metadata file with a link, a FIFO or a device."""
    paths = entry_paths(cache, key)
    target = paths.data if which == "data" else paths.meta
    outside = tmp_path / f"outside-{which}"
    with open(target, "rb") as fh:
        outside.write_bytes(fh.read())
    st = os.stat(target)
    os.unlink(target)
    if kind == "symlink":
        os.symlink(outside, target)
        os.utime(outside, ns=(st.st_atime_ns, st.st_mtime_ns))  # the copy passes size+mtime checks
    elif kind == "fifo":
        os.mkfifo(target, 0o600)
    else:
        os.mknod(target, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero


@pytest.mark.parametrize("which", ["data", "meta"])
@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_links_and_fifos_planted_in_a_cache_are_refused_at_once(tmp_path, tls, which, kind):
    cache = new_cache(tmp_path / "a")
    r = put(cache, "s3://b/k", b"0123456789")
    _plant(cache, r.key, which, kind, tmp_path)
    with serve(tmp_path / "a", tls=tls) as server:
        status, _, body = raw(server, tls, f"/v1/alice/{digest_of(r.key)}", auth(server, r.key))
        assert status == 404 and body != b"0123456789"


SERVER = """
import sys, time
from pegasus_cloudio.p2p.server import CacheServer, ServeConfig
server = CacheServer(ServeConfig({"alice": sys.argv[1]}, sys.argv[2], ("127.0.0.1", 0), plain_http=True)).start()
print(server.address[1], flush=True)
time.sleep(600)
"""


def test_a_device_planted_as_metadata_is_refused_without_reading_it(tmp_path):
    """``<digest>.meta`` as /dev/zero: today's daemon read it until memory ran out. Here the
    daemon runs in a child process with a 1 GiB address-space cap, so a regression fails
    the test instead of the machine."""
    cache = new_cache(tmp_path / "a")
    r = put(cache, "s3://b/k", b"0123456789")
    _plant(cache, r.key, "meta", "device", tmp_path)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    proc = subprocess.Popen([sys.executable, "-c", SERVER, cache.directory, TOKEN], stdout=subprocess.PIPE,
                            preexec_fn=cap, text=True)
    try:
        port = int(proc.stdout.readline())
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", f"/v1/alice/{digest_of(r.key)}", headers={"Authorization": f"Bearer {TOKEN}",
                                                                      "X-Pcio-Proof": "0" * 64})
        assert conn.getresponse().status == 404
        conn.close()
        # the proof is checked first; with a valid one the metadata is opened, and refused
        from transfer.peers import proof
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", f"/v1/alice/{digest_of(r.key)}", headers={
            "Authorization": f"Bearer {TOKEN}", "X-Pcio-Proof": proof(SCOPE.capability(r.key), f"plain:127.0.0.1:{port}",
                                                                      digest_of(r.key))})
        assert conn.getresponse().status == 404 and proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("header, status, content_range", [
    ("bytes=" + "9" * 5000 + "-", 416, "bytes */10"),
    ("bytes=0-" + "9" * 5000, 206, "bytes 0-9/10"),
    ("bytes=-" + "9" * 5000, 206, "bytes 0-9/10"),
    ("bytes=" + "1" * 19 + "-" + "2" * 19, 416, "bytes */10"),
])
def test_huge_range_bounds_get_an_answer(tmp_path, tls, header, status, content_range):
    cache = new_cache(tmp_path / "a")
    r = put(cache, "s3://b/k", b"0123456789")
    with serve(tmp_path / "a", tls=tls) as server:
        got, headers, body = raw(server, tls, f"/v1/alice/{digest_of(r.key)}", {**auth(server, r.key),
                                                                                "Range": header})
        assert (got, headers.get("Content-Range")) == (status, content_range)
        assert body == (b"0123456789" if status == 206 else b"")


@pytest.mark.parametrize("header", ["bytes=abc", "items=0-1", "bytes=-", "bytes=0-1,x", "bytes 0-1"])
def test_unparsable_range_is_ignored(tmp_path, tls, header):
    """RFC 9110 14.2: a Range field the server cannot parse or does not support is ignored:
    200, the whole body, no Content-Range (a 206 with the whole body reads as a span)."""
    cache = new_cache(tmp_path / "a")
    r = put(cache, "s3://b/k", b"0123456789")
    with serve(tmp_path / "a", tls=tls) as server:
        got, headers, body = raw(server, tls, f"/v1/alice/{digest_of(r.key)}", {**auth(server, r.key),
                                                                                "Range": header})
        assert (got, headers.get("Content-Range"), body) == (200, None, b"0123456789")


# -- how much and how long ----------------------------------------------------------------


def _connect_many(address, count):
    socks = []
    for _ in range(count):
        s = socket.create_connection(address, timeout=5)
        socks.append(s)
    return socks


def _closed_by_server(sock, deadline):
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except (socket.timeout, OSError):
        return False


def test_a_connection_flood_is_bounded_in_count_threads_and_time(tmp_path, tls):
    cache = new_cache(tmp_path / "a")
    r = put(cache, "s3://b/k", b"data")
    limits = ConnectionLimits(max_connections=12, max_per_address=6, handshake_seconds=1.0, idle_seconds=2.0)
    with serve(tmp_path / "a", tls=tls, limits=limits) as server:
        threads_before = threading.active_count()
        socks = _connect_many(server.address, 200)  # never send a byte
        try:
            deadline = time.monotonic() + 10
            threads = 0
            while server.connections.refused < 150 and time.monotonic() < deadline:
                threads = max(threads, threading.active_count() - threads_before)
                time.sleep(0.01)
            assert server.connections.refused >= 150 and server.connections.peak <= 6
            assert threads <= 6
            deadline = time.monotonic() + 10  # the handshake deadline (1 s) closes the admitted ones
            assert all(_closed_by_server(s, deadline) for s in socks)
        finally:
            for s in socks:
                s.close()
        report, sink = fetch(client_config(tls), r.key, [holder("a", url_of(server), r)])
        assert report.size == 4  # and it still serves


def test_a_request_dripped_byte_by_byte_is_cut_off(tmp_path):
    """Slowloris: each byte arrives before any per-read timeout, the request never ends."""
    cache = new_cache(tmp_path / "a")
    put(cache, "s3://b/k", b"data")
    limits = ConnectionLimits(handshake_seconds=1.0, idle_seconds=1.5)
    with serve(tmp_path / "a", limits=limits) as server:
        sock = socket.create_connection(server.address, timeout=5)
        start = time.monotonic()
        try:
            for byte in b"GET /v1/alice/" + b"0" * 64 + b" HTTP/1.1\r\nX-Drip: ":
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
                if time.monotonic() - start > 8:
                    break
        except OSError:
            pass  # the server closed it
        assert _closed_by_server(sock, time.monotonic() + 1) and time.monotonic() - start < 5
        sock.close()


def test_an_unauthenticated_request_ends_its_connection(tmp_path, tls):
    cache = new_cache(tmp_path / "a")
    put(cache, "s3://b/k", b"data")
    with serve(tmp_path / "a", tls=tls) as server:
        context = ssl.create_default_context(cafile=str(tls.ca_cert))
        conn = http.client.HTTPSConnection(*server.address, context=context, timeout=5)
        conn.request("GET", "/v1/alice/" + "0" * 64, headers={"Authorization": "Bearer wrong"})
        response = conn.getresponse()
        response.read()
        assert response.status == 401 and response.getheader("Connection") == "close"
        conn.close()


# -- whom the client trusts -----------------------------------------------------------------


def test_the_client_never_trusts_the_system_cas_for_peers(tmp_path, tls, monkeypatch):
    """The daemon's certificate chains to a CA the system store trusts (SSL_CERT_FILE), but
    not to a pool CA file: the client refuses it, and the settings refuse to start."""
    cache = new_cache(tmp_path / "a")
    r = put(cache, "s3://b/k", b"data")
    monkeypatch.setenv("SSL_CERT_FILE", str(tls.ca_cert))
    with serve(tmp_path / "a", tls=tls) as server:
        report, sink = fetch(client_config(None, plain_http=False), r.key, [holder("a", url_of(server), r)])
        assert report.size is None and "CERTIFICATE_VERIFY_FAILED" in report.failures[0] and sink.data == b""
    env = {"PEGASUS_CLOUDIO_CONFIG": os.devnull, "PEGASUS_CLOUDIO_P2P_REDIS": "redis://127.0.0.1:1/0",
           "PEGASUS_CLOUDIO_P2P_TOKEN": TOKEN}
    with pytest.raises(ConfigError, match="PEGASUS_CLOUDIO_P2P_CA_FILE"):
        peer_config_from_env(env)


def test_serve_as_root_refuses_a_user_that_does_not_exist(tmp_path):
    """Each cache is served by a process running as its user: one that does not exist is a
    one-line error, not a daemon serving her cache as root."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    env = dict(os.environ, PEGASUS_CLOUDIO_CONFIG=os.devnull, PEGASUS_CLOUDIO_P2P_BIND="127.0.0.1:0",
               PEGASUS_CLOUDIO_P2P_PLAIN_HTTP="1", PEGASUS_CLOUDIO_P2P_TOKEN_FILE=str(token),
               PEGASUS_CLOUDIO_P2P_USERS=f"no-such-user-pcio={tmp_path}")
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "serve"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "no-such-user-pcio: no such user on this node" in done.stderr


@pytest.fixture
def suid_dumpable_on():
    """The node's ``fs.suid_dumpable`` set to 1 (a site debugging crashes), restored after."""
    knob = Path("/proc/sys/fs/suid_dumpable")
    before = knob.read_text()
    knob.write_text("1")
    try:
        yield
    finally:
        knob.write_text(before)


def test_a_serving_process_is_not_dumpable_whatever_the_node_allows(suid_dumpable_on):
    """The process serving a user's cache holds the node's TLS key: that user may not attach
    to it or read its memory, even where the kernel lets processes that changed user dump."""
    from pegasus_cloudio.p2p.serve import drop_privileges

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            drop_privileges("nobody")
            status = os.stat(f"/proc/{os.getpid()}/status")  # owned by root unless dumpable
            os.write(write, f"{os.geteuid()} {status.st_uid}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as answer:
        euid, owner = answer.read().split()
    assert os.waitpid(pid, 0)[1] == 0
    assert int(euid) == pwd.getpwnam("nobody").pw_uid and int(owner) == 0
