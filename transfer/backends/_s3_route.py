"""Where an S3 request goes, how it is signed, and the three answers Amazon expects a client
to act on rather than report:

* a bucket in another region (301 ``PermanentRedirect``, 400 ``AuthorizationHeaderMalformed``
  or a HEAD's bare 400/301, naming the region in ``x-amz-bucket-region`` or ``<Region>``):
  the request is sent once more to that region and the bucket's region is remembered, so
  later requests go there directly (on Amazon's own endpoints the host changes too);
* 307 ``TemporaryRedirect`` (a new bucket's DNS not yet everywhere): with a region in
  ``x-amz-bucket-region`` other than the route's, re-routed to that region as above (botocore's
  way); otherwise sent once to ``Location`` where :func:`transfer.http.origins.refusal` lets the
  signed request (and a PUT's body) go: the endpoint's own origin, or, on Amazon's endpoints
  only, the bucket's S3 hosts on Amazon's domain (``[BUCKET.]s3[.-]REGION.amazonaws.com``),
  over the same scheme and the default port. Any other ``Location`` (another host or port, a
  plain ``http://`` under ``https://``) is an error naming it and is never contacted;
* 403 ``RequestTimeTooSkewed``: the clock offset is taken from the server's time and the
  request is signed again and sent once more; later requests use the corrected clock.

Anything else (and a second failure) goes back to the caller untouched. 500 and 503
``SlowDown`` are classified by :func:`~transfer.backends._s3_wire.s3_error` as retryable and
backed off per file by the engine.
"""

from __future__ import annotations

import time

from transfer import _threads
from transfer.backends._s3_wire import S3Path, default_endpoint, iso8601_epoch, s3_error, virtual_hosted, xml_tree
from transfer.backends._sigv4 import SigV4Signer, canonical_query_of
from transfer.backends._wire_common import uri_encode_path
from transfer.errors import RemoteError, TransferError, TransientError, retry_after_seconds
from transfer.http.pool import ConnectionPool, PooledResponse
from transfer.lean import Headers, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Tuple, Union

    from transfer.credentials import CredentialSource
    from transfer.http.connection import Body

if TYPE_CHECKING:
    PoolFactory = Callable[[str], ConnectionPool]
else:
    PoolFactory = object  # the alias above is for type checkers; typing is not imported at run time
_REGION_CODES = {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"}
_MAX_ERROR_BODY = 1 << 16


class Clock:
    """Seconds since the epoch as the server sees them: local time plus a learned offset."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@record(frozen=True)
class Route:
    """One region's destination: a pool, the Host it answers to, and a signer for it."""

    region: str
    pool: ConnectionPool
    host_header: str
    signer: Optional[SigV4Signer]
    virtual: Callable[[str], bool]

    def target(self, path: S3Path) -> Tuple[str, str]:
        """(Host header, encoded path) for path-style or virtual-hosted addressing."""
        if path.bucket and self.virtual(path.bucket):
            return f"{path.bucket}.{self.host_header}", uri_encode_path("/" + path.key)
        key = "/" + path.key if path.key else ""
        return self.host_header, uri_encode_path(f"/{path.bucket}{key}")


class _VirtualHosted:
    """:func:`virtual_hosted` for one endpoint host, remembered per bucket (at most 64)."""

    def __init__(self, host: str) -> None:
        self._host = host
        self._answers: Dict[str, bool] = {}

    def __call__(self, bucket: str) -> bool:
        answer = self._answers.get(bucket)
        if answer is None:
            answer = virtual_hosted(self._host, bucket)
            if len(self._answers) < 64:
                self._answers[bucket] = answer
        return answer


class BufferedReply:
    """An error answer whose (small) body was read to decide what to do; reads like a response."""

    def __init__(self, response: PooledResponse) -> None:
        self.status = response.status
        self.headers = response.headers
        self.reason = response.reason
        self.body = response.read() if _small(response) else b""
        if not self.body:
            response.discard()

    def read(self) -> bytes:
        return self.body

    def read_into(self, write: Callable[[bytes], object], url: Optional[str] = None) -> int:
        write(self.body)
        return len(self.body)

    def discard(self) -> None:
        return None

    def __enter__(self) -> "BufferedReply":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


if TYPE_CHECKING:
    AnyReply = Union[PooledResponse, BufferedReply]
else:
    AnyReply = object  # the alias above is for type checkers; typing is not imported at run time


def check_reply(response: AnyReply, url: str, operation: str, ok: Tuple[int, ...] = (200,)) -> None:
    """Nothing when ``response``'s status is in ``ok``; else its error, body read, raised
    (:func:`~transfer.backends._s3_wire.s3_error`, ``Retry-After`` kept)."""
    if response.status in ok:
        return
    body = response.read() if response.status >= 300 else b""
    raise s3_error(response.status, body, url, operation,
                   retry_after=retry_after_seconds(response.headers.get("retry-after")))


def _small(response: PooledResponse) -> bool:
    length = response.headers.get("content-length")
    return length is not None and length.isdigit() and int(length) <= _MAX_ERROR_BODY


class Router:
    """Routes for every region a backend has met; thread-safe."""

    def __init__(self, pool: ConnectionPool, region: str, credentials: Optional[CredentialSource],
                 pool_for: PoolFactory, *, amazon_default: bool) -> None:
        self.clock = Clock()
        self._credentials = credentials
        self._pool_for = pool_for
        self._amazon_default = amazon_default
        self._scheme = pool.scheme
        self._home = self._route(region, pool)
        self._routes: Dict[str, Route] = {region: self._home}
        self._bucket_regions: Dict[str, str] = {}
        self._redirect_pools: Dict[str, ConnectionPool] = {}
        self._lock = _threads.Lock()

    @property
    def home(self) -> Route:
        return self._home

    def _route(self, region: str, pool: ConnectionPool) -> Route:
        default = 443 if pool.scheme == "https" else 80
        host = pool.host if pool.port == default else f"{pool.host}:{pool.port}"
        signer = SigV4Signer(self._credentials, region, clock=self.clock) if self._credentials else None
        return Route(region, pool, host, signer, _VirtualHosted(pool.host))

    def for_bucket(self, bucket: str) -> Route:
        region = self._bucket_regions.get(bucket)
        return self._home if region is None else self._for_region(region)

    def _for_region(self, region: str) -> Route:
        found = self._routes.get(region)
        if found is not None:
            return found
        with self._lock:
            found = self._routes.get(region)
            if found is None:
                pool = self._pool_for(default_endpoint(region, self._scheme)) if self._amazon_default \
                    else self._home.pool
                found = self._routes[region] = self._route(region, pool)
            return found

    def pools(self) -> List[ConnectionPool]:
        with self._lock:
            return list({id(r.pool): r.pool for r in self._routes.values()}.values()) + \
                list(self._redirect_pools.values())

    # -- sending --------------------------------------------------------------------------

    def send(self, method: str, path: S3Path, query: str, headers: Headers, body: Body, payload_hash: str,
             url: str) -> AnyReply:
        """Send, acting once on a wrong region, a 307 or a skewed clock (see the module doc)."""
        route = self.for_bucket(path.bucket)
        host, encoded = route.target(path)
        response = self._send(route, method, host, encoded, query, headers, body, payload_hash, url)
        if response.status not in (301, 307, 400, 403):
            return response
        reply = BufferedReply(response)
        code, region, server_time = _error_facts(reply)
        if region and region != route.region and (reply.status in (301, 307) or code in _REGION_CODES
                                                  or (method == "HEAD" and reply.status == 400)):
            self._bucket_regions[path.bucket] = region
            route = self.for_bucket(path.bucket)
            host, encoded = route.target(path)
        elif reply.status == 307 and "location" in reply.headers:
            location = self._allowed(route, host, path.bucket, reply.headers["location"], method, url)
            return self._follow(route, method, location, headers, body, payload_hash, url)
        elif code == "RequestTimeTooSkewed" and server_time is not None:
            self.clock.offset = server_time - time.time()
        else:
            return reply
        return self._send(route, method, host, encoded, query, headers, body, payload_hash, url)

    def _allowed(self, route: Route, host: str, bucket: str, location: str, method: str, url: str) -> str:
        """A 307's ``location`` made absolute, if the signed request may go there (see the
        module doc); else RemoteError naming where it pointed."""
        from urllib.parse import urljoin

        from transfer.http.origins import origin_of, refusal
        here = f"{route.pool.scheme}://{host}/"
        absolute = urljoin(here, location)
        why = refusal(here, absolute, self._amazon_hosts(bucket) if self._amazon_default else _nowhere)
        if why is not None:
            raise RemoteError(f"HTTP 307 redirect to {origin_of(absolute)} not followed: {why}",
                              url=url or None, operation=method.lower(), status=307)
        return absolute

    @staticmethod
    def _amazon_hosts(bucket: str) -> Callable[[str], bool]:
        """Whether a URL names ``bucket`` on one of Amazon's S3 hosts: ``BUCKET.s3...`` or
        ``s3.../BUCKET/...`` on Amazon's own domain (a key on another bucket is no redirect
        of this request)."""
        import re
        from urllib.parse import urlsplit
        host = re.compile(r"(?:(?P<bucket>[^.]+(?:\.[^.]+)*?)\.)?s3(?:[.-][a-z0-9-]+)*\.amazonaws\.com")

        def trusted(location: str) -> bool:
            parts = urlsplit(location)
            found = host.fullmatch((parts.hostname or "").lower())
            if found is None:
                return False
            if found.group("bucket") is not None:
                return found.group("bucket") == bucket
            return parts.path == f"/{bucket}" or parts.path.startswith(f"/{bucket}/")
        return trusted

    def _follow(self, route: Route, method: str, location: str, headers: Headers, body: Body,
                payload_hash: str, url: str) -> PooledResponse:
        from urllib.parse import urlsplit

        from transfer.http.origins import origin_of
        parts = urlsplit(location)
        origin = origin_of(location)
        with self._lock:
            pool = self._redirect_pools.get(origin)
            if pool is None:
                pool = self._redirect_pools[origin] = self._pool_for(origin)
        redirected = Route(route.region, pool, parts.netloc, route.signer, lambda _bucket: False)
        return self._send(redirected, method, parts.netloc, parts.path or "/", canonical_query_of(parts.query),
                          headers, body, payload_hash, url)

    @staticmethod
    def _send(route: Route, method: str, host: str, encoded: str, query: str, headers: Headers, body: Body,
              payload_hash: str, url: str) -> PooledResponse:
        extra = headers if host == route.host_header else [("Host", host), *headers]  # never changed below
        if route.signer is not None:
            extra = route.signer.sign(method, host, encoded, query, payload_hash, extra)
        target = f"{encoded}?{query}" if query else encoded
        try:
            return route.pool.request(method, target, extra, body)
        except TransferError as err:
            raise err.relabelled(url=url or None, operation=method.lower()) from err


def _nowhere(location: str) -> bool:
    return False


def _error_facts(reply: BufferedReply) -> Tuple[str, Optional[str], Optional[float]]:
    """(error code, bucket region, server time) from an error answer's headers and XML."""
    code, region, server_time = "", reply.headers.get("x-amz-bucket-region"), None
    if reply.body:
        try:
            root = xml_tree(reply.body)
        except TransientError:
            root = None
        if root is not None:
            code = root.findtext("Code") or ""
            region = region or root.findtext("Region")
            server_time = iso8601_epoch(root.findtext("ServerTime"))
    if code == "RequestTimeTooSkewed" and server_time is None and "date" in reply.headers:
        from email.utils import parsedate_to_datetime
        try:
            server_time = parsedate_to_datetime(reply.headers["date"]).timestamp()
        except (TypeError, ValueError):
            server_time = None
    return code, region, server_time
