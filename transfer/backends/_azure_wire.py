"""Azure Blob Storage names, answers and errors, without I/O.

``az://ACCOUNT/CONTAINER/BLOB``: ``Url.host`` is the account, the path's first segment the
container and the rest the blob name, taken literally (as ``s3://`` keys are; not
percent-decoded). A signed query on the URL (one with ``sig=``) is a SAS token for that URL;
any other ``?`` belongs to the blob name.

Errors: the service's code is in ``x-ms-error-code`` (every answer, HEAD included) and in the
XML body. ``ServerBusy`` (503) and 429 are :class:`~transfer.errors.Throttled`, as every 503
is; ``OperationTimedOut`` (500) and other 5xx are transient; 404 (``BlobNotFound``,
``ContainerNotFound``) is NotFound; 401/403 an AuthError naming the account.
"""

from __future__ import annotations

import binascii
import secrets
import time

from transfer import _digests
from transfer.backends._wire_common import StreamCheck, digest_check, http_date_epoch, parse_xml
from transfer.backends.base import Attributes, ObjectInfo
from transfer.lean import record
from transfer.errors import (
    THROTTLE_CODES, AuthError, InvalidInput, NotFound, RemoteError, Throttled, TransferError, TransientError,
)
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple

    from transfer.backends._wire_common import Node

_NOT_FOUND = frozenset({"BlobNotFound", "ContainerNotFound", "ResourceNotFound"})
_CONTAINER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@record(frozen=True)
class AzurePath:
    """One blob (or a container, ``blob`` empty) and the SAS its URL carries ("" when none)."""

    container: str
    blob: str
    sas: str = ""


def split_url(url: Url, need_blob: bool = False) -> AzurePath:
    """The container, blob and SAS of ``az://ACCOUNT/CONTAINER/BLOB[?SAS]``; InvalidInput naming
    the URL (its SAS hidden) for a malformed one."""
    path, _, sas = url.path.partition("?")
    if sas and not is_sas(sas):  # a blob name may hold "?": only a signed query is a SAS
        path, sas = url.path, ""
    container, _, blob = path[1:].partition("/") if path.startswith("/") else ("", "", "")
    if not container:
        raise InvalidInput("expected az://ACCOUNT/CONTAINER/BLOB", url=str(url), operation="parse")
    check_container(container, str(url))
    if need_blob and not blob:
        raise InvalidInput("az:// URL names no blob", url=str(url), operation="parse")
    return AzurePath(container, blob, sas)


def is_sas(query: str) -> bool:
    """Whether ``query`` (without ``?``) is a shared access signature: it carries ``sig=``."""
    return any(field.startswith("sig=") for field in query.split("&"))


def check_container(name: str, url: str) -> None:
    """InvalidInput unless ``name`` is a container name (3-63 of a-z, 0-9 and single inner
    ``-``; ``$root`` and ``$web`` are the service's own)."""
    if name in ("$root", "$web", "$logs"):
        return
    if not 3 <= len(name) <= 63 or not _CONTAINER_CHARS.issuperset(name) or name[0] == "-" \
            or name[-1] == "-" or "--" in name:
        raise InvalidInput(f"{name!r} is no container name (3 to 63 lower-case letters, digits and single "
                           "hyphens)", url=url, operation="parse")


def child_url(url: Url, container: str, blob: str, sas: str) -> Url:
    """The URL of ``blob`` in ``container`` as a listing of ``url`` names it (its SAS kept)."""
    return url.with_path(f"/{container}/{blob}" + (f"?{sas}" if sas else ""))


def http_date(now: Optional[float] = None) -> str:
    """RFC 1123 date in GMT for ``x-ms-date`` (not ``time.strftime``: its names follow the locale)."""
    t = time.gmtime(now)
    return (f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")


def etag(headers: Dict[str, str]) -> Optional[str]:
    return headers.get("etag", "").strip('"') or None


def md5_hex(headers: Dict[str, str], name: str = "content-md5") -> Optional[str]:
    """The MD5 a ``Content-MD5``-style header carries (base64), in hex; None when absent or not one."""
    value = headers.get(name)
    if not value:
        return None
    try:
        digest = binascii.a2b_base64(value)
    except binascii.Error:
        return None
    return digest.hex() if len(digest) == 16 else None


def content_md5_check(headers: Dict[str, str], size: Optional[int]) -> Optional[StreamCheck]:
    """The check of a whole blob's ``size`` bytes against the ``Content-MD5`` an answer carries
    (the blob's stored MD5); None when it carries none (the byte count is then all)."""
    md5 = md5_hex(headers)
    return None if md5 is None else digest_check("md5", _digests.new("md5", size), md5, base64_digest=False)


def blob_info(url: Url, headers: Dict[str, str]) -> ObjectInfo:
    """What a Get Blob Properties answer says of the blob."""
    metadata = tuple(sorted((name[len("x-ms-meta-"):], value) for name, value in headers.items()
                            if name.startswith("x-ms-meta-")))
    md5 = headers.get("content-md5")
    attributes = Attributes(headers.get("content-type"), headers.get("cache-control"), metadata,
                            f"md5:{md5}" if md5 else None)
    return ObjectInfo(url, _length(headers, url), etag(headers), http_date_epoch(headers.get("last-modified")),
                      attributes)


def _length(headers: Dict[str, str], url: Url) -> int:
    text = headers.get("content-length", "")
    if not text.isdigit():
        raise TransientError(f"answer without a Content-Length ({text or 'none'})", url=str(url), operation="stat")
    return int(text)


def span(headers: Dict[str, str], url: str) -> Tuple[int, int]:
    """(length, blob size) of a 206 answer, from ``Content-Range: bytes FIRST-LAST/SIZE``."""
    found, _, total = headers.get("content-range", "").partition("/")
    first, _, last = found.rpartition(" ")[2].partition("-")
    if not (first.isdigit() and last.isdigit() and total.isdigit()):
        raise TransientError(f"ranged answer without a usable Content-Range ({headers.get('content-range')})",
                             url=url, operation="get")
    return int(last) - int(first) + 1, int(total)


def parse_listing(data: bytes) -> Tuple[List[Tuple[str, int, Optional[str], Optional[float]]], List[str], str]:
    """A List Blobs page: ([(name, size, etag, mtime)], [sub-prefixes], next marker or "")."""
    root = parse_xml(data, "Azure")
    blobs: List[Tuple[str, int, Optional[str], Optional[float]]] = []
    prefixes: List[str] = []
    for node in root.iter():
        if node.tag == "Blob":
            props = _child(node, "Properties")
            size = (props.findtext("Content-Length") if props else None) or "0"
            blobs.append((node.findtext("Name") or "", int(size) if size.isdigit() else 0,
                          (props.findtext("Etag") or "").strip('"') or None if props else None,
                          http_date_epoch(props.findtext("Last-Modified")) if props else None))
        elif node.tag == "BlobPrefix":
            prefixes.append(node.findtext("Name") or "")
    return blobs, prefixes, root.findtext("NextMarker") or ""


def _child(node: Node, tag: str) -> Optional[Node]:
    return next((child for child in node.children if child.tag == tag), None)


BATCH_MAX = 256  # sub-requests per Blob Batch request (the service's limit)


def batch_body(requests: Sequence[Tuple[str, str, Sequence[Tuple[str, str]]]]) -> Tuple[str, bytes]:
    """(Content-Type, body) of a Blob Batch holding ``requests`` = [(method, target as sent,
    headers as sent)], each signed on its own; part ``i`` has ``Content-ID: i``."""
    if not 0 < len(requests) <= BATCH_MAX:
        raise ValueError(f"a blob batch holds 1 to {BATCH_MAX} sub-requests, not {len(requests)}")
    boundary = f"batch_{secrets.token_hex(16)}"
    parts: List[str] = []
    for index, (method, target, headers) in enumerate(requests):
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
        parts.append(f"--{boundary}\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n"
                     f"Content-ID: {index}\r\n\r\n{method} {target} HTTP/1.1\r\n{lines}\r\n")
    parts.append(f"--{boundary}--\r\n")
    return f"multipart/mixed; boundary={boundary}", "".join(parts).encode()


def block_id(upload_id: str, number: int) -> str:
    """Base64 block id of part ``number`` of upload ``upload_id``: every id of a blob has one
    length, as the service requires."""
    return binascii.b2a_base64(f"{upload_id}-{number:06d}".encode(), newline=False).decode()


def error_code(headers: Dict[str, str], body: bytes) -> Tuple[str, str]:
    """(code, first line of the message) of an error answer."""
    code, message = headers.get("x-ms-error-code", ""), ""
    if body:
        try:
            root = parse_xml(body, "Azure")
            code = code or root.findtext("Code") or ""
            message = (root.findtext("Message") or "").strip().splitlines()[0] if root.findtext("Message") else ""
        except TransientError:
            pass
    return code, message[:200]


def azure_error(status: int, headers: Dict[str, str], body: bytes, url: str, operation: str, account: str,
                where: str, retry_after: Optional[float] = None) -> TransferError:
    """The library's error for an error answer (see the module docstring)."""
    code, message = error_code(headers, body)
    text = f"HTTP {status}" + (f" {code}" if code else "") + (f": {message}" if message else "")
    if status in (429, 503) or code in THROTTLE_CODES:
        return Throttled(text, retry_after=retry_after, url=url, operation=operation, status=status)
    if status >= 500 or code == "OperationTimedOut":
        return TransientError(text, url=url, operation=operation, status=status)
    if status == 404 or code in _NOT_FOUND:
        return NotFound(text, url=url, operation=operation, status=status)
    if status in (401, 403):
        return AuthError(f"{text} (storage account {account} refused the request; credentials from {where})",
                         url=url, operation=operation, status=status)
    return RemoteError(text, url=url, operation=operation, status=status)
