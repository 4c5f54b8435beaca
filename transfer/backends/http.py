"""HTTP(S) downloads over keep-alive connections, one pool per origin.

Follows up to five redirects (a redirect to another origin uses that origin's pool), adds
``header.<Name>`` values from the Pegasus credentials file for each hop's origin (scheme,
host and port: a redirect to plain HTTP or another port carries none of the first
origin's credentials), checks the
byte count against Content-Length, and verifies TLS unless the URL is plain ``http://``.
A body cut short resumes from the byte it reached where the server gives a strong ETag
(:mod:`transfer.http.resume`).
``user:password@`` in the URL is sent as Basic credentials to that origin, as wget and curl do.
``http_proxy``, ``https_proxy``, ``no_proxy`` and ``OSG_SQUID_LOCATION`` are honoured as
stock pegasus-transfer's wget honours them (:mod:`transfer.http.proxy`).
HTTP is a download-only source here: the backend reads only (no ``Uploads``, no ``Namespace``).
"""

from __future__ import annotations

from typing import BinaryIO, Callable, Hashable, List, Mapping, Optional, Set, Tuple
from urllib.parse import urlsplit

from transfer._digests import sha256_hex
from transfer.backends.base import ByteRange, ObjectInfo
from transfer.errors import (
    AuthError,
    ChecksumMismatch,
    ConfigError,
    NotFound,
    RemoteError,
    Throttled,
    TransferError,
    TransientError,
    retry_after_seconds,
)
from transfer.http.message import basic_credentials
from transfer.http.origins import OriginPools, origin_of, refusal
from transfer.http.pool import PooledResponse
from transfer.http.resume import ResumingBody, send_idempotent
from transfer.backends.opening import Opening
from transfer.urls import Url



def endpoint_key(url: Url, context: Opening) -> Hashable:
    return "http"


HeaderLookup = Callable[[Url, str], List[Tuple[str, str]]]  # (URL, origin of this hop) -> headers


def open_backend(url: Url, context: Opening) -> "HttpBackend":
    from transfer.http.proxy import proxy_for
    env = context.env

    def pools(proxied: bool) -> OriginPools:
        return OriginPools(max_idle=context.settings.threads + 2, ssl_context=context.ssl_context,
                           timeouts=context.timeouts, stats=context.stats,
                           proxies=(lambda scheme, host: proxy_for(scheme, host, env)) if proxied else None)
    return HttpBackend(pools(True), credential_headers(context), direct=pools(False))


def credential_headers(context: Opening) -> HeaderLookup:
    """``header.<Name>`` values of the Pegasus credentials file for a URL's site and the
    origin (``scheme://host[:port]``) of one hop."""
    env = context.env

    def lookup(url: Url, origin: str) -> List[Tuple[str, str]]:
        if not (env.get("PEGASUS_CREDENTIALS") or _has_site_credentials(url, env)):
            return []
        try:
            creds = context.pegasus_credentials(url.site_label)
        except ConfigError as err:
            if "not found" in err.message:
                return []
            raise
        parts = urlsplit(origin)
        try:
            port = parts.port
        except ValueError:
            return []
        return list(creds.headers_for(parts.scheme, parts.hostname or "", port).items())
    return lookup


class HttpBackend:
    """Every HTTP(S) origin of one session: ``origins`` makes a pool per origin on first use;
    ``headers`` gives the extra headers of each hop (credentials). ``direct``: pools without a
    proxy, for an ``http://`` URL whose request through its proxy failed: as stock
    pegasus-transfer drops ``http_proxy`` (a Squid's copy may be the bad one) after a first
    failed attempt, later attempts of that URL go to the origin itself."""

    def __init__(self, origins: OriginPools, headers: HeaderLookup, direct: Optional[OriginPools] = None) -> None:
        self._origins = origins
        self._headers = headers
        self._direct = direct
        self._bypass: Set[str] = set()  # http URLs that failed through their proxy

    def _open(self, method: str, url: Url, extra: List[Tuple[str, str]]) -> Tuple[PooledResponse, str]:
        first = origin_of(url.full)

        def hop_headers(origin: str) -> List[Tuple[str, str]]:
            headers = self._headers(url, origin) + extra
            if refusal(first, origin) is None and "@" in url.host and not any(k.lower() == "authorization" for k, _ in headers):
                headers.append(("Authorization", basic_authorization(url.host)))
            return headers

        origins = self._direct if self._direct is not None and url.full in self._bypass else self._origins
        try:
            return origins.request(method, url.full, hop_headers)
        except TransferError as err:
            raise err.relabelled(url=str(url), operation=method.lower()) from err

    def _failed(self, url: Url, err: TransferError) -> TransferError:
        """After a failed request for ``url``, the error to raise: an http URL served through a
        proxy goes direct next, and its failure through the proxy (a 407, a 403 of the proxy's
        rules, whatever it was) is worth that next attempt, as stock retries every failure."""
        if url.full in self._bypass or not (url.scheme == "http" and self._direct is not None
                                            and self._origins.proxied(origin_of(url.full))):
            return err
        self._bypass.add(url.full)
        if err.retryable:
            return err
        return TransientError(f"{err.message} (through the proxy; a retry goes direct)", url=err.url,
                              operation=err.operation, status=err.status)

    def stat(self, url: Url) -> ObjectInfo:
        try:
            response, _ = self._open("HEAD", url, [])
            with response:
                check_response(response, url, "stat")
                return _info(url, response)
        except TransferError as err:
            failure = self._failed(url, err)
            if failure is err:
                raise
            raise failure from err

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        try:
            return self._get(url, sink, byte_range)
        except TransferError as err:
            failure = self._failed(url, err)
            if failure is err:
                raise
            raise failure from err

    def _get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange]) -> ObjectInfo:
        extra = [("Range", f"bytes={byte_range[0]}-{byte_range[1] - 1}")] if byte_range else []
        response, _ = send_idempotent(lambda: self._open("GET", url, extra), str(url))
        with response:
            check_response(response, url, "get", ok=(206,) if byte_range else (200,))
            info = _info(url, response)
            with self._body(response, url, byte_range[0] if byte_range else 0) as body:
                count = body.read_into(sink.write)
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and count != int(declared):
            raise ChecksumMismatch(f"received {count} of {declared} bytes", url=str(url), operation="get")
        return ObjectInfo(url, _object_size(response) if byte_range else count, info.version, info.mtime)

    def _body(self, response: PooledResponse, url: Url, first: int) -> ResumingBody:
        """``response``'s body (bytes ``first`` onwards), resumed after a cut with a ranged GET
        pinned to its strong ETag (``If-Match``; the answer must be a 206 of that ETag from the
        byte reached); not resumed without a strong ETag or a Content-Length."""
        length = response.headers.get("content-length", "")
        etag = response.headers.get("etag", "")
        end = first + int(length) if length.isdigit() else first
        if not length.isdigit() or not etag.startswith('"'):
            return ResumingBody(response, None, first, end if length.isdigit() else 1 << 62, str(url))

        def reopen(offset: int) -> PooledResponse:
            headers = [("Range", f"bytes={offset}-{end - 1}"), ("If-Match", etag)]
            rest, _ = self._open("GET", url, headers)
            span = rest.headers.get("content-range", "")
            if rest.status != 206 or rest.headers.get("etag") != etag or not span.startswith(f"bytes {offset}-{end - 1}/"):
                rest.discard()
                raise RemoteError(f"the object changed while being read (asked ETag {etag} from byte {offset}; got "
                                  f"HTTP {rest.status}, ETag {rest.headers.get('etag') or '-'}, {span or 'no range'})",
                                  url=str(url), operation="get", status=rest.status)
            return rest
        return ResumingBody(response, reopen, first, end, str(url))

    def cache_key(self, url: Url) -> str:
        """The URL without user info; a query (maybe a signature, as in a pre-signed URL) as its
        SHA-256, so two queries stay two objects but no cache file, ``cache ls`` line or
        warning holds its text."""
        path, query_mark, query = url.path.partition("?")
        if query_mark:
            path += "?sha256=" + sha256_hex(query.encode("utf-8", "surrogatepass"))
        return f"{url.scheme}://{url.host.rpartition('@')[2]}{path}"

    def close(self) -> None:
        self._origins.close()
        if self._direct is not None:
            self._direct.close()


def basic_authorization(authority: str) -> str:
    """The ``Basic`` credentials of ``user[:password]@host`` (percent-escapes decoded), which wget
    and curl, stock pegasus-transfer's HTTP tools, send for such a URL. Sent to the URL's own
    origin (scheme, host, port) only, never to a redirect's other origin; a header from the
    credentials file wins."""
    from urllib.parse import unquote
    user, _, password = authority.rpartition("@")[0].partition(":")
    return basic_credentials(unquote(user), unquote(password))


def _has_site_credentials(url: Url, env: Mapping[str, str]) -> bool:
    label = (url.site_label or "").replace("-", "_")
    return bool(label) and bool(env.get(f"PEGASUS_CREDENTIALS_{label}"))


def _object_size(response: PooledResponse) -> int:
    """The whole object's size a 206 answer names (``Content-Range: bytes FIRST-LAST/SIZE``), as
    every backend's ranged ``get`` reports it; -1 when the server names none (``/*``)."""
    total = response.headers.get("content-range", "").rpartition("/")[2]
    return int(total) if total.isdigit() else -1


def _info(url: Url, response: PooledResponse) -> ObjectInfo:
    length = response.headers.get("content-length", "")
    version = response.headers.get("etag") or response.headers.get("last-modified")
    return ObjectInfo(url, int(length) if length.isdigit() else -1, version)


def check_response(response: PooledResponse, url: Url, operation: str, ok: Tuple[int, ...] = (200,)) -> None:
    """Raise the transfer error that an unexpected HTTP status means (body discarded)."""
    status = response.status
    if status in ok:
        return
    response.discard()
    text = f"HTTP {status} {response.reason}".rstrip()
    kwargs = {"url": str(url), "operation": operation, "status": status}
    if status == 404 or status == 410:
        raise NotFound(text, **kwargs)  # type: ignore[arg-type]
    if status in (401, 403):
        raise AuthError(text, **kwargs)  # type: ignore[arg-type]
    if status == 429 or (status == 503 and "retry-after" in response.headers):
        raise Throttled(text, retry_after=retry_after_seconds(response.headers.get("retry-after")), **kwargs)
    if status >= 500 or status == 408:
        raise TransientError(text, **kwargs)  # type: ignore[arg-type]
    raise RemoteError(text, **kwargs)  # type: ignore[arg-type]


