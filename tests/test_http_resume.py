"""A broken HTTP(S) body resumes inside its request (issue 39, item 11): an ``http.server``
that honours ``Range`` and ``If-Match`` behind the fault proxy, which cuts an answer part-way."""

from __future__ import annotations

import os
import re
from http.server import BaseHTTPRequestHandler

import pytest

from pegasus_cloudio_testbed.proxy import Fault, TcpProxy
from pegasus_cloudio_testbed.webserver import serve
from transfer import Engine, RemoteError, Session, Settings, Transfer, parse_url

DATA = os.urandom(2 << 20)
CUT = 600 << 10


class _Ranged(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    etag = '"v1"'

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        first, last = 0, len(DATA) - 1
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if self.headers.get("If-Match") not in (None, self.etag):
            self.send_response(412)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if match:
            first, last = int(match.group(1)), int(match.group(2))
        self.send_response(206 if match else 200)
        self.send_header("ETag", self.etag)
        self.send_header("Content-Length", str(last - first + 1))
        if match:
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(DATA)}")
        self.end_headers()
        self.wfile.write(DATA[first:last + 1])

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def origin():
    server = serve(_Ranged)
    try:
        with TcpProxy(("127.0.0.1", server.server_address[1])) as proxy:
            yield proxy
    finally:
        server.shutdown()
        server.server_close()


def fetch(proxy, dest):
    with Session(Settings(max_attempts=1), {"HOME": str(dest.parent)}) as session:
        [result] = Engine(session).run([Transfer((parse_url(f"{proxy.url()}/obj"),), parse_url(f"file://{dest}"))])
    return result


@pytest.mark.parametrize("cut", [Fault.reset(CUT, method="GET"), Fault.truncate(CUT, method="GET"),
                                 Fault.reset(0, method="GET")], ids=["reset", "closed", "reset-before-any-byte"])
def test_a_cut_http_body_completes_within_one_attempt(origin, tmp_path, cut):
    origin.set_faults([cut])
    result = fetch(origin, tmp_path / "got")
    assert result.ok and result.attempts == 1, result.error
    assert (tmp_path / "got").read_bytes() == DATA
    assert origin.requests_by_method == {"GET": 2}


def test_a_changed_http_object_is_not_spliced(origin, tmp_path):
    origin.set_faults([Fault.reset(CUT, method="GET"), Fault.status(200, body=b"other", method="GET")])
    result = fetch(origin, tmp_path / "got")
    assert not result.ok and isinstance(result.error, RemoteError) and "changed" in str(result.error)
    assert [n for n in os.listdir(tmp_path) if "got" in n] == []
