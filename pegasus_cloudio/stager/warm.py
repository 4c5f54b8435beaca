"""The stager's warm connections: TCP connections opened ahead to the endpoints its jobs use.

A job's copy reports, when its job is done, the addresses it connected to (one line each
on a pipe to the stager, ``host port``), and the modules it imported that the stager holds
only once a job needed them (``import name``; :attr:`WarmSockets.imports`). The stager keeps :data:`PER_ENDPOINT` connections
open to each of the :data:`MAX_ENDPOINTS` most recent, dialled without waiting (non-blocking
``connect``; the stager never waits on the network), and hands all it holds for an endpoint
to the next job's copy (:mod:`transfer.http.warm` takes them there), then dials again. So a
job's first request does not pay the connection's round trip.

What is shared is a TCP connection that has carried nothing: TLS, credentials and requests
are the job's own, and the stager serves one user. Connections older than
:data:`MAX_AGE_S` are closed rather than handed out (a server may have closed them; one that
did anyway is retried by the job on a fresh connection). An endpoint unused for
:data:`FORGET_S` is dropped.

The stager never looks a name up: a lookup may wait for the resolver's whole timeout (a zone
whose servers do not answer), and every job of the node's user would wait behind its loop. A
job's copy looks up, after its job has its answer, each name it used that the stager had not
looked up in the last :data:`RESOLVE_S` when the copy was forked, and reports the numeric
address it found (``host port address``, ``-`` for none; the others as ``host port``). So
connections follow a name that moved (a store's fail-over) to where the job's own dialling
would go, not to its first address for ever.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from typing import Dict, List, Optional, Sequence, Set, Tuple

Address = Tuple[str, int]

PER_ENDPOINT = 2
MAX_ENDPOINTS = 4
MAX_AGE_S = 10.0
FORGET_S = 300.0
RESOLVE_S = 30.0
MAX_REPORT = 4096  # bytes of reports read per drain
MAX_IMPORTS = 16  # module names remembered between two of the stager's looks
_MAX_HOST = 253
_NUMERIC = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV  # parsed here, never a query


class _Endpoint:
    __slots__ = ("target", "family", "sockets", "used", "resolved")

    def __init__(self, target: Tuple[object, ...], family: int) -> None:
        self.target, self.family = target, family
        self.sockets: List[Tuple[float, socket.socket]] = []
        self.used = self.resolved = time.monotonic()


class WarmSockets:
    """The stager's side; single-threaded (the stager's loop), never blocks on the network
    (nor on a resolver: the addresses come from the copies)."""

    def __init__(self) -> None:
        self._endpoints: Dict[Address, _Endpoint] = {}
        self.reports_r, self.reports_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._pending = b""
        self.imports: Set[str] = set()  # module names copies reported (the stager takes them)

    def drain_reports(self) -> None:
        """Learn the addresses copies reported since the last call (malformed lines are ignored)."""
        try:
            data = self._pending + os.read(self.reports_r, MAX_REPORT)
        except BlockingIOError:
            return
        lines = data.split(b"\n")
        self._pending = lines.pop()[-MAX_REPORT:]
        for line in lines:
            if line.startswith(b"import "):
                name = parse_import(line)
                if name is not None and len(self.imports) < MAX_IMPORTS:
                    self.imports.add(name)
                continue
            report = parse_report(line)
            if report is not None:
                self._learn(*report)
        self.refill()

    def fresh(self) -> Set[Address]:
        """The endpoints looked up less than :data:`RESOLVE_S` ago (a copy forked now looks
        up the others it uses)."""
        now = time.monotonic()
        return {address for address, endpoint in self._endpoints.items() if now - endpoint.resolved < RESOLVE_S}

    def _learn(self, address: Address, found: Optional[str]) -> None:
        """A copy used ``address``; ``found``: the numeric address it looked up for its name
        ("-": none; None: it did not look, the stager's was fresh)."""
        known = self._endpoints.get(address)
        if known is not None:
            known.used = time.monotonic()
        if found is None:
            return
        place = _numeric(found, address[1])
        if known is not None:
            if place == (known.family, known.target):
                known.resolved = time.monotonic()
                return
            self._close(self._endpoints.pop(address))  # the name moved (or no longer resolves)
        if place is None:
            return
        if len(self._endpoints) >= MAX_ENDPOINTS:
            oldest = min(self._endpoints, key=lambda a: self._endpoints[a].used)
            self._close(self._endpoints.pop(oldest))
        self._endpoints[address] = _Endpoint(place[1], place[0])

    def hand_out(self) -> Dict[Address, List[socket.socket]]:
        """The fresh connections held, for the next job's copy (the caller closes its copies
        in the stager after the fork); endpoints unused for long are dropped."""
        now = time.monotonic()
        handed: Dict[Address, List[socket.socket]] = {}
        for address, endpoint in list(self._endpoints.items()):
            if now - endpoint.used > FORGET_S:
                self._close(self._endpoints.pop(address))
                continue
            fresh = [sock for made, sock in endpoint.sockets if now - made <= MAX_AGE_S]
            for made, sock in endpoint.sockets:
                if now - made > MAX_AGE_S:
                    sock.close()
            endpoint.sockets = []
            if fresh:
                handed[address] = fresh
        return handed

    def refill(self) -> None:
        """Dial (without waiting) what each endpoint lacks."""
        now = time.monotonic()
        for endpoint in self._endpoints.values():
            while len(endpoint.sockets) < PER_ENDPOINT:
                sock = _dial(endpoint)
                if sock is None:
                    break
                endpoint.sockets.append((now, sock))

    def held(self) -> List[socket.socket]:
        """Every socket held (a job's copy closes these: they are not its)."""
        return [sock for endpoint in self._endpoints.values() for _, sock in endpoint.sockets]

    def close(self) -> None:
        for endpoint in self._endpoints.values():
            self._close(endpoint)
        self._endpoints.clear()
        for fd in (self.reports_r, self.reports_w):
            os.close(fd)

    @staticmethod
    def _close(endpoint: _Endpoint) -> None:
        for _, sock in endpoint.sockets:
            sock.close()
        endpoint.sockets = []


def parse_report(line: bytes) -> Optional[Tuple[Address, Optional[str]]]:
    """``b"host port"`` or ``b"host port address"`` as a copy writes it: ((host, port), the
    address the copy found, "-" for none, None when it did not look), or None when it is not one."""
    try:
        host, port_text, *found = line.decode("ascii").split(" ")
        port = int(port_text)
    except (UnicodeDecodeError, ValueError):
        return None
    if not host or len(host) > _MAX_HOST or not host.isprintable() or not 0 < port < 65536 or len(found) > 1:
        return None
    if found and (not found[0] or len(found[0]) > _MAX_HOST or not found[0].isprintable()):
        return None
    return (host, port), (found[0] if found else None)


def parse_import(line: bytes) -> Optional[str]:
    """The module name of ``b"import name"`` as a copy writes it, or None when it is not one."""
    try:
        word, name = line.decode("ascii").split(" ")
    except (UnicodeDecodeError, ValueError):
        return None
    if word != "import" or len(name) > 200 or not all(part.isidentifier() for part in name.split(".")):
        return None
    return name


def report(fd: int, addresses: List[Address], modules: Sequence[str] = (), look_up: bool = False) -> None:
    """A copy's report (each line one atomic write: the pipe is shared by every copy);
    ``look_up``: with the address each name has now (a lookup each: not before the job's answer)."""
    lines = [f"{host} {port}{' ' + _look_up(host, port) if look_up else ''}\n" for host, port in addresses]
    lines += [f"import {name}\n" for name in modules]
    for text in lines:
        line = text.encode("ascii", "replace")
        if len(line) <= 512:
            try:
                os.write(fd, line)
            except OSError:
                return  # the stager is not reading (pipe full): a missed warm connection only


def _look_up(host: str, port: int) -> str:
    """The first numeric address ``host`` has (as the job's dialling takes it), "-" for none."""
    try:
        return str(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError):
        return "-"


def _numeric(text: str, port: int) -> Optional[Tuple[int, Tuple[object, ...]]]:
    """(family, socket address) of a numeric address a copy reported, or None ("-", not one)."""
    try:
        family, _, _, _, target = socket.getaddrinfo(text, port, 0, socket.SOCK_STREAM, 0, _NUMERIC)[0]
    except (OSError, IndexError, UnicodeError):
        return None
    return family, target


def _dial(endpoint: _Endpoint) -> Optional[socket.socket]:
    sock = socket.socket(endpoint.family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = sock.connect_ex(endpoint.target)
    except OSError:
        sock.close()
        return None
    if err not in (0, errno.EINPROGRESS):
        sock.close()
        return None
    return sock
