"""The test bed itself: the TCP proxy (counting, faults, latency), MinIO over
http and https, TLS files, the stock Pegasus shims and the tool cache."""

from __future__ import annotations

import configparser
import hashlib
import ipaddress
import json
import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import boto3
import pytest
from botocore.config import Config
from cryptography import x509

from pegasus_cloudio_testbed import tools
from pegasus_cloudio_testbed.certs import make_tls_files
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.ports import free_port
from pegasus_cloudio_testbed.proxy import SLOW_DOWN_BODY, Fault, Shaping, TcpProxy
from pegasus_cloudio_testbed.stock import make_stock_home

# Request text hidden in upload bodies: a proxy that mis-frames bodies would count it.
FAKE_REQUEST = b"GET / HTTP/1.1\r\nHost: not-a-request\r\n\r\n"


# --------------------------------------------------------------------------- a small HTTP/1.1 upstream


def payload(n: int) -> bytes:
    return (b"0123456789abcdef" * (n // 16 + 1))[:n]


class UpstreamServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), UpstreamHandler)
        self.seen: List[Tuple[str, str, int]] = []  # (method, path, body length)
        self.seen_lock = threading.Lock()

    @property
    def address(self) -> Tuple[str, int]:
        host, port = self.server_address[:2]
        return (str(host), int(port))

    def record(self, method: str, path: str, size: int) -> None:
        with self.seen_lock:
            self.seen.append((method, path, size))


class UpstreamHandler(BaseHTTPRequestHandler):
    """GET/HEAD /bytes/N serve N bytes; PUT answers the body's sha256."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: UpstreamServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.record("GET", self.path, 0)
        self._reply(payload(self._size()))

    def do_HEAD(self) -> None:
        self.server.record("HEAD", self.path, 0)
        self._reply(b"", length=self._size())

    def do_PUT(self) -> None:
        body = self._read_body()
        self.server.record("PUT", self.path, len(body))
        self._reply(hashlib.sha256(body).hexdigest().encode())

    def _size(self) -> int:
        return int(self.path.rsplit("/", 1)[-1]) if self.path.startswith("/bytes/") else 5

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            return self.rfile.read(int(self.headers.get("Content-Length", "0")))
        parts: List[bytes] = []
        while True:
            size = int(self.rfile.readline().split(b";")[0], 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b""):
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()

    def _reply(self, body: bytes, length: Optional[int] = None) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamServer]:
    server = UpstreamServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(upstream: UpstreamServer) -> Iterator[TcpProxy]:
    with upstream.seen_lock:
        upstream.seen.clear()
    with TcpProxy(upstream.address) as relay:
        yield relay


# --------------------------------------------------------------------------- a byte-exact raw client


def request(method: str, path: str, body: bytes = b"", *, chunks: Sequence[bytes] = (),
            headers: Sequence[str] = ()) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: upstream", *headers]
    if chunks:
        lines.append("Transfer-Encoding: chunked")
        framed = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\nX-Trailer: t\r\n\r\n"
    else:
        framed = body
        if body or method == "PUT":
            lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + framed


class RawClient:
    """Keep-alive HTTP/1.1 over a plain socket, counting every byte both ways."""

    def __init__(self, address: Tuple[str, int], timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sent = 0
        self.received = 0
        self._buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)
        self.sent += len(data)

    def _recv(self) -> bytes:
        data = self.sock.recv(1 << 16)
        self.received += len(data)
        if not data:
            raise EOFError("connection closed")
        return data

    def response(self, *, head_only: bool = False) -> Tuple[int, Dict[str, str], bytes]:
        while b"\r\n\r\n" not in self._buf:
            self._buf += self._recv()
        head, _, rest = self._buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        size = 0 if head_only else int(fields.get("content-length", "0"))
        while len(rest) < size:
            rest += self._recv()
        body, self._buf = rest[:size], rest[size:]
        return int(lines[0].split()[1]), fields, body

    def exchange(self, data: bytes, **kwargs: bool) -> Tuple[int, Dict[str, str], bytes]:
        self.send(data)
        return self.response(**kwargs)

    def drain(self) -> bytes:
        """Everything until EOF (resets propagate as ConnectionResetError)."""
        chunks = [self._buf]
        self._buf = b""
        while True:
            try:
                chunks.append(self._recv())
            except EOFError:
                return b"".join(chunks)

    def close(self) -> None:
        self.sock.close()


# --------------------------------------------------------------------------- proxy: counting


def test_proxy_counts_keepalive_requests_and_never_parses_bodies(proxy: TcpProxy,
                                                                 upstream: UpstreamServer) -> None:
    big = FAKE_REQUEST * 8000  # ~300 KB: spans many reads
    client = RawClient(proxy.address)
    assert client.exchange(request("GET", "/bytes/100"))[2] == payload(100)
    assert client.exchange(request("PUT", "/plain", big))[2] == hashlib.sha256(big).hexdigest().encode()
    chunks = [FAKE_REQUEST, FAKE_REQUEST * 3000, b"0\r\n\r\n" + FAKE_REQUEST]
    digest = hashlib.sha256(b"".join(chunks)).hexdigest().encode()
    assert client.exchange(request("PUT", "/chunked", chunks=chunks))[2] == digest
    status, fields, _ = client.exchange(request("HEAD", "/bytes/7"), head_only=True)
    assert (status, fields["content-length"]) == (200, "7")
    split = request("GET", "/bytes/3")  # a head that arrives in two pieces
    client.send(split[:10])
    time.sleep(0.05)
    assert client.exchange(split[10:])[2] == payload(3)
    client.close()

    assert proxy.connections == 1
    assert proxy.requests == 5
    assert proxy.requests_by_method == {"GET": 2, "PUT": 2, "HEAD": 1}
    assert proxy.bytes_up == client.sent
    assert proxy.bytes_down == client.received
    assert [(m, p) for m, p, _ in upstream.seen] == [
        ("GET", "/bytes/100"), ("PUT", "/plain"), ("PUT", "/chunked"), ("HEAD", "/bytes/7"),
        ("GET", "/bytes/3")]


def test_proxy_counts_each_connection_and_resets_counters(proxy: TcpProxy) -> None:
    for _ in range(3):
        client = RawClient(proxy.address)
        client.exchange(request("GET", "/bytes/10"))
        client.close()
    snap = proxy.snapshot()
    assert (snap["connections"], snap["requests"], snap["requests_by_method"]) == (3, 3, {"GET": 3})
    proxy.reset_counters()
    assert proxy.snapshot() == {"connections": 0, "requests": 0, "requests_by_method": {},
                                "bytes_up": 0, "bytes_down": 0, "faults_triggered": 0}


def test_proxy_relays_a_non_http_stream_untouched() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with TcpProxy(listener.getsockname()) as relay:
            client = socket.create_connection(relay.address, timeout=5)
            server, _ = listener.accept()
            tls_like = b"\x16\x03\x01\x02\x00" + bytes(range(256)) * 4
            client.sendall(tls_like)
            received = b""
            while len(received) < len(tls_like):
                received += server.recv(65536)
            server.close()
            client.close()
            assert received == tls_like
            assert relay.requests == 0 and relay.bytes_up == len(tls_like)


# --------------------------------------------------------------------------- proxy: faults


def test_status_fault_answers_without_forwarding_and_keeps_the_connection(
        proxy: TcpProxy, upstream: UpstreamServer) -> None:
    proxy.set_faults([Fault.status(503, times=2, method="PUT")])
    client = RawClient(proxy.address)
    body = FAKE_REQUEST * 5000
    status, fields, answer = client.exchange(request("PUT", "/a", body))
    assert (status, answer) == (503, SLOW_DOWN_BODY)
    assert fields["content-length"] == str(len(SLOW_DOWN_BODY))
    assert client.exchange(request("GET", "/bytes/4"))[:3:2] == (200, payload(4))  # not matched
    chunked = request("PUT", "/b", chunks=[FAKE_REQUEST] * 50)
    assert client.exchange(chunked)[0] == 503
    assert client.exchange(request("PUT", "/c", body))[0] == 200  # times exhausted
    client.close()
    assert [(m, p) for m, p, _ in upstream.seen] == [("GET", "/bytes/4"), ("PUT", "/c")]
    assert proxy.requests == 4 and proxy.snapshot()["faults_triggered"] == 2
    assert proxy.pending_faults() == 0


def test_status_fault_matches_path_and_custom_response(proxy: TcpProxy) -> None:
    proxy.set_faults([Fault.status(500, body=b"oops", headers={"Retry-After": "1"}, path="/hit")])
    client = RawClient(proxy.address)
    assert client.exchange(request("GET", "/bytes/1"))[0] == 200
    status, fields, body = client.exchange(request("GET", "/x/hit?y=1"))
    assert (status, fields["retry-after"], body) == (500, "1", b"oops")
    head_status, head_fields, _ = client.exchange(request("HEAD", "/hit"), head_only=True)
    assert head_status == 200 and head_fields["content-length"] == "5"  # fault used up
    client.close()


def test_reset_fault_aborts_with_rst_after_n_response_bytes(proxy: TcpProxy) -> None:
    proxy.set_faults([Fault.reset(after_bytes=1000)])
    client = RawClient(proxy.address)
    client.send(request("GET", "/bytes/200000"))
    with pytest.raises(ConnectionResetError):
        client.drain()
    assert 0 < client.received <= 1000
    client.close()
    fresh = RawClient(proxy.address)  # the proxy itself is unaffected
    assert fresh.exchange(request("GET", "/bytes/10"))[2] == payload(10)
    fresh.close()


def test_truncate_fault_closes_cleanly_after_n_response_bytes(proxy: TcpProxy) -> None:
    proxy.set_faults([Fault.truncate(after_bytes=1000, method="GET")])
    client = RawClient(proxy.address)
    client.send(request("GET", "/bytes/200000"))
    data = client.drain()
    assert len(data) == 1000 and data.startswith(b"HTTP/1.1 200")
    client.close()


def test_stall_fault_pauses_then_closes(proxy: TcpProxy) -> None:
    proxy.set_faults([Fault.stall(seconds=1.0, after_bytes=1000)])
    client = RawClient(proxy.address, timeout=5.0)
    started = time.monotonic()
    client.send(request("GET", "/bytes/200000"))
    data = client.drain()
    elapsed = time.monotonic() - started
    assert len(data) == 1000
    assert 0.9 <= elapsed < 4.0
    client.close()


def test_response_fault_hits_only_its_own_request(proxy: TcpProxy) -> None:
    """A threshold beyond the response length does not leak onto the next request."""
    proxy.set_faults([Fault.truncate(after_bytes=10_000, path="/bytes/100"), Fault.reset(path="/never")])
    client = RawClient(proxy.address)
    assert client.exchange(request("GET", "/bytes/100"))[2] == payload(100)
    assert client.exchange(request("GET", "/bytes/50000"))[2] == payload(50000)
    client.close()
    assert proxy.pending_faults() == 1
    proxy.clear_faults()
    assert proxy.pending_faults() == 0


# --------------------------------------------------------------------------- proxy: latency, shutdown


def _timed_requests(address: Tuple[str, int], count: int) -> Tuple[float, List[float]]:
    """(seconds for connect + first request, seconds for each later request)."""
    started = time.monotonic()
    client = RawClient(address)
    client.exchange(request("GET", "/bytes/10"))
    first = time.monotonic() - started
    later = []
    for _ in range(count):
        t0 = time.monotonic()
        client.exchange(request("GET", "/bytes/10"))
        later.append(time.monotonic() - t0)
    client.close()
    return first, later


def test_delay_adds_one_way_latency_and_a_handshake_round_trip(upstream: UpstreamServer) -> None:
    # Lower bounds only: a loaded machine can make anything slower, never faster.
    with TcpProxy(upstream.address, delay_ms=20) as slow:
        first, later = _timed_requests(slow.address, 10)
    assert min(later) >= 0.040  # request and response each wait 20 ms
    assert first >= 0.080  # handshake RTT + request RTT


def test_delay_does_not_limit_throughput(upstream: UpstreamServer) -> None:
    """The proxy keeps reading from upstream while earlier bytes wait out their delay
    (a stop-and-wait relay would read one chunk per round trip)."""
    size = 16 << 20
    with TcpProxy(upstream.address, delay_ms=200) as slow:
        client = RawClient(slow.address)
        client.send(request("GET", f"/bytes/{size}"))
        first = client.sock.recv(1)  # the first byte arrives 200 ms after it was read
        read_ahead = slow.bytes_down
        client.received += len(first)
        client._buf = first
        assert len(client.response()[2]) == size
        client.close()
    assert read_ahead >= 1 << 20


def test_jitter_keeps_byte_order_and_delays_at_least_the_base(upstream: UpstreamServer) -> None:
    size = 4 << 20
    with TcpProxy(upstream.address, shaping=Shaping(delay_ms=5, jitter_ms=10)) as jittery:
        first, later = _timed_requests(jittery.address, 5)
        client = RawClient(jittery.address)
        assert client.exchange(request("GET", f"/bytes/{size}"))[2] == payload(size)
        client.close()
    assert min(later) >= 0.010 and first >= 0.020


def test_rate_cap_sets_a_floor_on_transfer_time(upstream: UpstreamServer) -> None:
    size = 2 << 20
    with TcpProxy(upstream.address, shaping=Shaping(rate_bps=8 << 20)) as capped:
        assert capped.shaping.describe() == "rtt 0 ms, 8.38861 MB/s"
        client = RawClient(capped.address)
        started = time.monotonic()
        assert client.exchange(request("GET", f"/bytes/{size}"))[2] == payload(size)
        elapsed = time.monotonic() - started
        client.close()
    assert elapsed >= 0.25  # 2 MiB at 8 MiB/s


def test_shaping_from_rtt_and_refuses_nonsense() -> None:
    assert Shaping.rtt(20, jitter_ms=2) == Shaping(delay_ms=10, jitter_ms=2)
    assert not Shaping().active and Shaping(rate_bps=1).active
    with pytest.raises(ValueError):
        Shaping(delay_ms=-1)
    with pytest.raises(ValueError):
        TcpProxy(("127.0.0.1", 1), delay_ms=1, shaping=Shaping(1))


def test_stop_closes_live_connections_and_joins_threads(upstream: UpstreamServer) -> None:
    relay = TcpProxy(upstream.address, delay_ms=1).start()
    clients = [RawClient(relay.address) for _ in range(3)]
    for client in clients:
        client.exchange(request("GET", "/bytes/10"))
    assert relay.open_connections == 3
    relay.stop()
    for client in clients:
        with pytest.raises((EOFError, ConnectionResetError)):
            client.exchange(request("GET", "/bytes/10"))
        client.close()
    prefix = f"tcpproxy-{relay.port}-"
    assert not [t.name for t in threading.enumerate() if t.name.startswith(prefix)]
    with pytest.raises(OSError):
        socket.create_connection(relay.address, timeout=1).close()


# --------------------------------------------------------------------------- TLS files, MinIO


def test_tls_files_are_private_and_name_loopback(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path / "tls")
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    assert cert.issuer == ca.subject and cert.issuer != cert.subject


def _s3_client(server: MinioServer, endpoint: Optional[str] = None) -> Any:
    return boto3.client(
        "s3", endpoint_url=endpoint or server.endpoint, region_name="us-east-1",
        aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key,
        verify=str(server.ca_file) if server.ca_file else None,
        config=Config(retries={"mode": "standard", "max_attempts": 3}),
    )


def test_minio_over_http_serves_s3_and_writes_credentials(minio: MinioServer, tmp_path: Path) -> None:
    assert minio.endpoint == f"http://127.0.0.1:{minio.port}" and minio.ca_file is None
    with urllib.request.urlopen(minio.endpoint + "/minio/health/cluster", timeout=5) as answer:
        assert answer.status == 200
    s3 = _s3_client(minio)
    s3.create_bucket(Bucket="testbed-http")
    s3.put_object(Bucket="testbed-http", Key="k", Body=b"hello")
    assert s3.get_object(Bucket="testbed-http", Key="k")["Body"].read() == b"hello"

    path = minio.write_pegasus_credentials(tmp_path / "creds.conf", endpoint="http://127.0.0.1:1")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ini = configparser.ConfigParser()
    ini.read(path)
    assert ini["minio"]["endpoint"] == "http://127.0.0.1:1"
    assert dict(ini["test@minio"]) == {"access_key": minio.access_key, "secret_key": minio.secret_key}


def test_minio_over_https_is_verified_against_the_generated_ca(minio_tls: MinioServer) -> None:
    assert minio_tls.endpoint == f"https://127.0.0.1:{minio_tls.port}"
    assert minio_tls.ca_file is not None
    trusted = ssl.create_default_context(cafile=str(minio_tls.ca_file))
    url = minio_tls.endpoint + "/minio/health/cluster"
    with urllib.request.urlopen(url, timeout=5, context=trusted) as answer:
        assert answer.status == 200
    with pytest.raises(urllib.error.URLError) as refused:
        urllib.request.urlopen(url, timeout=5, context=ssl.create_default_context())
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
    s3 = _s3_client(minio_tls)
    s3.create_bucket(Bucket="testbed-https")
    assert s3.list_objects_v2(Bucket="testbed-https")["KeyCount"] == 0


def test_minio_start_failure_raises_with_the_log(tmp_path: Path) -> None:
    fake = tmp_path / "minio"
    fake.write_text("#!/bin/sh\necho 'FATAL something broke' >&2\nexit 1\n")
    fake.chmod(0o755)
    server = MinioServer(binary=fake, start_timeout=5)
    with pytest.raises(RuntimeError, match="something broke"):
        server.start()
    assert server.log_file is None  # stopped and cleaned up


def test_proxy_in_front_of_minio_counts_sdk_requests_and_slowdown_is_retried(
        minio: MinioServer) -> None:
    with TcpProxy((minio.host, minio.port)) as relay:
        s3 = _s3_client(minio, endpoint=relay.url())
        s3.create_bucket(Bucket="testbed-proxy")
        relay.reset_counters()
        body = os.urandom(3 << 20)  # large enough for Expect: 100-continue
        s3.put_object(Bucket="testbed-proxy", Key="big", Body=body)
        assert relay.requests_by_method == {"PUT": 1}
        relay.set_faults([Fault.status(503, method="GET")])
        assert s3.get_object(Bucket="testbed-proxy", Key="big")["Body"].read() == body
        assert relay.requests_by_method == {"PUT": 1, "GET": 2}
        relay.set_faults([Fault.status(503, method="PUT")])
        s3.put_object(Bucket="testbed-proxy", Key="big2", Body=body)  # 503 before the body
        assert relay.requests_by_method["PUT"] == 3
        assert relay.bytes_up >= 2 * len(body)


# --------------------------------------------------------------------------- stock tools, tool cache


def test_stock_pegasus_transfer_copies_files_and_downloads_from_minio(
        minio: MinioServer, tmp_path: Path) -> None:
    _s3_client(minio).create_bucket(Bucket="testbed-stock")
    _s3_client(minio).put_object(Bucket="testbed-stock", Key="dir/obj.txt", Body=b"from minio\n")
    stock = make_stock_home(tmp_path / "home")
    assert os.access(stock.transfer, os.X_OK) and stock.home == (tmp_path / "home").resolve()
    (tmp_path / "src.txt").write_text("local\n")
    entries = [
        {"type": "transfer", "lfn": "a", "id": 1,
         "src_urls": [{"site_label": "local", "url": f"file://{tmp_path}/src.txt"}],
         "dest_urls": [{"site_label": "local", "url": f"file://{tmp_path}/out/a.txt"}]},
        {"type": "transfer", "lfn": "b", "id": 2,
         "src_urls": [{"site_label": "minio", "url": "s3://test@minio/testbed-stock/dir/obj.txt"}],
         "dest_urls": [{"site_label": "local", "url": f"file://{tmp_path}/out/b.txt"}]},
    ]
    env = stock.env(os.environ)
    assert env["PATH"].split(os.pathsep)[0] == str(stock.bin_dir)
    env["PEGASUS_CREDENTIALS"] = str(minio.write_pegasus_credentials(tmp_path / "creds.conf"))
    done = subprocess.run([str(stock.transfer), "--threads", "1"], input=json.dumps(entries),
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"Path: {stock.s3}" in done.stderr  # helper found via PEGASUS_HOME/bin
    assert (tmp_path / "out/a.txt").read_text() == "local\n"
    assert (tmp_path / "out/b.txt").read_text() == "from minio\n"


def _fake_tool(root: Path, name: str, stamp: str) -> Path:
    binary = root / "bin" / name
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\necho fake\n")
    binary.chmod(0o755)
    (root / "stamps").mkdir()
    (root / "stamps" / f"{name}.json").write_text(stamp)
    return binary


class BuildStarted(Exception):
    pass


def _refuse_build(message: str) -> None:
    raise BuildStarted(message)


def test_tool_with_current_stamp_is_reused(tmp_path: Path) -> None:
    binary = _fake_tool(tmp_path, "s5cmd", tools.PINS["s5cmd"].stamp_text())
    assert tools.ensure_tool("s5cmd", directory=tmp_path, progress=_refuse_build) == binary


def test_tool_with_a_different_pin_is_rebuilt(tmp_path: Path) -> None:
    _fake_tool(tmp_path, "s5cmd", tools.PINS["s5cmd"].stamp_text().replace("v2.3.0", "v2.2.0"))
    with pytest.raises(BuildStarted, match=r"building s5cmd \(pinned github.com/peak/s5cmd/v2@v2.3.0\)"):
        tools.ensure_tool("s5cmd", directory=tmp_path, progress=_refuse_build)


def test_tools_cli_and_tools_dir_honour_the_environment(tmp_path: Path) -> None:
    binary = _fake_tool(tmp_path, "s5cmd", tools.PINS["s5cmd"].stamp_text())
    env = dict(os.environ, PEGASUS_CLOUDIO_TOOLS_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio_testbed.tools", "s5cmd"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"s5cmd: {binary}"
    repo = Path(tools.__file__).resolve().parents[2]
    if "PEGASUS_CLOUDIO_TOOLS_DIR" not in os.environ:
        assert tools.tools_dir() == repo / ".tools"


def _scripted_go(tmp_path: Path) -> Path:
    """A ``go`` that stands for a slow toolchain: ``mod download`` answers at once, ``build``
    waits until the test creates ``release`` (a build on a busy machine), then writes the binary."""
    bin_dir = tmp_path / "gobin"
    bin_dir.mkdir()
    module = tmp_path / "module"
    module.mkdir()
    go = bin_dir / "go"
    go.write_text(f"""#!/bin/sh
case "$1" in
  mod) echo '{{"Dir": "{module}", "Origin": {{"Hash": "abcdef1"}}}}' ;;
  build) while [ ! -e {tmp_path}/release ]; do sleep 0.05; done
         while [ "$1" != "-o" ]; do shift; done; printf '#!/bin/sh\\n' > "$2"; chmod +x "$2" ;;
esac
""")
    go.chmod(0o755)
    return bin_dir


def _tools_build(tmp_path: Path, every: float) -> "subprocess.Popen[str]":
    code = (f"from pegasus_cloudio_testbed import tools; from pathlib import Path; "
            f"print(tools.ensure_tool('s5cmd', directory=Path({str(tmp_path / 'tools')!r}), progress_every={every}))")
    env = dict(os.environ, PATH=f"{_scripted_go(tmp_path)}:{os.environ['PATH']}")
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_a_slow_tool_build_goes_on_and_says_so(tmp_path: Path) -> None:
    """No fixed time limit (a busy machine's build took over 1,800 s and was killed): the build
    says it still runs, and finishes when the toolchain does."""
    proc = _tools_build(tmp_path, every=0.2)
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert first.startswith("building s5cmd"), first
    said = proc.stderr.readline()
    assert said.startswith("... still building s5cmd (") and "nothing is wrong" in said, said
    (tmp_path / "release").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == str(tmp_path / "tools" / "bin" / "s5cmd")


def test_ctrl_c_in_a_tool_build_is_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=f"{_scripted_go(tmp_path)}:{os.environ['PATH']}",
               PEGASUS_CLOUDIO_TOOLS_DIR=str(tmp_path / "tools"))
    proc = subprocess.Popen([sys.executable, "-m", "pegasus_cloudio_testbed.tools", "s5cmd"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    assert proc.stderr.readline().startswith("building s5cmd")
    proc.send_signal(signal.SIGINT)
    (tmp_path / "release").touch()  # the scripted go is not in a terminal's process group: let it end
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.count("\n") == 1 and "interrupted while building s5cmd" in err and "Traceback" not in err, err
    assert not (tmp_path / "tools" / "bin" / "s5cmd").exists()

def test_stamps_of_pins_without_a_source_keep_their_earlier_text() -> None:
    """Adding SourcePin must not turn every built MinIO and s5cmd stale (a rebuild each, or two
    checkouts of different ages sharing one tools dir rebuilding them in turn)."""
    assert tools.PINS["minio"].stamp_text() == (
        '{"ldflags": [], "method": "install", "module": "github.com/minio/minio", "name": "minio", '
        '"package": "", "version": "v0.0.0-20260212201848-7aac2a2c5b7c"}\n')
    go = json.loads(tools.PINS["pegasus-transfer-go"].stamp_text())
    assert go["source"]["archive_sha256"] == "a9bfc735e1c808c8c86f396ae577dc7bfb186d80cebd0e17c6a32214fd035b29"


def test_go_transfer_source_is_found_beside_the_checkout_or_where_the_environment_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tools.PINS["pegasus-transfer-go"].source
    assert source is not None
    found = tools.shared_dir(source.directory)
    assert (found / source.archive).is_file() and (found / source.gomod).is_file()
    monkeypatch.setenv("PEGASUS_CLOUDIO_SHARED_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match=f"{tmp_path}/pegasus-transfer-go: no such directory"):
        tools.shared_dir(source.directory)


def test_go_transfer_source_with_a_wrong_digest_is_refused_before_go_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tools.PINS["pegasus-transfer-go"].source
    assert source is not None
    shared = tmp_path / "shared" / source.directory
    shared.mkdir(parents=True)
    (shared / source.archive).write_bytes(b"not the pinned archive")
    (shared / source.gomod).write_bytes(b"module x\n")
    monkeypatch.setenv("PEGASUS_CLOUDIO_SHARED_DIR", str(tmp_path / "shared"))
    with pytest.raises(RuntimeError, match=f"{shared / source.archive}: sha256 [0-9a-f]{{64}}, expected "
                                           f"{source.archive_sha256} \\(not the pinned file\\)"):
        tools.ensure_tool("pegasus-transfer-go", directory=tmp_path / "tools", progress=lambda _: None)
    assert not (tmp_path / "tools" / "bin" / "pegasus-transfer-go").exists()


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
