"""Peer-to-peer settings of a client node: ``PEGASUS_CLOUDIO_P2P_*`` (sources: :mod:`transfer.knobs`).

``P2P_REDIS``               ``redis://host:port/0`` (``rediss://`` for TLS) of the replica index;
                            unset: no peer sharing, everything runs as on a single node.
``P2P_CLUSTER``             ``1`` when that address is a Redis Cluster node.
``P2P_NAMESPACE``           prefix of every index key (one per pool). Default ``pcio``.
``P2P_TOKEN_FILE``          file holding the pool's bearer token (``~`` is the user's home; must
                            not be readable by group or others); ``P2P_TOKEN`` gives it directly
                            (the file wins; never put it in a job's environment).
``P2P_CA_FILE``             PEM of the pool CA that signed the daemons' certificates; required
                            (the system CAs are never trusted for peers) unless ``P2P_PLAIN_HTTP``.
``P2P_PLAIN_HTTP``          ``1`` allows ``http://`` peers (trusted networks only).
``P2P_NETWORKS``            comma-separated CIDRs peers must be in. Default: loopback and the
                            private ranges (10/8, 172.16/12, 192.168/16, fc00::/7).
``P2P_NODE``                this node's name in the index. Default: the host name.
``P2P_RACK``                this node's rack (peers on the same host, then rack, are preferred).
``P2P_CONNECT_TIMEOUT``     seconds to connect to a peer (TCP+TLS). Default 0.5.
``P2P_FIRST_BYTE_TIMEOUT``  seconds from request to response headers. Default 1.
``P2P_READ_TIMEOUT``        seconds without a byte in a body. Default 5.
``P2P_CLAIM_SECONDS``       a node fetching a file from the store claims it for this long; others
                            wait up to this for its replica instead of reading the store too.
                            ``0`` disables claims. Default 10.
``P2P_MAX_PEERS``           peers tried per file before the store. Default 3.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import socket
import stat
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple, Union

from transfer.config import parse_flag, parse_seconds
from transfer.errors import ConfigError, InvalidInput
from transfer.knobs import family, origin_of
from transfer.knobs import PREFIX
from transfer.named_files import OWN_LINKS, read_file

__all__ = ["PeerConfig", "node_id", "peer_config_from_env", "read_token"]

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
ENV = PREFIX + "P2P_"
MAX_TOKEN_BYTES = 64 << 10
DEFAULT_NETWORKS = "127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7"


@dataclass(frozen=True)
class PeerConfig:
    """How a node finds and reads peers (see the module docstring for each setting)."""

    redis_url: str
    token: str
    cluster: bool = False
    namespace: str = "pcio"
    ca_file: Optional[str] = None
    plain_http: bool = False
    networks: Tuple[Network, ...] = ()
    node: str = ""
    rack: str = ""
    user: str = ""
    connect_timeout: float = 0.5
    first_byte_timeout: float = 1.0
    read_timeout: float = 5.0
    claim_seconds: float = 10.0
    max_peers: int = 3

    @property
    def node_id(self) -> str:
        """This node's id in the index for this user's cache."""
        return node_id(self.node, self.user)


def node_id(node: str, user: str) -> str:
    return f"{node}/{user}"


def parse_networks(text: str, name: str = ENV + "NETWORKS") -> Tuple[Network, ...]:
    try:
        return tuple(ipaddress.ip_network(part.strip(), strict=False)
                     for part in text.split(",") if part.strip())
    except ValueError as err:
        raise InvalidInput(f"invalid value for {name}: {err}", operation="config") from None


def read_token(path: Optional[str], direct: Optional[str], name: str = ENV + "TOKEN_FILE") -> str:
    """The pool token from ``path`` (private file) or ``direct``; ConfigError if neither."""
    if path:
        try:
            data, st = read_file(os.path.expanduser(path), MAX_TOKEN_BYTES, OWN_LINKS)
        except OSError as err:
            raise ConfigError(f"{name}: cannot read the token file: {err.strerror}", url=path,
                              operation="config") from None
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise ConfigError(f"{name}: the token file is readable by group or others; "
                              "chmod 600 it", url=path, operation="config")
        token = data.decode("utf-8", "replace").strip()
    else:
        token = (direct or "").strip()
    if not token:
        raise ConfigError(f"peer sharing needs a pool token: set {name} (or {ENV}TOKEN)",
                          operation="config")
    return token


def peer_config_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[PeerConfig]:
    """The configuration in ``env`` (default ``os.environ``; a command passes
    :func:`transfer.knobs.layered`'s mapping, config file included); None when ``P2P_REDIS``
    is unset. InvalidInput/ConfigError name the bad setting."""
    env = os.environ if env is None else env
    raw = family(env, ENV)
    if not raw.get("REDIS"):
        return None
    if not raw.get("CA_FILE") and not flag_value(raw, "PLAIN_HTTP"):
        raise ConfigError(f"peer sharing needs {ENV}CA_FILE (the pool CA that signed the daemons' "
                          "certificates); the system CAs are never trusted for peers", operation="config")
    return PeerConfig(
        redis_url=raw["REDIS"],
        token=read_token(raw.get("TOKEN_FILE"), raw.get("TOKEN")),
        cluster=flag_value(raw, "CLUSTER"),
        namespace=raw.get("NAMESPACE", "pcio"),
        ca_file=raw.get("CA_FILE"),
        plain_http=flag_value(raw, "PLAIN_HTTP"),
        networks=parse_networks(raw.get("NETWORKS", DEFAULT_NETWORKS),
                                ENV + "NETWORKS" + origin_of(raw, "NETWORKS")),
        node=raw.get("NODE") or socket.gethostname(),
        rack=raw.get("RACK", ""),
        user=getpass.getuser(),
        connect_timeout=_seconds(raw, "CONNECT_TIMEOUT", 0.5, zero=False),
        first_byte_timeout=_seconds(raw, "FIRST_BYTE_TIMEOUT", 1.0, zero=False),
        read_timeout=_seconds(raw, "READ_TIMEOUT", 5.0, zero=False),
        claim_seconds=_seconds(raw, "CLAIM_SECONDS", 10.0),
        max_peers=_count(raw, "MAX_PEERS", 3),
    )


def flag_value(raw: Mapping[str, str], name: str) -> bool:
    """Knob ``ENV + name`` of :func:`transfer.knobs.family`'s ``raw``: 1/0 (unset: 0); InvalidInput naming it."""
    try:
        return parse_flag(raw.get(name, "0"))
    except ValueError:
        raise InvalidInput(f"{ENV}{name}{origin_of(raw, name)} must be 1 or 0 (got {raw[name]!r})",
                           operation="config") from None


def _seconds(raw: Mapping[str, str], name: str, default: float, *, zero: bool = True) -> float:
    """A finite number of seconds, 0 or more (above 0 unless ``zero``); InvalidInput naming it."""
    if name not in raw:
        return default
    try:
        value = parse_seconds(raw[name])
    except ValueError:
        value = -1.0
    if value < 0 or (value == 0 and not zero):
        raise InvalidInput(f"invalid value {raw[name]!r} for {ENV}{name}{origin_of(raw, name)}", operation="config")
    return value


def _count(raw: Mapping[str, str], name: str, default: int) -> int:
    """A whole number, 0 or more; InvalidInput naming it."""
    text = raw.get(name, str(default)).strip()
    if not (text.isascii() and text.isdigit()):
        raise InvalidInput(f"invalid value {raw[name]!r} for {ENV}{name}{origin_of(raw, name)} (a whole number)",
                           operation="config")
    return int(text)
