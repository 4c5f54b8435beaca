"""The stager's warm connections: TCP connections opened ahead to the endpoints its jobs use.

A job's copy reports, when its job is done, the addresses it connected to (one line each
on a pipe to the stager, ``host port``), and the modules it imported that the stager holds
only once a job needed them (``import name``; :attr:`WarmSockets.imports`). The stager keeps
:data:`PER_ENDPOINT` connections ready to each of the :data:`MAX_ENDPOINTS` most recent,
dialled without waiting (non-blocking ``connect``; the stager never waits on the network).

The stager lends a job's copy at most :data:`PER_ENDPOINT` of them per endpoint (the oldest:
connected the longest; :mod:`transfer.http.warm` takes them there) and keeps its own
descriptor of each, then dials what it lacks to have :data:`PER_ENDPOINT` ready again. So a
job's first request does not pay the connection's round trip. Once the copy is reaped, each
socket lent to it comes back to the pool if, and only if, the kernel says it carried nothing
either way (:func:`pristine`: ``TCP_INFO`` counters and an empty receive queue, read on the
stager's own descriptor); any other is closed. The copy's word is not asked: a connection
a request went out on, handed to another job, would give that job another request's answer.
So a job that sent no request (a node-cache hit) costs no new connection, and one that used a
connection costs one; those handed out for a copy the stager could not fork come back at once. At most :data:`MAX_IDLE` come back per endpoint (the oldest extras are
closed), at most :data:`MAX_LENT` are lent at once (beyond, the stager closes its descriptor:
given, not lent). A copy never shuts a socket down (``shutdown`` would end the stager's
connection too); it only closes its descriptors.

What is shared is a TCP connection that has carried nothing: TLS, credentials and requests
are the job's own, and the stager serves one user. Connections older than
:data:`MAX_AGE_S` are closed rather than handed out or taken back (a server may have closed
them; one that did anyway is retried by the job on a fresh connection). An endpoint unused for
:data:`FORGET_S` is dropped (the sockets lent to jobs for it are closed when they come back).

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
import struct
import time
from typing import Dict, List, Optional, Sequence, Set, Tuple

Address = Tuple[str, int]

PER_ENDPOINT = 2  # ready for the next job, and lent to one at most
MAX_IDLE = 2 * PER_ENDPOINT  # kept per endpoint when lent ones come back
MAX_LENT = 256  # lent at once, all copies together (each is a descriptor the stager holds)
MAX_ENDPOINTS = 4
MAX_AGE_S = 10.0
FORGET_S = 300.0
RESOLVE_S = 30.0
MAX_REPORT = 4096  # bytes of reports read per drain
MAX_IMPORTS = 16  # module names remembered between two of the stager's looks
_MAX_HOST = 253
_NUMERIC = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV  # parsed here, never a query
# struct tcp_info (include/uapi/linux/tcp.h): the fields read and their offsets; the reply
# must reach the end of the last (tcpi_data_segs_out, Linux 4.6 on) or nothing is known.
TCP_INFO_BYTES = 160
_ESTABLISHED, _SYN_SENT = 1, 2  # tcpi_state
_UNACKED = struct.Struct("=I")  # tcpi_unacked at 24
_ACKED_RECEIVED = struct.Struct("=QQ")  # tcpi_bytes_acked, tcpi_bytes_received at 120
_NOTSENT_SEGS = struct.Struct("=IIII")  # tcpi_notsent_bytes, tcpi_min_rtt, tcpi_data_segs_in, _out at 144


class _Endpoint:
    __slots__ = ("target", "family", "sockets", "used", "resolved")

    def __init__(self, target: Tuple[object, ...], family: int) -> None:
        self.target, self.family = target, family
        self.sockets: List[Tuple[float, socket.socket]] = []
        self.used = self.resolved = time.monotonic()


_Loan = Tuple[Address, _Endpoint, float, socket.socket]  # (address, endpoint, dialled at, socket)


class WarmSockets:
    """The stager's side; single-threaded (the stager's loop; the reaper only when the loop
    is not in here), never blocks on the network (nor on a resolver: the addresses come from
    the copies)."""

    def __init__(self) -> None:
        self._endpoints: Dict[Address, _Endpoint] = {}
        self._out: List[_Loan] = []  # handed out, the copy not forked yet
        self._lent: Dict[int, List[_Loan]] = {}  # by the pid of the copy holding them
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
        """At most :data:`PER_ENDPOINT` fresh connections per endpoint, the oldest first, for
        the next job's copy; then :meth:`lend` says to whom. Idle ones too old or no longer
        :func:`pristine` (the store sent bytes or hung up while they waited) are closed.
        Endpoints unused for long are dropped."""
        self.lend(-1)  # a hand-out never lent (the caller's failure): closed
        now = time.monotonic()
        handed: Dict[Address, List[socket.socket]] = {}
        for address, endpoint in list(self._endpoints.items()):
            if now - endpoint.used > FORGET_S:
                self._close(self._endpoints.pop(address))
                continue
            fresh = []
            for made, sock in endpoint.sockets:
                if now - made <= MAX_AGE_S and pristine(sock):
                    fresh.append((made, sock))
                else:
                    sock.close()  # too old, or the store spoke or hung up: no answer to a job's request
            taken, endpoint.sockets = fresh[:PER_ENDPOINT], fresh[PER_ENDPOINT:]
            if taken:
                handed[address] = [sock for _, sock in taken]
                self._out += [(address, endpoint, made, sock) for made, sock in taken]
        return handed

    def lend(self, pid: int) -> None:
        """What :meth:`hand_out` gave is held by the copy ``pid`` now, until :meth:`give_back`
        (the stager keeps its own descriptors); -1: no copy was forked, they are closed."""
        out, self._out = self._out, []
        room = MAX_LENT - sum(len(loans) for loans in self._lent.values())
        if pid <= 0 or room < len(out):
            for *_, sock in out:
                sock.close()
        elif out:
            self._lent.setdefault(pid, []).extend(out)

    def give_back(self, pid: int) -> None:
        """The copy ``pid`` was reaped: each socket lent to it comes back to its endpoint if
        that endpoint is still the one it was dialled for, it is young enough and
        :func:`pristine`; any other is closed. An endpoint keeps its :data:`MAX_IDLE` youngest."""
        self._take_back(self._lent.pop(pid, []))

    def put_back(self) -> None:
        """No copy was forked for what :meth:`hand_out` gave (``fork`` failed): it comes back
        as from a reaped copy (:meth:`give_back`), instead of being closed by :meth:`lend`."""
        out, self._out = self._out, []
        self._take_back(out)

    def _take_back(self, loans: List[_Loan]) -> None:
        now = time.monotonic()
        back: Set[Address] = set()
        for address, endpoint, made, sock in loans:
            if self._endpoints.get(address) is endpoint and now - made <= MAX_AGE_S and pristine(sock):
                sock.setblocking(False)  # as dialled (a copy's timeouts may have made it blocking)
                endpoint.sockets.append((made, sock))
                back.add(address)
            else:
                sock.close()
        for address in back:
            endpoint = self._endpoints[address]
            endpoint.sockets.sort(key=lambda held: held[0])
            for _, sock in endpoint.sockets[:-MAX_IDLE]:
                sock.close()
            del endpoint.sockets[:-MAX_IDLE]

    def refill(self) -> None:
        """Dial (without waiting) what each endpoint lacks to have :data:`PER_ENDPOINT` ready
        (lent ones do not count)."""
        now = time.monotonic()
        for endpoint in self._endpoints.values():
            while len(endpoint.sockets) < PER_ENDPOINT:
                sock = _dial(endpoint)
                if sock is None:
                    break
                endpoint.sockets.append((now, sock))

    def idle(self) -> List[socket.socket]:
        """The sockets ready to hand out, oldest first per endpoint."""
        return [sock for endpoint in self._endpoints.values() for _, sock in endpoint.sockets]

    def held(self) -> List[socket.socket]:
        """Every socket the stager holds, ready or lent (a job's copy closes these: they are
        not its; those handed to it are not among them)."""
        return self.idle() + [loan[3] for loans in self._lent.values() for loan in loans]

    def close(self) -> None:
        """Close every socket, ready, handed out or lent, and the reports' pipe (once)."""
        if self.reports_r < 0:
            return
        self.lend(-1)
        for loans in self._lent.values():
            for *_, sock in loans:
                sock.close()
        self._lent.clear()
        for endpoint in self._endpoints.values():
            self._close(endpoint)
        self._endpoints.clear()
        for fd in (self.reports_r, self.reports_w):
            os.close(fd)
        self.reports_r = self.reports_w = -1

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


def pristine(sock: socket.socket) -> bool:
    """Whether the kernel says the connection ``sock`` (one the stager dialled) carried
    nothing either way and is still open or opening: :func:`untouched`, and nothing waiting
    to be read (no byte, no end). Any failure to tell (a closed socket) is a no."""
    try:
        if not untouched(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES)):
            return False
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True  # nothing to read
    except OSError:
        return False
    return False  # a byte, or the server's end


def untouched(info: bytes) -> bool:
    """Whether ``info``, a ``struct tcp_info`` an active opener's socket returned, says the
    connection is established (or still connecting) and no data went either way: nothing
    sent, in flight or queued, nothing received. The SYN is one byte of sequence space: once
    acknowledged it counts in ``tcpi_bytes_acked`` (1), before that in ``tcpi_unacked``. A
    reply shorter than :data:`TCP_INFO_BYTES` (an older kernel) is a no."""
    if len(info) < TCP_INFO_BYTES or info[0] not in (_ESTABLISHED, _SYN_SENT):
        return False
    syn = 1 if info[0] == _ESTABLISHED else 0  # the SYN acknowledged, else in flight
    (unacked,) = _UNACKED.unpack_from(info, 24)
    acked, received = _ACKED_RECEIVED.unpack_from(info, 120)
    notsent, _, data_in, data_out = _NOTSENT_SEGS.unpack_from(info, 144)
    return bool(acked == syn and unacked == 1 - syn and received == 0 and data_in == 0 and data_out == 0
                and notsent == 0)


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
