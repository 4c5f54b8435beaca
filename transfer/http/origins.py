"""Keep-alive pools for every origin a session talks to, requests that follow redirects
across them (a redirect to another origin uses that origin's pool), and the one rule of where
a request carrying credentials may be sent (:func:`refusal`), which every backend asks."""

from __future__ import annotations

import ssl
from urllib.parse import quote, urljoin, urlsplit

from transfer import _threads
from transfer.errors import RemoteError
from transfer.http.connection import Body, Timeouts
from transfer.http.pool import ConnectionPool, PooledResponse, PoolStats
from transfer.lean import Headers

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Optional, Tuple

    from transfer.http.proxy import Proxy

    ProxyLookup = Callable[[str, str], Optional[Proxy]]

REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5
_HEX = frozenset("0123456789abcdefABCDEF")


def _wire_target(target: str) -> str:
    """``target`` as wget (stock pegasus-transfer's HTTP tool) sends it: spaces and non-ASCII
    letters percent-encoded as UTF-8, a ``%`` that starts no ``%XX`` escape as ``%25``; any other
    ASCII character (an existing escape included) as written; a line break is left for the
    connection to refuse."""
    if " " not in target and "%" not in target and target.isascii():
        return target
    out = []
    for index, char in enumerate(target):
        if char == "%":
            escape = target[index + 1:index + 3]
            out.append(char if len(escape) == 2 and set(escape) <= _HEX else "%25")
        elif char == " " or not char.isascii():
            out.append(quote(char, safe=""))
        else:
            out.append(char)
    return "".join(out)


def origin_of(location: str) -> str:
    """``scheme://host[:port]`` of a URL, without any user information."""
    parts = urlsplit(location)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_parts(url: str) -> Tuple[str, str, Optional[int]]:
    """(scheme, host, port) of a URL, lower-cased, the port made explicit; port None when the
    URL's port does not parse."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        return scheme, "", None
    return scheme, (parts.hostname or "").lower(), port if port is not None else _DEFAULT_PORTS.get(scheme)


def same_origin(a: str, b: str) -> bool:
    """Whether two URLs have one origin (scheme, host and port, the default port made explicit)."""
    first = _origin_parts(a)
    return first[2] is not None and first == _origin_parts(b)


def _nowhere(location: str) -> bool:
    return False


def refusal(origin: str, location: str, trusted: Callable[[str], bool] = _nowhere) -> Optional[str]:
    """Why a request that carries the credentials of ``origin`` (its signature, its token, its
    ``header.*`` or Basic credentials, its body) may not be sent on to ``location``; None when
    it may. The one rule for every backend:

    * the same origin (scheme, host, port) as the credentials were configured for: yes;
    * never from https to http, and never to another scheme;
    * another host only where ``trusted(location)`` says the configuration itself sends these
      credentials there (S3: the bucket's endpoints on Amazon's own domain when the endpoint
      is Amazon's), and only on the scheme's default port.

    A caller that cannot take the answer follows no redirect: it reports the refusal."""
    scheme, host, port = _origin_parts(origin)
    to_scheme, to_host, to_port = _origin_parts(location)
    if to_scheme not in _DEFAULT_PORTS or not to_host or to_port is None:
        return "not an http(s) URL"
    if scheme == "https" and to_scheme != "https":
        return "from https to plain http"
    if to_scheme != scheme:
        return "to another scheme"
    if (to_host, to_port) == (host, port):
        return None
    if to_port == _DEFAULT_PORTS[to_scheme] and trusted(location):
        return None
    return "to a host or port the endpoint's configuration does not name"


class OriginPools:
    """One :class:`ConnectionPool` per origin, created on first use; thread-safe."""

    def __init__(self, *, max_idle: int, ssl_context: Callable[[], ssl.SSLContext], timeouts: Timeouts,
                 stats: Optional[PoolStats] = None, proxies: Optional[ProxyLookup] = None) -> None:
        """``proxies(scheme, host)``: the proxy an origin's connections go through, or None."""
        self._max_idle = max_idle
        self._proxies = proxies
        self._ssl_context = ssl_context
        self._timeouts = timeouts
        self._stats = stats
        self._pools: Dict[str, ConnectionPool] = {}
        self._lock = _threads.Lock()

    def pool(self, origin: str) -> ConnectionPool:
        pool = self._pools.get(origin)
        if pool is None:
            with self._lock:
                pool = self._pools.get(origin)
                if pool is None:
                    context = self._ssl_context() if origin.startswith("https:") else None
                    proxy = None
                    if self._proxies is not None:
                        parts = urlsplit(origin)
                        proxy = self._proxies(parts.scheme, parts.hostname or "")
                    pool = self._pools[origin] = ConnectionPool(
                        origin, max_idle=self._max_idle, ssl_context=context, timeouts=self._timeouts,
                        stats=self._stats, proxy=proxy)
        return pool

    def proxied(self, origin: str) -> bool:
        """Whether requests to ``origin`` go through a proxy."""
        return self.pool(origin).proxy is not None

    def request(self, method: str, location: str, headers: Callable[[str], Headers], body: Body = None,
                follow: Tuple[int, ...] = REDIRECTS) -> Tuple[PooledResponse, str]:
        """Send ``method`` to ``location``, following redirects with a status in ``follow``.

        ``headers(origin)`` gives each hop's headers (credentials belong to one origin).
        Returns the final response (body unread) and its URL; transfer errors propagate.
        """
        for _ in range(MAX_REDIRECTS + 1):
            parts = urlsplit(location)
            origin = origin_of(location)
            target = _wire_target((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
            response = self.pool(origin).request(method, target, headers(origin), body)
            if response.status not in follow or "location" not in response.headers:
                return response, location
            response.discard()
            location = urljoin(location, response.headers["location"])
        raise RemoteError("too many redirects", operation=method.lower())

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
