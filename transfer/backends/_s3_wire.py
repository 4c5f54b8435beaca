"""S3 wire details shared by the backend: addressing, names, XML and error translation.

Pure functions over strings and bytes; nothing here sends a request.
"""

from __future__ import annotations


from transfer import _digests
from transfer.lean import record

from transfer.backends._wire_common import parse_xml
from transfer.backends.base import ByteRange, ObjectInfo
from transfer.errors import (
    ConfigError,
    AuthError,
    InvalidInput,
    NotFound,
    RemoteError,
    THROTTLE_CODES,
    Throttled,
    TransferError,
    TransientError,
)
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from transfer.backends._s3_xml import Node
    from typing import Dict, List, Optional, Sequence, Tuple

_HEX = frozenset("0123456789abcdefABCDEF")
_LOWER_DIGITS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_ALNUM = _LOWER_DIGITS | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_THROTTLE_CODES = THROTTLE_CODES
_TRANSIENT_CODES = {"RequestTimeout", "InternalError", "ServiceUnavailable", "XMinioServerNotInitialized"}


@record(frozen=True)
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
    if bucket not in _GOOD_BUCKETS:
        check_bucket(bucket, str(url))
        if len(_GOOD_BUCKETS) < 256:
            _GOOD_BUCKETS.add(bucket)
    if len(key) > _MAX_KEY // 4 and len(key.encode("utf-8", "surrogatepass")) > _MAX_KEY:
        raise InvalidInput(f"S3 key is {len(key.encode('utf-8', 'surrogatepass'))} bytes in UTF-8; "
                           f"S3 allows {_MAX_KEY}", url=str(url), operation="parse")
    return S3Path(bucket, key)


_MAX_KEY = 1024
_GOOD_BUCKETS: "set[str]" = set()  # names check_bucket passed: a pure memo (a batch reads few buckets)
# The name rules below are regular expressions written out by hand (``re`` costs every job
# step ~5 ms): bucket [A-Za-z0-9][A-Za-z0-9._-]{1,61}[A-Za-z0-9], not \d+\.\d+\.\d+\.\d+;
# DNS-style bucket [a-z0-9][a-z0-9-]{1,61}[a-z0-9]; region [a-z]{2}(-[a-z0-9]+){1,4}|[a-z0-9-]{1,32};
# host (urlsplit's hostname) [a-z0-9.-]+|[0-9a-f:.]+.


def md5_of_etag(etag: str) -> Optional[str]:
    """The MD5 hex digits of an ETag that is one (``^"?([0-9a-fA-F]{32})"?$``), else None."""
    text = etag[1:] if etag.startswith('"') else etag
    text = text[:-1] if text.endswith('"') else text
    return text if len(text) == 32 and _HEX.issuperset(text) else None


def _name_like(name: str, inner: "frozenset[str]", ends: "frozenset[str]") -> bool:
    return 3 <= len(name) <= 63 and name[0] in ends and name[-1] in ends and inner.issuperset(name)


_BUCKET_CHARS = _ALNUM | frozenset("._-")
_DNS_CHARS = _LOWER_DIGITS | frozenset("-")


def check_bucket(bucket: str, url: str) -> None:
    """Raise InvalidInput naming ``url`` unless ``bucket`` is a name S3 could hold (3-63 letters,
    digits, '.', '-', '_', starting and ending alphanumeric, no '..', not an IP address).
    Upper case and '_' are allowed for buckets created under the old us-east-1 rules."""
    if not bucket:
        raise InvalidInput("S3 URL has no bucket", url=url, operation="parse")
    parts = bucket.split(".")
    ip_like = len(parts) == 4 and all(p.isdigit() for p in parts)
    if not _name_like(bucket, _BUCKET_CHARS, _ALNUM) or ".." in bucket or ip_like:
        raise InvalidInput(f"invalid S3 bucket name {bucket[:70]!r}: use 3-63 letters, digits, '.' or '-', "
                           "starting and ending with a letter or digit", url=url, operation="parse")


def _region_like(region: str) -> bool:
    if not region or not all(c in _DNS_CHARS for c in region):
        return False
    if len(region) <= 32:
        return True
    words = region[2:].split("-")
    return region[:2].isalpha() and words[0] == "" and 2 <= len(words) <= 5 and all(words[1:])


def _host_like(host: str) -> bool:
    return bool(host) and (all(c in _LOWER_DIGITS or c in ".-" for c in host) or all(c in _HEX or c in ":." for c in host))


def endpoint_parts(endpoint: str) -> "Optional[Tuple[str, str, Optional[int]]]":
    """(scheme, host, port or None) of ``http(s)://HOST[:PORT][/]`` as ``urlsplit`` reads them
    (scheme and host lower case, IPv6 without brackets); None for anything else, a path, query,
    fragment, user part or bad port included."""
    scheme, sep, rest = endpoint.partition("://")
    scheme = scheme.lower()
    rest, _, fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    rest = rest[:-1] if rest.endswith("/") else rest
    if not sep or scheme not in ("http", "https") or fragment or query or any(c in rest for c in "/@"):
        return None
    if "[" in rest or "]" in rest:
        return _bracketed_endpoint_parts(endpoint)
    host, _, port_text = rest.partition(":")
    if port_text and not (port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536):
        return None
    host = host.lower()
    return (scheme, host, int(port_text) if port_text else None) if _host_like(host) else None


def _bracketed_endpoint_parts(endpoint: str) -> "Optional[Tuple[str, str, Optional[int]]]":
    """:func:`endpoint_parts` of an IPv6 endpoint, by ``urlsplit`` and its address checks."""
    from urllib.parse import urlsplit
    try:
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname or ""
    if (port is not None and not 0 < port < 65536) or parts.path not in ("", "/") or parts.query \
            or parts.fragment or "@" in parts.netloc or not _host_like(host):
        return None
    return parts.scheme, host, port


def check_endpoint(endpoint: str, region: str, where: str) -> None:
    """ConfigError naming ``where`` unless ``endpoint`` is ``http(s)://HOST[:PORT]`` (nothing
    after it: a path would be silently dropped) and ``region`` looks like one."""
    if endpoint_parts(endpoint) is None:
        raise ConfigError(f"endpoint {endpoint[:100]!r} is not http(s)://HOST[:PORT]", url=where or endpoint,
                          operation="connect")
    if not _region_like(region):
        raise ConfigError(f"region {region[:40]!r} is not an S3 region name (like us-west-2)", url=where or endpoint,
                          operation="connect")


def virtual_hosted(endpoint_host: str, bucket: str) -> bool:
    """Whether a request for ``bucket`` names it in the Host (botocore's "auto" addressing):
    only on Amazon endpoints, only for DNS-compatible names without dots (a dotted name would
    not match the ``*.s3.REGION.amazonaws.com`` certificate; botocore keeps them path-style
    over http too)."""
    return endpoint_host.endswith(".amazonaws.com") and _name_like(bucket, _DNS_CHARS, _LOWER_DIGITS)


def default_endpoint(region: str, scheme: str = "https") -> str:
    """Amazon's endpoint for ``region`` as botocore picks it (us-east-1 keeps the global name)."""
    return f"{scheme}://s3.amazonaws.com" if region == "us-east-1" else f"{scheme}://s3.{region}.amazonaws.com"


def _info(url: Url, status: int, headers: Dict[str, str]) -> ObjectInfo:
    size_text = headers.get("content-length", "0")
    if status == 206 and "content-range" in headers:
        size_text = headers["content-range"].rpartition("/")[2]
    size = int(size_text) if size_text.isdigit() else 0
    return ObjectInfo(url, size, headers.get("etag", "").strip('"') or None)


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


def etag_md5(info: ObjectInfo, headers: Dict[str, str]) -> Optional[str]:
    """The object's MD5 if its ETag is one (single part, not encrypted with a KMS key)."""
    found = md5_of_etag(info.version or "")
    return found if found and not _server_side_encrypted(headers) else None


def _child_url(url: Url, bucket: str, key: str) -> Url:
    if "@" in url.host:
        return url.with_path(f"/{bucket}/{key}")
    return url.with_path(f"/{key}")


def xml_tree(data: bytes) -> Node:
    """The document element of an S3 XML answer (:mod:`transfer.backends._s3_xml`: names
    without their namespace); TransientError when it is malformed."""
    return parse_xml(data, "S3")


def s3_error(status: int, body: bytes, url: str, operation: str, *, code: Optional[str] = None,
              message: Optional[str] = None, retry_after: Optional[float] = None) -> TransferError:
    """Translate an S3 error response into the library's exception tree (``retry_after``: the
    answer's ``Retry-After`` in seconds, kept on a :class:`Throttled`). A 503 that names no
    code is a :class:`Throttled`: the answer to a HEAD has no body, so S3's ``503 SlowDown``
    cannot say its name there, and a store that throttles a pool answers its HEADs so too
    (a server-side copy's closing HEAD failed after 3 tries behind such a store)."""
    if code is None and body:
        try:
            root = xml_tree(body)
            code, message = root.findtext("Code"), root.findtext("Message")
        except TransientError:
            pass
    code = code or ""
    text = f"HTTP {status}" + (f" {code}" if code else "") + (f": {message}" if message else "")
    kwargs = {"url": url, "operation": operation, "status": status}
    if status == 429 or code in _THROTTLE_CODES or (status == 503 and not code):
        return Throttled(text, retry_after=retry_after, **kwargs)
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
    """Epoch seconds of an ISO 8601 UTC time such as ``2026-11-24T19:00:00Z`` (fractions and
    anything after the seconds ignored); None when absent or malformed. Computed, not parsed
    with ``time.strptime`` (its ``_strptime`` imports ``calendar``, ``datetime``, ``locale`` and
    ``re``: milliseconds of the first listing a job step reads)."""
    if not text or len(text) < 19 or text[4] != "-" or text[7] != "-" or text[10] not in "Tt" \
            or text[13] != ":" or text[16] != ":":
        return None
    fields = (text[0:4], text[5:7], text[8:10], text[11:13], text[14:16], text[17:19])
    if not all(f.isdigit() and f.isascii() for f in fields):
        return None
    year, month, day, hour, minute, second = (int(f) for f in fields)
    if not (year >= 1 and 1 <= month <= 12 and 1 <= day <= _days_in_month(year, month) and hour <= 23 and minute <= 59
            and second <= 61):
        return None
    return float(_days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second)


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def multipart_etag(part_etags: Sequence[str]) -> Optional[str]:
    """The ETag S3 gives an object assembled from parts with these (MD5) ETags: the MD5 of the
    parts' binary MD5s, then ``-N``. None if a part's ETag is not an MD5."""
    digests = []
    for etag in part_etags:
        found = md5_of_etag(etag)
        if not found:
            return None
        digests.append(bytes.fromhex(found))
    return f"{_digests.md5(b''.join(digests)).hex()}-{len(digests)}"
