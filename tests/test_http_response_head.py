"""How our HTTP/1.1 client reads a response head: the one-read parser
(:func:`transfer.http.message.buffered_head`) against the line-by-line reader it stands in
front of, kept here verbatim as the reference, on odd and random heads delivered in random
pieces (folded or repeated fields, bare LF, lone CR, Latin-1 whitespace, truncated heads,
heads and lines past the 64 KiB bound, too many fields); and against ``http.client`` on
well-formed heads. Same status, reason, fields, framing, and the same bytes left for the
body, or the same error (after which the connection is closed)."""

from __future__ import annotations

import http.client
import io
import random

import pytest

from transfer.errors import TransientError
from transfer.http import connection, message
from transfer.http.connection import Connection

_MAX_LINE = 65536
_MAX_HEADERS = 200


class _Pieces(io.RawIOBase):
    """A raw stream that hands out ``data`` in the given piece sizes (then the rest), then EOF."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        super().__init__()
        self._data = data
        self._sizes = list(sizes)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def, override]
        if not self._data:
            return 0
        size = min(len(buffer), self._sizes.pop(0) if self._sizes else len(self._data))
        chunk, self._data = self._data[:size], self._data[size:]
        buffer[:len(chunk)] = chunk
        return len(chunk)


def _reader(data: bytes, sizes: list[int]) -> io.BufferedReader:
    return io.BufferedReader(_Pieces(data, sizes), 1 << 18)


def _reference(rfile: io.BufferedReader, method: str) -> tuple:  # type: ignore[type-arg]
    """The line-by-line reader as it was before the one-read parser (commit be5c9bb), but for
    truncated heads (see below)."""
    def read_headers() -> dict:  # type: ignore[type-arg]
        headers: dict = {}  # type: ignore[type-arg]
        for _ in range(_MAX_HEADERS):
            line = rfile.readline(_MAX_LINE)
            # One deliberate change since: a head the stream ends inside is no answer (it read
            # as one with an empty body, and a 0-byte file was written as a success).
            if len(line) < _MAX_LINE and not line.endswith(b"\n"):
                raise TransientError("connection closed inside the response head")
            if line in (b"\r\n", b"\n", b""):
                return headers
            name, _, value = line.decode("latin-1").partition(":")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        raise TransientError("too many response headers")

    while True:
        line = rfile.readline(_MAX_LINE)
        if not line:
            return ("empty",)
        version, _, rest = line.partition(b" ")
        code, _, reason = rest.partition(b" ")
        if not version.startswith(b"HTTP/") or not code.isdigit():
            raise TransientError(f"bad status line {line[:80]!r}")
        status = int(code)
        headers = read_headers()
        if status != 100:
            break
    must_close = version == b"HTTP/1.0" or "close" in headers.get("connection", "").lower()
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length = headers.get("content-length")
    remaining = None
    if not chunked and length is not None:
        try:
            remaining = int(length)
        except ValueError:
            raise TransientError(f"bad Content-Length {length!r}") from None
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        remaining, chunked = 0, False
    elif remaining is None and not chunked:
        must_close = True
    return status, reason.strip().decode("latin-1"), headers, must_close, remaining, chunked


def _ours(rfile: io.BufferedReader, method: str) -> tuple:  # type: ignore[type-arg]
    conn = Connection("127.0.0.1", 1)
    conn._rfile = rfile  # type: ignore[assignment]
    conn._sock = object()  # type: ignore[assignment]
    try:
        response = conn._read_head(method)
    except connection._EmptyStatus:
        return ("empty",)
    return (response.status, response.reason, response.headers, conn.must_close, response._remaining,
            response._chunked)


def _outcome(read, data: bytes, sizes: list[int], method: str) -> tuple:  # type: ignore[no-untyped-def, type-arg]
    rfile = _reader(data, sizes)
    try:
        got = read(rfile, method)
    except TransientError as err:  # the connection is closed: what is left unread does not matter
        return ("error", err.message.split(" (")[0]), None
    return got, rfile.read()


def _same(data: bytes, sizes: list[int] = (), method: str = "GET") -> tuple:  # type: ignore[assignment, type-arg]
    ours = _outcome(_ours, data, list(sizes), method)
    assert ours == _outcome(_reference, data, list(sizes), method), data[:300]
    return ours


MINIO_GET = (b"HTTP/1.1 200 OK\r\nAccept-Ranges: bytes\r\nContent-Length: 3\r\nContent-Type: "
             b"application/octet-stream\r\nETag: \"900150983cd24fb0d6963f7d28e17f72\"\r\nLast-Modified: Thu, 26 "
             b"Nov 2026 05:01:50 GMT\r\nServer: MinIO\r\nVary: Origin\r\nVary: Accept-Encoding\r\n"
             b"X-Amz-Request-Id: 187B\r\nDate: Thu, 26 Nov 2026 05:01:51 GMT\r\n\r\nabc")

ODD = [
    MINIO_GET,
    b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\tmore\r\nX-A: 2\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",  # bare LF throughout
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\n\r\nok",  # one bare LF
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\nok\r\n\r\n",  # a bare LF ends the head early
    b"HTTP/1.1 200 OK\r\nA: b\rc\r\nContent-Length: 1\r\n\r\nx",  # a lone CR stays in the value
    b"HTTP/1.1 200 OK\r\nA: b\r\r\n\r\n",
    b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",  # no reason phrase: a bad status line, as before
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
    b"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 1\r\n\r\nx",
    b"HTTP/1.1 200 OK\r\n\r\nclose-delimited",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n0\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nETag: x\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\nContent-Length: 0\n\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n\xa0Key\x85:\x1c value \xa0\r\nno colon here\r\n: empty name\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 \xb200 OK\r\n\r\n",  # a Latin-1 superscript digit is no status code
    b"\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
    b"NOTHTTP 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Len",  # truncated inside a field
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n",  # truncated before the blank line
    b"HTTP/1.1 2",
    b"",
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nerror",
]


@pytest.mark.parametrize("data", ODD)
@pytest.mark.parametrize("split", ["whole", "bytewise", "halves"])
def test_odd_heads_read_as_before(data, split):
    sizes = {"whole": [], "bytewise": [1] * len(data), "halves": [max(1, len(data) // 2)]}[split]
    for method in ("GET", "HEAD"):
        _same(data, sizes, method)


def test_a_head_in_one_piece_takes_the_one_read_path():
    rfile = _reader(MINIO_GET, [])
    status, fields = message.buffered_head(rfile)
    assert status == b"HTTP/1.1 200 OK\r\n" and fields[0] == "Accept-Ranges: bytes" and len(fields) == 10
    assert rfile.read() == b"abc"
    outcome = _same(MINIO_GET)
    assert outcome[0][2]["vary"] == "Origin, Accept-Encoding" and outcome[1] == b"abc"


@pytest.mark.parametrize("count", [198, 199, 200, 201, 250])
def test_the_field_count_is_bounded_as_before(count):
    data = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: v\r\n" % n for n in range(count)) + b"Content-Length: 0\r\n\r\n"
    got = _same(data)[0]
    assert (got[0] == "error") == (count + 1 >= _MAX_HEADERS)


@pytest.mark.parametrize("length", [_MAX_LINE - 40, _MAX_LINE - 24, _MAX_LINE, _MAX_LINE + 10, 3 * _MAX_LINE])
def test_heads_and_lines_past_the_bound_read_as_before(length):
    """A head past 64 KiB goes line by line (each line still bounded by readline's limit)."""
    data = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * length + b"\r\nContent-Length: 1\r\n\r\nx"
    _same(data)
    _same(data, [len(data) // 3] * 3)
    many = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: %s\r\n" % (n, b"b" * 600) for n in range(150)) + b"\r\n"
    _same(many)


def test_random_heads_in_random_pieces_read_as_before():
    rng = random.Random(24)
    tokens = [b"HTTP/1.1 ", b"HTTP/1.0 ", b"200", b"100", b"204", b" OK", b"\r\n", b"\r\n", b"\r\n", b"\n", b"\r",
              b":", b": ", b" ", b"\t", b"X-A", b"x-a", b"Content-Length: 3", b"Content-Length: x",
              b"Transfer-Encoding: chunked", b"Connection: close", b"\x85", b"\xa0", b"\xb2", b"v", b"\r\n\r\n"]
    for _ in range(4000):
        body = b"".join(rng.choice(tokens) for _ in range(rng.randrange(0, 30)))
        data = (b"HTTP/1.1 200 OK\r\n" if rng.random() < 0.7 else b"") + body + rng.choice([b"", b"\r\n\r\nabc"])
        cuts = [rng.randrange(1, 40) for _ in range(rng.randrange(0, 4))]
        _same(data, cuts, rng.choice(["GET", "HEAD"]))


@pytest.mark.parametrize("data", [MINIO_GET, b"HTTP/1.1 200 OK\r\nA: 1\r\nB:2\r\na: 3\r\nContent-Length: 0\r\n\r\n"])
def test_well_formed_heads_read_as_http_client_reads_them(data):
    head = data[data.index(b"\r\n") + 2:]
    message = http.client.parse_headers(io.BytesIO(head))
    expected: dict = {}  # type: ignore[type-arg]
    for name, value in message.items():
        key = name.lower()
        expected[key] = f"{expected[key]}, {value}" if key in expected else value
    assert _same(data)[0][2] == expected
