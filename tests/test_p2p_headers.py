"""The cache daemon reads a bounded request: http.server alone would take 100 header lines of
64 KiB each (6.5 MB) from any client before the pool token is checked, on each of the
connections the daemon admits (256 per served user: 1.7 GB). Loopback, the real server."""

from __future__ import annotations

import socket
import tracemalloc

from p2p_support import new_cache, put, serve

LINE = b"X-Pad: " + b"a" * (60 * 1024) + b"\r\n"


def _send_fat_request(address) -> bytes:
    """100 header lines of 60 KiB after a request line; what the daemon answers."""
    sock = socket.create_connection(address, timeout=10)
    try:
        sock.sendall(b"GET /v1/alice/" + b"0" * 64 + b" HTTP/1.1\r\n")
        try:
            for _ in range(100):
                sock.sendall(LINE)
            sock.sendall(b"\r\n")
        except OSError:
            pass  # the daemon hung up on it
        answer = b""
        try:
            while len(answer) < 4096:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
        except OSError:
            pass
        return answer
    finally:
        sock.close()


def test_an_unauthenticated_client_cannot_make_the_daemon_hold_megabytes_of_headers(tmp_path):
    put(new_cache(tmp_path / "a"), "s3://b/k", b"data")
    with serve(tmp_path / "a") as server:
        tracemalloc.start()
        try:
            answer = _send_fat_request(server.address)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes held at the peak of one request's headers"
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431 "), answer[:200]
