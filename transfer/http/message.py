"""The HTTP/1.1 message format (RFC 9112) as the client writes and reads it: request heads
that cannot split a line, status lines, and response header fields (lower-case names,
repeated ones joined), whole from one buffer or line by line. No I/O of its own: callers
hand it bytes, lines or a buffered reader."""

from __future__ import annotations

from transfer.errors import InvalidInput, TransientError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Dict, Iterable, List, Optional, Tuple

    HeaderList = Iterable[Tuple[str, str]]

MAX_LINE = 65536
_MAX_HEADERS = 200


def host_header(host: str, port: int, tls: bool) -> str:
    """The ``Host`` value for ``host:port``: IPv6 in brackets, the port only when not the scheme's."""
    name = f"[{host}]" if ":" in host else host
    return name if port == (443 if tls else 80) else f"{name}:{port}"


def request_head(method: str, target: str, headers: HeaderList, length: Optional[int], default_host: str,
                 endpoint: str) -> bytes:
    """The request head with exactly one ``Host`` (the caller's, if given: virtual-hosted S3
    names the bucket there; else ``default_host``) and ``Content-Length: length`` unless
    ``length`` is None, refusing (InvalidInput naming ``endpoint``) anything that would split a
    line."""
    lines = [f"{method} {target} HTTP/1.1", ""]
    host = ""
    for name, value in headers:
        if len(name) == 4 and name.lower() == "host":
            if host:
                raise InvalidInput("more than one Host header; request not sent", url=endpoint, operation=method)
            host = value
            continue
        lines.append(f"{name}: {value}")
    lines[1] = f"Host: {host or default_host}"
    if length is not None:
        lines.append(f"Content-Length: {length}")
    text = "\r\n".join(lines)
    breaks = len(lines) - 1
    if text.count("\n") != breaks or text.count("\r") != breaks or "\0" in text \
            or " " in target or " " in method:
        raise InvalidInput(_unsafe_field(method, target, lines), url=endpoint, operation=method)
    try:
        return (text + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError:
        raise InvalidInput(_unsafe_field(method, target, lines, "a non-Latin-1 character"),
                           url=endpoint, operation=method) from None


def status_line(line: bytes, endpoint: str) -> Tuple[bytes, int, bytes]:
    """(version, status, reason) of a status line (with its line end); TransientError naming
    ``endpoint`` when it is not one."""
    version, _, rest = line.partition(b" ")
    code, _, reason = rest.partition(b" ")
    if not version.startswith(b"HTTP/") or not code.isdigit():
        raise TransientError(f"bad status line {line[:80]!r}", url=endpoint)
    return version, int(code), reason


def header_lines(lines: List[str], endpoint: str) -> Dict[str, str]:
    """Response headers (lower-case names; repeated ones joined by ``, ``) of lines already
    split, each without its CRLF; TransientError naming ``endpoint`` past ``_MAX_HEADERS``."""
    if len(lines) >= _MAX_HEADERS:
        raise TransientError("too many response headers", url=endpoint)
    headers: Dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return headers


def _unsafe_field(method: str, target: str, lines: List[str], what: str = "CR, LF or NUL") -> str:
    """A one-line message naming (never quoting: values may be secrets) the first bad field."""
    for line in lines[1:]:
        if any(c in line for c in "\r\n\0") if what.startswith("CR") else any(ord(c) > 255 for c in line):
            return f"header {line.partition(':')[0][:60]!r} contains {what}; request not sent"
    return f"request line {f'{method} {target}'[:80]!r} contains {what} or a space; request not sent"


def buffered_head(rfile: BinaryIO) -> Optional[Tuple[bytes, List[str]]]:
    """(status line with its CRLF, header lines without theirs) of a response head that is
    whole in the reader's buffer (one receive: the usual case), consumed from it; None, with
    nothing consumed, when the head is not all there yet or ends a line with a bare LF (the
    line-by-line path reads those exactly as it always has). Only heads of at most
    ``MAX_LINE`` bytes qualify, so no line here is longer than ``readline`` would return."""
    data = rfile.peek(MAX_LINE)  # type: ignore[attr-defined]  # at most one receive, and only when empty
    end = data.find(b"\r\n\r\n", 0, MAX_LINE)
    if end < 0:
        return None
    size = end + 4
    if data.count(b"\n", 0, size) != data.count(b"\r\n", 0, size):  # a bare LF ends a line too
        return None
    head = rfile.read(size)
    first = head.find(b"\n") + 1
    return head[:first], head[first:end + 2].decode("latin-1").split("\r\n")[:-1]


def read_headers(rfile: BinaryIO, endpoint: str) -> Dict[str, str]:
    """The header fields of a response head read line by line from ``rfile`` up to its blank
    line; TransientError naming ``endpoint`` if the stream ends first or past ``_MAX_HEADERS``."""
    headers: Dict[str, str] = {}
    for _ in range(_MAX_HEADERS):
        line = rfile.readline(MAX_LINE)
        if len(line) < MAX_LINE and not line.endswith(b"\n"):  # the stream ended before the blank line
            raise TransientError("connection closed inside the response head", url=endpoint)
        if line in (b"\r\n", b"\n"):
            return headers
        name, _, value = line.decode("latin-1").partition(":")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    raise TransientError("too many response headers", url=endpoint)


def basic_credentials(user: str, password: str) -> str:
    """``Basic`` and base64 of ``user:password`` in UTF-8: an ``Authorization`` or
    ``Proxy-Authorization`` value."""
    from binascii import b2a_base64
    return "Basic " + b2a_base64(f"{user}:{password}".encode("utf-8"), newline=False).decode("ascii")
