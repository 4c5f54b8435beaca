"""Opening TCP sockets for HTTP connections: dialled at once, or ahead of need.

:func:`dial` connects and returns (``socket.create_connection`` on the C module). The others serve
connections opened before they are wanted (:meth:`transfer.http.pool.ConnectionPool.dial_ahead`,
and the node stager's warm sockets, :mod:`transfer.http.warm`): :func:`dial_ahead` starts
connects without waiting, :func:`start_handshake` starts a TLS handshake on one that is
connected, :func:`hung_up` tells one the store closed meanwhile, and :func:`connected` checks one
when a connection takes it. For a connection's plain sockets, :func:`kernel_timeouts` sets the
wait between bytes, :class:`SocketReader` reads and :func:`sendfile` sends a file's region without
copying it. Standard library only; ``select`` and ``socket`` (for TLS) are imported when first needed.
"""

from __future__ import annotations

import _socket
import io
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl
    from typing import Callable, List, Optional, Tuple

_SENDFILE_STEP = 1 << 22  # a few system calls per 4 MiB, so that progress follows a large body


def dial(address: Tuple[str, int], timeout: float) -> _socket.socket:
    """``socket.create_connection(address, timeout)`` with TCP_NODELAY, on the C module."""
    failure: Optional[OSError] = None
    host = address[0]
    name = host.encode("ascii") if host.isascii() else host  # str hosts import the idna codec
    for family, kind, proto, _, target in _socket.getaddrinfo(name, address[1], 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(target)
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            return sock
        except OSError as err:
            sock.close()
            failure = err
    raise failure or OSError("getaddrinfo returned no address")


def dial_ahead(address: Tuple[str, int], count: int) -> List[_socket.socket]:
    """Up to ``count`` sockets whose connects to ``address`` were started without waiting, for
    connections that will want them soon (each checked connected when used, :func:`connected`):
    their handshakes overlap with whatever the caller waits on meanwhile. Best effort: fewer
    (none) when the name does not resolve or a connect fails at once; those connections
    then dial as usual."""
    import errno
    host = address[0]
    try:
        family, kind, proto, _, target = _socket.getaddrinfo(
            host.encode("ascii") if host.isascii() else host, address[1], 0, _socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError):
        return []
    started: List[_socket.socket] = []
    for _ in range(count):
        try:
            sock = _socket.socket(family, kind | _socket.SOCK_NONBLOCK | _socket.SOCK_CLOEXEC, proto)
        except OSError:  # EMFILE, ENOBUFS: the connections dial when they are made, or fail then
            break
        try:
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            failed = sock.connect_ex(target) not in (0, errno.EINPROGRESS)
        except OSError:
            failed = True
        if failed:
            sock.close()
            break
        started.append(sock)
    return started


def start_handshake(sock: _socket.socket, context: ssl.SSLContext, server_hostname: str) -> _socket.socket:
    """``sock``, dialled ahead (:func:`dial_ahead`), as a TLS socket whose handshake is
    started (its first flight sent, no answer waited for) if its connect is done, else
    ``sock`` itself: the connection that takes it finishes the handshake, and connections
    taken one after another then wait on their handshakes' round trips together, not in turn.
    Never raises: a failure shows again when the handshake is finished, and that connection
    dials afresh."""
    import socket
    if handshaking(sock) or not connected(sock, 0):
        return sock
    plain = socket.socket(fileno=sock.detach())
    plain.setblocking(False)
    try:
        tls = context.wrap_socket(plain, server_hostname=server_hostname, do_handshake_on_connect=False)
    except (OSError, ValueError):
        return plain
    try:
        tls.do_handshake()
    except OSError:  # SSLWantReadError: the first flight is out
        pass
    return tls


def hung_up(sock: _socket.socket) -> bool:
    """Whether the store closed or reset ``sock``, dialled ahead and not taken yet (without
    waiting; bytes to read count as well, unless its TLS handshake was started: those are the
    store's answer to it); a socket already closed here (a TLS wrap that failed after taking
    its descriptor) is hung up too."""
    import select
    if sock.fileno() < 0:
        return True
    rdhup = getattr(select, "POLLRDHUP", 0)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | rdhup)
    events = poller.poll(0)
    ended = select.POLLERR | select.POLLHUP | rdhup | (0 if handshaking(sock) else select.POLLIN)
    return bool(events and events[0][1] & ended)


def handshaking(sock: _socket.socket) -> bool:
    """Whether ``sock`` is a TLS socket :func:`start_handshake` made."""
    return hasattr(sock, "do_handshake")


def connected(sock: _socket.socket, timeout: float) -> bool:
    """Whether ``sock``, whose connect was started without waiting (a stager's warm socket),
    is connected and has nothing to read, waiting up to ``timeout`` for the connect: a first
    send on a socket still connecting would wait for TCP's own give-up (minutes), not for any
    of our timeouts; and bytes the server sent before any request (an idle timeout's answer)
    would be read as the answer to ours, an end as a failure of it. A socket closed here is not."""
    import select
    if sock.fileno() < 0:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLOUT | select.POLLIN)
    events = poller.poll(int(timeout * 1000))
    if not events or events[0][1] & (select.POLLIN | select.POLLERR | select.POLLHUP):
        return False
    return sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR) == 0


class SocketReader(io.RawIOBase):
    """The raw stream under a plain connection's buffered reader (``socket.SocketIO``'s part)."""

    def __init__(self, sock: _socket.socket) -> None:
        super().__init__()
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: "memoryview | bytearray") -> int:  # type: ignore[override]
        try:
            return self._sock.recv_into(buffer)
        except BlockingIOError:  # the receive timeout of a blocking socket ran out
            raise TimeoutError("timed out") from None


def sendfile(sock: _socket.socket, fd: int, offset: int, length: int, timeout: float,
             moved: Callable[[int], object]) -> int:
    """``socket.sendfile`` on a plain socket: zero-copy ``os.sendfile``; a socket with a
    timeout is non-blocking underneath, so room is waited for here, up to ``timeout``, and a
    blocking one with a kernel send timeout (:func:`kernel_timeouts`) reports it as EAGAIN
    (TimeoutError here). Returns the bytes sent, each step's also given to ``moved``
    (steps of at most ``_SENDFILE_STEP``: a progress line moves while a large body goes out)."""
    import select
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLOUT)
    blocking = sock.gettimeout() is None
    sent = 0
    while sent < length:
        try:
            count = os.sendfile(sock.fileno(), fd, offset + sent, min(_SENDFILE_STEP, length - sent))
        except BlockingIOError:
            if blocking or not poller.poll(timeout * 1000):
                raise TimeoutError("timed out") from None
            continue
        if count == 0:
            break
        sent += count
        moved(count)
    return sent


def kernel_timeouts(sock: _socket.socket, seconds: float) -> None:
    """Make ``sock`` blocking with ``seconds`` as the kernel's receive and send timeouts
    (SO_RCVTIMEO, SO_SNDTIMEO): a receive or send that waits longer fails with EAGAIN, which
    the callers turn into TimeoutError. The same wait between bytes as ``settimeout``, without
    the poll() Python puts before every receive and send of a socket with a timeout (two
    system calls per request). Where the timeval layout is not known, ``settimeout``."""
    if not (sys.platform.startswith("linux") and sys.maxsize > 2 ** 32) or not 0 < seconds < 2 ** 31:
        sock.settimeout(seconds)
        return
    whole = int(seconds)
    micros = min(999_999, int((seconds - whole) * 1e6))
    timeval = whole.to_bytes(8, sys.byteorder) + micros.to_bytes(8, sys.byteorder)  # struct timeval, LP64
    sock.settimeout(None)
    sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO, timeval)
