"""The test bed's TCP proxy: counting requests without parsing bodies, faults (status, reset,
truncate, stall), latency, jitter, rate caps and shutdown, against a small HTTP/1.1 upstream
and a byte-exact raw client."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from pegasus_cloudio_testbed.proxy import SLOW_DOWN_BODY, Fault, Shaping, TcpProxy

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
