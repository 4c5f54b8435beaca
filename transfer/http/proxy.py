"""HTTP proxies for http(s) downloads, from the environment wget and curl read.

Stock pegasus-transfer fetches ``http://`` and ``https://`` URLs with wget (curl when wget is
missing), so its users set proxies the way those tools read them:

* ``http_proxy`` for ``http://`` URLs (lower case only: wget reads no other, and curl refuses
  ``HTTP_PROXY``, which a CGI request could set); when it is not set, ``OSG_SQUID_LOCATION``
  (an Open Science Grid site's Squid), as stock pegasus-transfer sets it for wget;
* ``https_proxy`` (else ``HTTPS_PROXY``) for ``https://`` URLs;
* ``no_proxy`` (or ``NO_PROXY``): hosts that go direct, matched as curl does: ``*`` is every
  host; an entry (a leading ``.`` ignored) matches that host name and every name under it
  (``example.org`` matches ``a.example.org``, not ``badexample.org``); an IP address or
  ``address/bits`` block matches the URL's literal address; an entry's ``:port`` is ignored.

A proxy is ``[http://][user:password@]host[:port]``; without a port, port 80, as wget (stock's
first choice) reads it as an ``http://`` URL (curl, used only when wget is missing, takes 1080).
An ``http://`` request goes to the proxy in absolute form (``GET http://host/path``); an
``https://`` one through a ``CONNECT host:port`` tunnel, inside which TLS is verified against
the origin's name, never the proxy's. The proxy's credentials are sent as
``Proxy-Authorization: Basic`` to the proxy only and never appear in a message.

S3 is stock's ``pegasus-s3``, on botocore, which reads the environment as Python's
``urllib.request.getproxies()`` does (:func:`boto_proxy_for`): ``<scheme>_proxy`` in any case,
the all-lower-case name winning (set but empty: no proxy); ``HTTP_PROXY`` in upper or mixed
case dropped when ``REQUEST_METHOD`` is set (a CGI request could set it); ``no_proxy`` (any
case, lower winning) read as ``urllib.request.proxy_bypass_environment`` reads it: ``*`` alone is
every host; an entry (a leading ``.`` ignored) matches the endpoint's host, or its
``host:port``, and every name under it; no address blocks. The bypass is decided once for the
endpoint, as botocore decides it when the client is made; the proxy is the one of each
request's scheme. ``https://`` proxies (TLS to the proxy itself) are refused, so the settings of
``~/.aws/config`` that only they use (``proxy_ca_bundle``, ``proxy_client_cert``,
``proxy_use_forwarding_for_https``) are not read. GCS (on ``requests``, which reads the same
variables) and the AWS chain's STS follow these rules too.
"""

from __future__ import annotations

from transfer.errors import AuthError, ConfigError, RemoteError, TransientError
from transfer.lean import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Dict, List, Mapping, Optional, Tuple

    from transfer.http.message import HeaderList

_DEFAULT_PORT = 80  # wget's: a proxy is an http:// URL


@record(frozen=True)
class Proxy:
    """Where to connect instead of the origin, and the ``Proxy-Authorization`` value (or None)."""

    host: str
    port: int
    authorization: Optional[str] = field(default=None, repr=False)  # holds the proxy's password

    def __str__(self) -> str:
        """``host:port`` only: the credentials are never printed."""
        return f"{self.host}:{self.port}"


def proxy_for(scheme: str, host: str, env: Mapping[str, str]) -> Optional[Proxy]:
    """The proxy a request to ``scheme://host`` goes through, or None for a direct connection.
    Raises ConfigError naming the variable when its value is not a proxy URL."""
    if scheme == "https":
        name = "https_proxy" if "https_proxy" in env else "HTTPS_PROXY"  # set-but-empty: none, as curl
    elif scheme == "http":
        name = "http_proxy" if "http_proxy" in env else "OSG_SQUID_LOCATION"
    else:
        return None
    value = env.get(name, "").strip()
    if not value or bypassed(host, env.get("no_proxy", env.get("NO_PROXY", ""))):
        return None
    return parse_proxy(value, name)


def boto_proxy_for(scheme: str, endpoint: str, env: Mapping[str, str]) -> Optional[Proxy]:
    """The proxy botocore sends a ``scheme`` request of a client made for ``endpoint``
    (``scheme://host[:port]``) through, or None (see the module doc). Raises ConfigError
    naming the variable when its value is not an ``http://`` proxy URL."""
    found = _environ_proxies(env)
    if "no" in found and _boto_bypassed(_netloc(endpoint), found["no"][1]):
        return None
    name, value = found.get(scheme, ("", ""))
    if not value:
        return None
    return parse_proxy("http:" + value if value.startswith("//") else value, name)


def _environ_proxies(env: Mapping[str, str]) -> Dict[str, Tuple[str, str]]:
    """``urllib.request.getproxies_environment()`` of ``env``: scheme -> (variable, value)."""
    found: Dict[str, Tuple[str, str]] = {}
    for name, value in env.items():  # any case first; then all-lower-case names win
        if value and name[-6:].lower() == "_proxy":
            found[name[:-6].lower()] = (name, value)
    if "REQUEST_METHOD" in env:
        found.pop("http", None)
    for name, value in env.items():
        if name[-6:] == "_proxy":
            if value:
                found[name[:-6].lower()] = (name, value)
            else:
                found.pop(name[:-6].lower(), None)
    return found


def _netloc(endpoint: str) -> str:
    """The ``host[:port]`` of ``endpoint`` as written (urlsplit's netloc)."""
    rest = endpoint.partition("://")[2]
    for stop in "/?#":
        rest = rest.partition(stop)[0]
    return rest


def _boto_bypassed(netloc: str, no_proxy: str) -> bool:
    """``urllib.request.proxy_bypass_environment(netloc)`` with ``no_proxy`` as its value."""
    if no_proxy == "*":
        return True
    host = netloc.lower()
    head, colon, port = host.rpartition(":")
    only = head if colon and port.isascii() and (not port or port.isdigit()) else host
    for entry in no_proxy.split(","):
        entry = entry.strip().lstrip(".").lower()
        if entry and (entry in (only, host) or only.endswith("." + entry) or host.endswith("." + entry)):
            return True
    return False


def absolute_form(target: str, headers: HeaderList, host: str, proxy: Proxy) -> Tuple[str, List[Tuple[str, str]]]:
    """A plain-HTTP request for ``proxy``: ``target`` as an absolute ``http://`` URL naming the
    request's Host (the caller's, as a virtual-hosted bucket's, else ``host``) and the headers
    with the proxy's credentials added."""
    listed = list(headers)
    named = next((value for name, value in listed if name.lower() == "host"), host)
    if proxy.authorization:
        listed.append(("Proxy-Authorization", proxy.authorization))
    return f"http://{named}{target}", listed


def parse_proxy(value: str, name: str) -> Proxy:
    """``[http://][user:password@]host[:port]``; ConfigError naming ``name`` otherwise (the
    value is not quoted: it may hold a password)."""
    from urllib.parse import unquote, urlsplit
    text = value if "://" in value else "http://" + value
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme.lower() != "http" or not parts.hostname or parts.path not in ("", "/"):
        raise ConfigError(f"{name} must be [http://][user:password@]host[:port]", operation="connect")
    authorization = None
    if parts.username is not None:
        from transfer.http.message import basic_credentials
        authorization = basic_credentials(unquote(parts.username), unquote(parts.password or ""))
    return Proxy(parts.hostname, port or _DEFAULT_PORT, authorization)


def bypassed(host: str, no_proxy: str) -> bool:
    """True when ``host`` (a name or a literal address, without port) matches ``no_proxy``."""
    host = host.strip("[]").rstrip(".").lower()
    for entry in no_proxy.split(","):
        entry = entry.strip().lower()
        if entry == "*":
            return True
        if entry.startswith("["):
            entry = entry[1:].partition("]")[0]
        elif entry.count(":") == 1:
            entry = entry.partition(":")[0]  # host:port: the port is not compared
        entry = entry.lstrip(".").rstrip(".")
        if entry and (_address_match(host, entry) if _is_address(host) else
                      host == entry or host.endswith("." + entry)):
            return True
    return False


def _is_address(host: str) -> bool:
    import ipaddress
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _address_match(host: str, entry: str) -> bool:
    import ipaddress
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False)
    except (ValueError, TypeError):
        return False


_MAX_CONNECT_HEAD = 16384


def tunnel(sock: socket.socket, host: str, port: int, proxy: Proxy, endpoint: str) -> None:
    """Ask the proxy connected on ``sock`` for a tunnel to ``host:port`` and read its answer up
    to the blank line (nothing more: the TLS handshake follows). A 407 raises AuthError, any
    other refusal RemoteError (5xx: TransientError), naming ``endpoint`` and the proxy."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if proxy.authorization:
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    head = b""
    while not head.endswith(b"\r\n\r\n"):  # byte by byte: what follows the head is TLS
        byte = sock.recv(1)
        if not byte or len(head) > _MAX_CONNECT_HEAD:
            raise TransientError(f"proxy {proxy} closed the tunnel request", url=endpoint, operation="connect")
        head += byte
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    words = status_line.split(" ", 2)
    status = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    if 200 <= status < 300:
        return
    text = f"proxy {proxy} refused the tunnel: {status_line[:200]}"
    if status == 407:
        raise AuthError(text, url=endpoint, operation="connect", status=status)
    cls = TransientError if status >= 500 or status == 0 else RemoteError
    raise cls(text, url=endpoint, operation="connect", status=status)
