"""HTTP(S) downloads over keep-alive connections, one pool per origin.

Follows up to five redirects (a redirect to another origin uses that origin's pool), adds
``header.<Name>`` values from the Pegasus credentials file for the URL's host, checks the
byte count against Content-Length, and verifies TLS unless the URL is plain ``http://``.
HTTP is a download-only source here: uploads, listings and deletes are refused.
"""

from __future__ import annotations

from typing import BinaryIO, Hashable, Iterator, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from transfer.backends.base import ByteRange, ObjectInfo
from transfer.errors import (
    AuthError,
    ChecksumMismatch,
    ConfigError,
    InvalidInput,
    NotFound,
    RemoteError,
    Throttled,
    TransferError,
    TransientError,
)
from transfer.http.origins import OriginPools
from transfer.http.pool import PooledResponse
from transfer.context import Context
from transfer.urls import Url



def endpoint_key(url: Url, context: Context) -> Hashable:
    return "http"


def open_backend(url: Url, context: Context) -> "HttpBackend":
    return HttpBackend(context)


class HttpBackend:
    """Every HTTP(S) origin of one session; pools are created per origin on first use."""

    def __init__(self, context: Context) -> None:
        self._context = context
        self._origins = OriginPools(max_idle=context.settings.threads + 2, ssl_context=context.ssl_context,
                                    timeouts=context.timeouts, stats=context.stats)

    def _headers(self, url: Url, host: str) -> List[Tuple[str, str]]:
        env = self._context.env
        if not (env.get("PEGASUS_CREDENTIALS") or _has_site_credentials(url, env)):
            return []
        try:
            creds = self._context.pegasus_credentials(url.site_label)
        except ConfigError as err:
            if "not found" in err.message:
                return []
            raise
        return list(creds.headers_for(url.scheme, host).items())

    def _open(self, method: str, url: Url, extra: List[Tuple[str, str]]) -> Tuple[PooledResponse, str]:
        def hop_headers(origin: str) -> List[Tuple[str, str]]:
            return self._headers(url, urlsplit(origin).hostname or "") + extra

        try:
            return self._origins.request(method, url.full, hop_headers)
        except TransferError as err:
            raise type(err)(err.message, url=str(url), operation=method.lower(), status=err.status) from err

    def stat(self, url: Url) -> ObjectInfo:
        response, _ = self._open("HEAD", url, [])
        with response:
            check_response(response, url, "stat")
            return _info(url, response)

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        extra = [("Range", f"bytes={byte_range[0]}-{byte_range[1] - 1}")] if byte_range else []
        response, _ = self._open("GET", url, extra)
        with response:
            check_response(response, url, "get", ok=(206,) if byte_range else (200,))
            info = _info(url, response)
            count = response.read_into(sink.write, str(url))
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and count != int(declared):
            raise ChecksumMismatch(f"received {count} of {declared} bytes", url=str(url), operation="get")
        return ObjectInfo(url, count, info.version, info.mtime)

    def put(self, path: str, url: Url) -> ObjectInfo:
        raise InvalidInput("uploads over HTTP are not supported", url=str(url), operation="put")

    def list(self, url: Url) -> Iterator[ObjectInfo]:
        raise InvalidInput("listing over HTTP is not supported", url=str(url), operation="list")

    def delete(self, urls: Sequence[Url]) -> List[Optional[TransferError]]:
        return [InvalidInput("removing over HTTP is not supported", url=str(u), operation="remove")
                for u in urls]

    def make_dirs(self, url: Url) -> None:
        raise InvalidInput("mkdir over HTTP is not supported", url=str(url), operation="mkdir")

    def cache_key(self, url: Url) -> str:
        return f"{url.scheme}://{url.host.rpartition('@')[2]}{url.path}"

    def close(self) -> None:
        self._origins.close()


def _has_site_credentials(url: Url, env: Mapping[str, str]) -> bool:
    label = (url.site_label or "").replace("-", "_")
    return bool(label) and bool(env.get(f"PEGASUS_CREDENTIALS_{label}"))


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
        raise Throttled(text, **kwargs)  # type: ignore[arg-type]
    if status >= 500 or status == 408:
        raise TransientError(text, **kwargs)  # type: ignore[arg-type]
    raise RemoteError(text, **kwargs)  # type: ignore[arg-type]


