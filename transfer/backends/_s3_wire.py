"""S3 wire details shared by the backend: addressing, names, XML and error translation.

Pure functions over strings and bytes; nothing here sends a request.
"""

from __future__ import annotations

import calendar
import hashlib
import re
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Dict, Optional, Sequence
from urllib.parse import urlsplit

from transfer.backends.base import ByteRange, ObjectInfo
from transfer.errors import (
    ConfigError,
    AuthError,
    InvalidInput,
    NotFound,
    RemoteError,
    Throttled,
    TransferError,
    TransientError,
)
from transfer.urls import Url

_MD5_ETAG = re.compile(r'^"?([0-9a-fA-F]{32})"?$')
_THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                   "TooManyRequests"}
_TRANSIENT_CODES = {"RequestTimeout", "InternalError", "ServiceUnavailable", "XMinioServerNotInitialized"}


@dataclass(frozen=True)
class S3Path:
    bucket: str
    key: str


def split_url(url: Url) -> S3Path:
    """Bucket and key of a Pegasus-style or AWS-style S3 URL."""
    path = url.path[1:] if url.path.startswith("/") else url.path
    if "@" in url.host:
        bucket, _, key = path.partition("/")
    else:
        bucket, key = url.host, path
    check_bucket(bucket, str(url))
    if len(key) > _MAX_KEY // 4 and len(key.encode("utf-8", "surrogatepass")) > _MAX_KEY:
        raise InvalidInput(f"S3 key is {len(key.encode('utf-8', 'surrogatepass'))} bytes in UTF-8; "
                           f"S3 allows {_MAX_KEY}", url=str(url), operation="parse")
    return S3Path(bucket, key)


_MAX_KEY = 1024
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,61}[A-Za-z0-9]")
_IP_LIKE = re.compile(r"\d+\.\d+\.\d+\.\d+")
_DNS_BUCKET = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")


def check_bucket(bucket: str, url: str) -> None:
    """Raise InvalidInput naming ``url`` unless ``bucket`` is a name S3 could hold (3-63 letters,
    digits, '.', '-', '_', starting and ending alphanumeric, no '..', not an IP address).
    Upper case and '_' are allowed for buckets created under the old us-east-1 rules."""
    if not bucket:
        raise InvalidInput("S3 URL has no bucket", url=url, operation="parse")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket or _IP_LIKE.fullmatch(bucket):
        raise InvalidInput(f"invalid S3 bucket name {bucket[:70]!r}: use 3-63 letters, digits, '.' or '-', "
                           "starting and ending with a letter or digit", url=url, operation="parse")


_REGION = re.compile(r"[a-z]{2}(-[a-z0-9]+){1,4}|[a-z0-9-]{1,32}")
_HOST = re.compile(r"[a-z0-9.-]+|[0-9a-f:.]+")  # urlsplit's hostname: lower case, IPv6 unbracketed


def check_endpoint(endpoint: str, region: str, where: str) -> None:
    """ConfigError naming ``where`` unless ``endpoint`` is ``http(s)://HOST[:PORT]`` (nothing
    after it: a path would be silently dropped) and ``region`` looks like one."""
    parts = urlsplit(endpoint)
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not _HOST.fullmatch(parts.hostname or "") or not port_ok \
            or parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
        raise ConfigError(f"endpoint {endpoint[:100]!r} is not http(s)://HOST[:PORT]", url=where or endpoint,
                          operation="connect")
    if not _REGION.fullmatch(region):
        raise ConfigError(f"region {region[:40]!r} is not an S3 region name (like us-west-2)", url=where or endpoint,
                          operation="connect")


def virtual_hosted(endpoint_host: str, bucket: str) -> bool:
    """Whether a request for ``bucket`` names it in the Host (botocore's "auto" addressing):
    only on Amazon endpoints, only for DNS-compatible names without dots (a dotted name would
    not match the ``*.s3.REGION.amazonaws.com`` certificate; botocore keeps them path-style
    over http too)."""
    return endpoint_host.endswith(".amazonaws.com") and _DNS_BUCKET.fullmatch(bucket) is not None


def default_endpoint(region: str, scheme: str = "https") -> str:
    """Amazon's endpoint for ``region`` as botocore picks it (us-east-1 keeps the global name)."""
    return f"{scheme}://s3.amazonaws.com" if region == "us-east-1" else f"{scheme}://s3.{region}.amazonaws.com"


def _info(url: Url, status: int, headers: Dict[str, str]) -> ObjectInfo:
    size_text = headers.get("content-length", "0")
    if status == 206 and "content-range" in headers:
        size_text = headers["content-range"].rpartition("/")[2]
    size = int(size_text) if size_text.isdigit() else 0
    return ObjectInfo(url, size, headers.get("etag", "").strip('"') or None)


def http_date_epoch(text: Optional[str]) -> Optional[float]:
    """Epoch seconds of an HTTP date (``Wed, 25 Nov 2026 23:00:00 GMT``); None when absent or malformed."""
    if not text:
        return None
    try:
        return float(calendar.timegm(time.strptime(text.strip(), "%a, %d %b %Y %H:%M:%S GMT")))
    except ValueError:
        return None


def _range_length(headers: Dict[str, str], byte_range: ByteRange) -> int:
    """Bytes a 206 answer must carry: the request's span, cut at the object's end."""
    span = headers.get("content-range", "")  # "bytes START-END/TOTAL"
    try:
        first, last = span.split(" ", 1)[1].split("/", 1)[0].split("-", 1)
        return int(last) - int(first) + 1
    except (IndexError, ValueError):
        return byte_range[1] - byte_range[0]


def _server_side_encrypted(headers: Dict[str, str]) -> bool:
    return headers.get("x-amz-server-side-encryption", "AES256") not in ("AES256", "")


def _child_url(url: Url, bucket: str, key: str) -> Url:
    if "@" in url.host:
        return url.with_path(f"/{bucket}/{key}")
    return url.with_path(f"/{key}")


def xml_tree(data: bytes) -> ET.Element:
    try:
        root = ET.fromstring(data)
    except ET.ParseError as err:
        raise TransientError(f"malformed XML from S3: {err}") from None
    for element in root.iter():
        if "}" in element.tag:
            element.tag = element.tag.split("}", 1)[1]
    return root


def s3_error(status: int, body: bytes, url: str, operation: str, *, code: Optional[str] = None,
              message: Optional[str] = None) -> TransferError:
    """Translate an S3 error response into the library's exception tree."""
    if code is None and body:
        try:
            root = xml_tree(body)
            code, message = root.findtext("Code"), root.findtext("Message")
        except TransientError:
            pass
    code = code or ""
    text = f"HTTP {status}" + (f" {code}" if code else "") + (f": {message}" if message else "")
    kwargs = {"url": url, "operation": operation, "status": status}
    if status == 429 or code in _THROTTLE_CODES:
        return Throttled(text, **kwargs)  # type: ignore[arg-type]
    if status >= 500 or code in _TRANSIENT_CODES:
        return TransientError(text, **kwargs)  # type: ignore[arg-type]
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket"):
        return NotFound(text, **kwargs)  # type: ignore[arg-type]
    if status in (401, 403):
        return AuthError(text, **kwargs)  # type: ignore[arg-type]
    return RemoteError(text, **kwargs)  # type: ignore[arg-type]



def xml_escape(text: str) -> str:
    """``&``, ``<`` and ``>`` escaped for XML character data (xml.sax.saxutils would import
    urllib.request, 15 ms of start-up)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def iso8601_epoch(text: Optional[str]) -> Optional[float]:
    """Epoch seconds of an ISO 8601 UTC time such as ``2026-11-24T19:00:00Z`` (fractions
    ignored); None when absent or malformed."""
    if not text:
        return None
    try:
        return float(calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def multipart_etag(part_etags: Sequence[str]) -> Optional[str]:
    """The ETag S3 gives an object assembled from parts with these (MD5) ETags: the MD5 of the
    parts' binary MD5s, then ``-N``. None if a part's ETag is not an MD5."""
    digests = []
    for etag in part_etags:
        found = _MD5_ETAG.match(etag)
        if not found:
            return None
        digests.append(bytes.fromhex(found.group(1)))
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"
