"""Settings of the cache daemon (``pegasus-cloudio serve``): ``PEGASUS_CLOUDIO_P2P_*``.

Shared with the clients (see :mod:`transfer.p2p.config`): ``P2P_REDIS``, ``P2P_CLUSTER``,
``P2P_NAMESPACE``, ``P2P_TOKEN_FILE``/``P2P_TOKEN``, ``P2P_PLAIN_HTTP``, ``P2P_NODE``, ``P2P_RACK``.
The daemon's own:

``P2P_BIND``           ``address:port`` to listen on (required: a pool-facing address); each
                       served user gets a port of her own: this one for the first user in
                       name order, the next one for the next user, ...
``P2P_CERT``           PEM certificate chain signed by the pool CA, naming the bound address.
``P2P_KEY``            its private key.
``P2P_USERS``          comma-separated ``user`` or ``user=/cache/dir`` whose caches are served
                       (a bare user's cache is ``~user/.cache/pegasus-cloudio``). Required.
``P2P_URL``            scheme and host name peers use (default ``https://<bind address>``);
                       each user's port is added.
``P2P_MAX_SERVES``     concurrent serves before answering 503. Default 32.
``P2P_MAX_CONNECTIONS`` open connections per served user, beyond which new ones are closed at
                       once (a quarter of them from one address at most). Default 256.
``P2P_HEARTBEAT_TTL``  seconds a heartbeat keeps this node alive in the index (refreshed
                       every third of it). Default 30.
"""

from __future__ import annotations

import os
import pwd
import socket
from typing import Dict, Mapping, Optional, Tuple

from transfer.errors import ConfigError, InvalidInput
from transfer.knobs import family, origin_of
from transfer.lean import record
from transfer.p2p.config import ENV, flag_value, read_token

from .server import ConnectionLimits, ServeConfig

__all__ = ["DaemonSettings", "daemon_settings", "served_caches"]


@record(frozen=True)
class DaemonSettings:
    """The server's configuration plus what it announces: node name, rack, base URL ("":
    the bound address), the index (None: serve without announcing) and the heartbeat TTL."""

    serve: ServeConfig
    node: str
    rack: str
    url: str
    redis_url: Optional[str]
    cluster: bool
    namespace: str
    heartbeat_ttl: float


def daemon_settings(env: Mapping[str, str]) -> DaemonSettings:
    """Read the settings; InvalidInput/ConfigError name the missing or bad one."""
    raw = family(env, ENV)
    plain = flag_value(raw, "PLAIN_HTTP")
    bind = _bind(raw.get("BIND", ""))
    cert, key = raw.get("CERT"), raw.get("KEY")
    if not plain and not (cert and key):
        raise ConfigError(f"{ENV}CERT and {ENV}KEY are required (or {ENV}PLAIN_HTTP=1 on a "
                          "trusted network)", operation="config")
    caches = served_caches(raw.get("USERS", ""))
    serve = ServeConfig(caches=caches, owners=_owners(caches),
                        token=read_token(raw.get("TOKEN_FILE"), raw.get("TOKEN")),
                        bind=bind, cert_file=cert, key_file=key, plain_http=plain,
                        max_serves=_positive(raw, "MAX_SERVES", 32),
                        limits=_limits(_positive(raw, "MAX_CONNECTIONS", 256)))
    return DaemonSettings(
        serve=serve, node=raw.get("NODE") or socket.gethostname(), rack=raw.get("RACK", ""),
        url=raw.get("URL", ""), redis_url=raw.get("REDIS"),
        cluster=flag_value(raw, "CLUSTER"),
        namespace=raw.get("NAMESPACE", "pcio"),
        heartbeat_ttl=float(_positive(raw, "HEARTBEAT_TTL", 30)))


def _limits(total: int) -> ConnectionLimits:
    return ConnectionLimits(max_connections=total, max_per_address=max(1, total // 4))


def _owners(caches: Mapping[str, str]) -> Dict[str, int]:
    """uid of each served user that exists here (a cache owned by anyone else is not served)."""
    owners: Dict[str, int] = {}
    for user in caches:
        try:
            owners[user] = pwd.getpwnam(user).pw_uid
        except KeyError:
            continue
    return owners


def _bind(text: str) -> Tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InvalidInput(f"{ENV}BIND must be address:port (got {text!r})", operation="config")
    return host.strip("[]"), int(port)


def served_caches(text: str) -> Dict[str, str]:
    """``P2P_USERS`` as user -> cache directory (InvalidInput/ConfigError when bad or empty)."""
    caches: Dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        user, sep, directory = item.partition("=")
        if not sep:
            try:
                home = pwd.getpwnam(user).pw_dir
            except KeyError:
                raise InvalidInput(f"{ENV}USERS: no such user {user!r}", operation="config") from None
            directory = os.path.join(home, ".cache", "pegasus-cloudio")
        caches[user.strip()] = os.path.abspath(directory.strip())
    if not caches:
        raise ConfigError(f"{ENV}USERS must name the users whose caches are served",
                          operation="config")
    return caches


def _positive(raw: Mapping[str, str], name: str, default: int) -> int:
    text = raw.get(name)
    if text is None:
        return default
    if not text.isdigit() or int(text) < 1:
        raise InvalidInput(f"invalid value {text!r} for {ENV}{name}{origin_of(raw, name)}", operation="config")
    return int(text)
