"""PeerClient: read one cached object from the daemons of the nodes that hold it.

For each key the holders are ordered same host, then same rack, then the rest, at random
within each group (spreading load over equal replicas). Peers are tried in that order, at
most ``max_peers``; when one fails mid-body, the next continues where it stopped with a
``Range`` request. Whatever arrives is hashed on the way; the result is good only when the
size and SHA-256 match what the producer registered. Otherwise the sink is emptied and the
caller reads the store: wrong bytes are never delivered.

Each request carries the pool token and a proof for this object and this peer
(:func:`transfer.peers.proof` of the reader's scope's capability, bound to the certificate
the peer presented): the peer's daemon serves only readers of the scope its producer
registered under, and a proof collected by a hostile daemon (with a certificate of its own)
cannot be replayed to another.

A peer must be inside the pool's networks (every address its host name resolves to), speak
HTTPS verified against the pool CA and nothing else (without ``ca_file`` no HTTPS peer is
trusted: the system CAs never are; ``http://`` only with ``plain_http``), answer the TCP
and TLS handshake within ``connect_timeout``, send its headers within ``first_byte_timeout``
and finish the whole answer within ``first_byte_timeout + read_timeout`` plus its length at
:data:`MIN_PEER_RATE` (:mod:`.deadlines`: a peer dripping bytes just inside the read timeout
is given up, not waited for). A peer that failed to connect or timed out, or whose name did
not resolve (or not inside the pool's networks), is skipped for :data:`SHUN_SECONDS`, so a
dead or stalling peer costs a job one timeout, not one per file.
Connections are kept alive per peer and reused: one :class:`~transfer.http.pool.ConnectionPool`
per peer (the stores' own HTTP/1.1 client), never given the node stager's warm sockets (those
are the stores'; a peer's name is checked against the pool's networks before each dial).
"""

from __future__ import annotations

import _socket
import hashlib
import ipaddress
import random
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Protocol, Sequence, Tuple, runtime_checkable
from urllib.parse import urlsplit

from transfer._digests import digest_of
from transfer.errors import TransferError
from transfer.http.connection import Connection, Response, Timeouts
from transfer.http.pool import ConnectionPool
from transfer.http.sockets import kernel_timeouts
from transfer.p2p.config import Network, PeerConfig
from transfer.p2p.deadlines import Deadlines
from transfer.p2p.index import Holder
from transfer.peers import PeerSink, Scope, proof

__all__ = ["FetchReport", "PROOF_HEADER", "PeerClient", "PeerFailure", "certificate_binding", "plain_binding"]

BUFFER = 1 << 20
MIN_PEER_RATE = 1 << 20  # bytes/s: a pool peer slower than this is slower than the store
SHUN_SECONDS = 60.0
MAX_IDLE_PER_PEER = 16  # kept-alive connections per peer (one per thread reading from it)
PROOF_HEADER = "X-Pcio-Proof"
_Target = Tuple[str, str, int]  # (scheme, host, port)


class PeerFailure(Exception):
    """One peer could not deliver (the message names the peer and why; ``status`` is the
    HTTP status when the peer answered with an unexpected one)."""

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.status = status


@runtime_checkable
class _HashingSink(Protocol):
    """A sink that hashes what it is given (the node cache's): no second hash is needed."""

    def hexdigest(self) -> str: ...


class _Progress:
    """Bytes of the object received so far, from however many peers, and their SHA-256
    (computed here unless the sink computes it anyway)."""

    def __init__(self, sink: PeerSink) -> None:
        self.done = 0
        self._sink = sink if isinstance(sink, _HashingSink) else None
        self._hasher = None if self._sink is not None else hashlib.sha256()

    def update(self, data: bytes) -> None:
        if self._hasher is not None:
            self._hasher.update(data)

    def hexdigest(self) -> str:
        return self._sink.hexdigest() if self._sink is not None else (
            self._hasher.hexdigest() if self._hasher is not None else "")


@dataclass
class FetchReport:
    """What one :meth:`PeerClient.fetch` did: bytes delivered (None: nothing), the failures
    met on the way, and the nodes that answered 404 (their index entries are stale)."""

    size: Optional[int] = None
    failures: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)


class PeerClient:
    """Thread-safe; one per process. ``close`` drops the kept-alive connections."""

    def __init__(self, config: PeerConfig, *, host: str = "", rng: Optional[random.Random] = None) -> None:
        self._config = config
        self._host = host or config.node
        self._rng = rng or random.Random()
        self._pools: Dict[_Target, ConnectionPool] = {}
        self._shunned: Dict[_Target, float] = {}  # target -> skipped until (monotonic)
        self._deadlines = Deadlines()
        self._lock = threading.Lock()
        self._tls = _tls_context(config.ca_file)

    def order(self, holders: Sequence[Holder]) -> List[Holder]:
        """Same host first, then same rack, then others; random among equals."""
        shuffled = list(holders)
        self._rng.shuffle(shuffled)
        rack = self._config.rack

        def rank(h: Holder) -> int:
            if h.info.host and h.info.host == self._host:
                return 0
            return 1 if rack and h.info.rack == rack else 2
        return sorted(shuffled, key=rank)

    def fetch(self, key: str, holders: Sequence[Holder], sink: PeerSink, scope: Scope) -> FetchReport:
        """Copy ``key`` from the first peers that can send it into ``sink`` (empty), proving
        to each that this reader holds ``scope`` (the scope the holders were found in).

        Never raises for a peer's failure; on any outcome but success ``sink`` is reset
        (empty). All holders share one registered (size, sha256) (the index guarantees it)."""
        report = FetchReport()
        chosen = self.order(holders)[: max(1, self._config.max_peers)]
        if not chosen:
            return report
        size, sha = chosen[0].size, chosen[0].sha256
        progress = _Progress(sink)
        capability = scope.capability(key)
        for holder in chosen:
            try:
                self._copy(holder, key, sink, progress, size, capability)
            except PeerFailure as err:
                report.failures.append(str(err))
                if err.status == 404:
                    report.missing.append(holder.info.node)
                continue
            if progress.hexdigest() == sha:
                report.size = size
                return report
            report.failures.append(f"peer {holder.info.node}: bytes do not match the registered "
                                   f"SHA-256 of {key}")
            progress = _Progress(sink)
            sink.reset()
        sink.reset()
        return report

    def close(self) -> None:
        with self._lock:
            pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.close()
        self._deadlines.close()

    # -- one peer -----------------------------------------------------------------------

    def _copy(self, holder: Holder, key: str, sink: PeerSink, progress: _Progress, size: int,
              capability: str) -> None:
        """Append bytes ``progress.done..size`` from ``holder`` (raises PeerFailure)."""
        name = holder.info.node
        target = self._target(holder)
        self._check_shunned(target, name)
        self._check_inside(target, name)
        pool, conn = self._connection(target, name)
        digest = digest_of(key)
        path = urlsplit(holder.info.url).path.rstrip("/") + "/" + digest
        headers = [("Authorization", f"Bearer {self._config.token}"),
                   (PROOF_HEADER, proof(capability, _binding(conn, target), digest))]
        if progress.done:
            headers.append(("Range", f"bytes={progress.done}-{size - 1}"))
        config = self._config
        sock = conn.live_socket
        assert sock is not None
        watch = self._deadlines.watch(sock, config.first_byte_timeout + config.read_timeout
                                      + (size - progress.done) / MIN_PEER_RATE)
        try:
            response = conn.request("GET", path, headers)
            _check_response(response, name, progress.done, size)
            _set_timeout(sock, config.read_timeout)
            _stream(response, sink, progress, size)
        except (OSError, TransferError, PeerFailure) as err:
            conn.close()
            pool.release(conn)
            late = self._deadlines.end(watch)
            if late or _timed_out(err):
                self._shun(target)
            if late:  # whatever the cut-off socket made of the answer
                raise PeerFailure(f"peer {name}: too slow (under {MIN_PEER_RATE >> 10} KiB/s)") from err
            if isinstance(err, PeerFailure):
                raise
            raise PeerFailure(f"peer {name}: {type(err).__name__}: {err}") from err
        if self._deadlines.end(watch):  # late just as the last byte came: the socket is shut
            conn.close()
        elif conn.is_open:
            _set_timeout(sock, config.first_byte_timeout)
        pool.release(conn)  # kept for the next request when open

    def _target(self, holder: Holder) -> Tuple[str, str, int]:
        parts = urlsplit(holder.info.url)
        scheme, host = parts.scheme, parts.hostname or ""
        if scheme not in ("https", "http") or not host:
            raise PeerFailure(f"peer {holder.info.node}: malformed URL {holder.info.url!r}")
        if scheme == "http" and not self._config.plain_http:
            raise PeerFailure(f"peer {holder.info.node}: plain http URL {holder.info.url!r} "
                              "refused (P2P_PLAIN_HTTP is off)")
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError as err:
            raise PeerFailure(f"peer {holder.info.node}: malformed URL {holder.info.url!r}") from err
        return scheme, host, port

    def _check_inside(self, target: Tuple[str, str, int], name: str) -> None:
        """Every address of the target's host is in the pool's networks; a host outside them, or
        whose name does not resolve (the resolver may take its whole timeout to say so: anyone
        who can write the index can name such a host), is skipped from then on like one that
        timed out."""
        _, host, port = target
        outside = _outside(host, port, self._config.networks)
        if outside:
            self._shun(target)
            raise PeerFailure(f"peer {name}: {host}:{port} is outside the pool's networks ({outside})")

    def _connection(self, target: _Target, name: str) -> Tuple[ConnectionPool, Connection]:
        """A connected connection to ``target``, leased from its pool: a kept-alive one the
        peer has not closed meanwhile, else a new one (a failed connect shuns the target)."""
        pool = self._pool(target)
        try:
            conn = pool.lease()
            assert conn is not None
            while conn.requests_sent and not _alive(conn):  # the peer closed it while idle
                conn.close()
                pool.release(conn)
                conn = pool.lease()
                assert conn is not None
        except TransferError as err:
            self._shun(target)
            _, host, port = target
            raise PeerFailure(f"peer {name}: cannot connect to {host}:{port}: {err.__cause__ or err}") from err
        return pool, conn

    def _pool(self, target: _Target) -> ConnectionPool:
        with self._lock:
            pool = self._pools.get(target)
            if pool is None:
                scheme, host, port = target
                config = self._config
                netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # IPv6 in brackets
                pool = ConnectionPool(f"{scheme}://{netloc}", max_idle=MAX_IDLE_PER_PEER, ssl_context=self._tls,
                                      timeouts=Timeouts(connect=config.connect_timeout, read=config.first_byte_timeout),
                                      warm=False)
                self._pools[target] = pool
            return pool

    def _check_shunned(self, target: Tuple[str, str, int], name: str) -> None:
        with self._lock:
            until = self._shunned.get(target, 0.0)
        if until > time.monotonic():
            raise PeerFailure(f"peer {name}: skipped, it failed recently (connect, timeout or address)")

    def _shun(self, target: Tuple[str, str, int]) -> None:
        with self._lock:
            self._shunned[target] = time.monotonic() + SHUN_SECONDS


def _alive(conn: Connection) -> bool:
    """False when an idle connection's peer has closed it: an idle keep-alive connection
    has nothing to read, so readable means EOF, a reset or junk."""
    sock = conn.live_socket
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _tls_context(ca_file: Optional[str]) -> ssl.SSLContext:
    """Trusts the pool CA only; without one, nothing (every HTTPS peer then fails its
    handshake): a certificate from a public CA proves nothing about a pool's node."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context


def certificate_binding(der: bytes) -> str:
    """What a proof is bound to over TLS: the daemon's certificate (as both sides see it)."""
    return "tls:" + hashlib.sha256(der).hexdigest()


def plain_binding(host: str, port: int) -> str:
    """What a proof is bound to over plain HTTP: the host and port the reader dialled (the
    daemon's announced ones). Anyone who can write the index can point a node's URL at a
    listener of her own; a proof it collects is then worthless at the real daemon."""
    return f"plain:{host.lower()}:{port}"


def _binding(conn: Connection, target: _Target) -> str:
    sock = conn.live_socket
    if isinstance(sock, ssl.SSLSocket):
        der = sock.getpeercert(binary_form=True)
        if der:
            return certificate_binding(der)
    return plain_binding(target[1], target[2])


def _outside(host: str, port: int, networks: Sequence[Network]) -> str:
    """"" when every address of ``host`` is in ``networks``, else the first one outside."""
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except OSError as err:
        return f"cannot resolve {host}: {err}"
    for text in sorted(addresses):
        address = ipaddress.ip_address(text.split("%", 1)[0])
        if not any(address in net for net in networks):
            return str(address)
    return ""


def _set_timeout(sock: _socket.socket, seconds: float) -> None:
    """The wait between bytes on a connection's socket, as the pool's connection sets it."""
    if isinstance(sock, ssl.SSLSocket):
        sock.settimeout(seconds)
    else:
        kernel_timeouts(sock, seconds)


def _timed_out(err: BaseException) -> bool:
    """Whether ``err`` is, or was raised from, a timeout (the connection re-labels them)."""
    cause: Optional[BaseException] = err
    while cause is not None:
        if isinstance(cause, TimeoutError):
            return True
        cause = cause.__cause__
    return False


def _check_response(response: Response, name: str, done: int, size: int) -> None:
    """Status and length as expected for bytes ``done..size`` (raises PeerFailure)."""
    expected_status = 206 if done else 200
    if response.status != expected_status:
        raise PeerFailure(f"peer {name}: {response.status} {response.reason}", response.status)
    length = response.headers.get("content-length")
    if length is None or not length.isdigit() or int(length) != size - done \
            or "chunked" in response.headers.get("transfer-encoding", "").lower():
        raise PeerFailure(f"peer {name}: response of {length} bytes where {size - done} were "
                          "expected (oversized, short or chunked)")
    if done:
        content_range = response.headers.get("content-range", "")
        if not content_range.startswith(f"bytes {done}-{size - 1}/"):
            raise PeerFailure(f"peer {name}: wrong Content-Range {content_range!r}")


def _stream(response: Response, sink: PeerSink, progress: _Progress, size: int) -> None:
    """Body into ``sink`` and the hash, counted in ``progress`` (a short body raises)."""

    def write(data: bytes) -> None:
        sink.write(data)
        progress.update(data)
        progress.done += len(data)

    while progress.done < size:
        if not response.read_part(min(BUFFER, size - progress.done), write):
            raise PeerFailure(f"body ended {size - progress.done} bytes short")
