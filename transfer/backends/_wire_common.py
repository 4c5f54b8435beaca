"""Wire details more than one store speaks: HTTP dates, RFC 3986 encoding, XML answers,
``multipart/mixed`` batch answers, and a digest computed while a download streams past.

Below every backend's own wire modules (S3's, Azure's), so none of them reaches into
another's private names. Pure functions over strings and bytes; nothing here sends a request,
and nothing is imported that a job step would not need (no ``re``, ``urllib.parse`` or
``xml.etree``: each costs milliseconds of every job's start-up).
"""

from __future__ import annotations

import binascii
import time

from transfer.errors import TransientError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Optional, Tuple

    from transfer._digests import Hash
    from transfer.backends._s3_xml import Node

__all__ = ["Node", "StreamCheck", "batch_answers", "canonical_query", "digest_check", "http_date_epoch", "parse_xml", "quote_query",
           "uri_encode_path"]
DEFERRED = ("transfer.backends._s3_xml",)  # imported inside parse_xml (as transfer.backends.s3's DEFERRED)

_UNRESERVED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~"


def _quoting(safe: str) -> Tuple["frozenset[str]", Tuple[str, ...]]:
    """(characters kept, the encoding of every byte): ``urllib.parse.quote`` with ``safe``,
    without importing it (it imports ``re`` and ``ipaddress``, ~10 ms per job step)."""
    keep = frozenset(_UNRESERVED + safe)
    return keep, tuple(chr(b) if chr(b) in keep else "%%%02X" % b for b in range(256))


_PATH_KEEP, _PATH_BYTES = _quoting("/")
_QUERY_KEEP, _QUERY_BYTES = _quoting("")


def _quote(text: str, keep: "frozenset[str]", table: Tuple[str, ...]) -> str:
    if keep.issuperset(text):
        return text
    return "".join([table[b] for b in text.encode("utf-8")])


def uri_encode_path(path: str) -> str:
    """RFC 3986 encoding of a request path, keeping ``/`` (neither S3 nor Azure double-encodes)."""
    return _quote(path, _PATH_KEEP, _PATH_BYTES)


def quote_query(text: str) -> str:
    """RFC 3986 encoding of one query name or value (every reserved character escaped)."""
    return _quote(text, _QUERY_KEEP, _QUERY_BYTES)


def canonical_query(params: Dict[str, str]) -> str:
    """``name=value&...`` sorted by name, each encoded by :func:`quote_query` (SigV4's canonical
    query, and what Shared Key signs as the request's query)."""
    return "&".join(f"{quote_query(k)}={quote_query(v)}" for k, v in sorted(params.items()))


def http_date_epoch(text: Optional[str]) -> Optional[float]:
    """Epoch seconds of an HTTP date (``Wed, 25 Nov 2026 23:00:00 GMT``); None when absent or malformed."""
    if not text:
        return None
    import calendar  # stat() only; strptime imports re and datetime too
    try:
        return float(calendar.timegm(time.strptime(text.strip(), "%a, %d %b %Y %H:%M:%S GMT")))
    except ValueError:
        return None


def parse_xml(data: bytes, store: str) -> Node:
    """The document element of an XML answer from ``store`` (named in the error;
    :mod:`transfer.backends._s3_xml`: names without their namespace); TransientError when it
    is malformed."""
    from transfer.backends._s3_xml import XmlError, parse  # listings and error bodies only
    try:
        return parse(data)
    except XmlError as err:
        raise TransientError(f"malformed XML from {store}: {err}") from None


class StreamCheck:
    """A running checksum of a download and the value it must end at."""

    def __init__(self, name: str, expected: str, update: Callable[[bytes], None], final: Callable[[], str]):
        self.name = name
        self.expected = expected
        self.update = update
        self._final = final

    def matches(self) -> bool:
        return self._final() == self.expected


def digest_check(name: str, digest: Hash, expected: str, *, base64_digest: bool) -> StreamCheck:
    """The check that ``digest`` (named ``name``), fed every byte, ends at ``expected``: its
    base64 (``base64_digest``, as S3's checksum headers give it) or hex (an MD5 ETag, or the hex
    of Azure's ``Content-MD5``)."""
    def final() -> str:
        return binascii.b2a_base64(digest.digest(), newline=False).decode() if base64_digest else digest.hexdigest()
    return StreamCheck(name, expected, digest.update, final)


def batch_answers(content_type: str, body: bytes) -> Dict[str, Tuple[int, Dict[str, str], bytes]]:
    """The answers of a ``multipart/mixed`` batch response (GCS's JSON API batches, Azure's Blob
    Batch): {``Content-ID`` as the server wrote it: (HTTP status, the answer's headers with
    lower-case names, its body)}, for every part that has a Content-ID and a status line. Parts
    are matched by that ID, never by position (a server may answer in any order)."""
    boundary = _boundary(content_type)
    answers: Dict[str, Tuple[int, Dict[str, str], bytes]] = {}
    if not boundary:
        return answers
    for part in body.split(b"--" + boundary):
        outer, inner = _head_and_body(part.strip(b"\r\n"))
        content_id = _header_fields(outer).get("content-id")
        if inner is None or content_id is None:
            continue
        head, rest = _head_and_body(inner)
        status_line, _, headers = head.partition(b"\n")
        fields = status_line.split()
        if len(fields) < 2 or not fields[1].isdigit():
            continue
        answers[content_id] = (int(fields[1]), _header_fields(headers), (rest or b"").strip(b"\r\n"))
    return answers


def _boundary(content_type: str) -> bytes:
    """The ``boundary`` parameter of a Content-Type, quotes dropped (b"" when none)."""
    for parameter in content_type.split(";")[1:]:
        name, _, value = parameter.strip().partition("=")
        if name.strip().lower() == "boundary":
            return value.strip().strip('"').encode("latin-1")
    return b""


def _head_and_body(data: bytes) -> Tuple[bytes, Optional[bytes]]:
    """(head, body) split at the first blank line (CRLF or LF endings); body None without one."""
    ends = [(at, len(mark)) for mark in (b"\r\n\r\n", b"\n\n") for at in [data.find(mark)] if at >= 0]
    if not ends:
        return data, None
    at, width = min(ends)
    return data[:at], data[at + width:]


def _header_fields(head: bytes) -> Dict[str, str]:
    fields: Dict[str, str] = {}
    for line in head.decode("latin-1").splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip():
            fields[name.strip().lower()] = value.strip()
    return fields
