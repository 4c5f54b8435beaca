"""Wire details more than one store speaks: HTTP dates, RFC 3986 encoding, XML answers, and
a digest computed while a download streams past.

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

__all__ = ["Node", "StreamCheck", "canonical_query", "digest_check", "http_date_epoch", "parse_xml", "quote_query",
           "uri_encode_path"]

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
