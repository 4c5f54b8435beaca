"""Opening TCP sockets for HTTP connections: dialled at once, or ahead of need.

:func:`dial` connects and returns (``socket.create_connection`` on the C module). The others serve
connections opened before they are wanted (:meth:`transfer.http.pool.ConnectionPool.dial_ahead`,
and the node stager's warm sockets, :mod:`transfer.http.warm`): :func:`dial_ahead` starts
connects without waiting, :func:`start_handshake` starts a TLS handshake on one that is
connected, :func:`hung_up` tells one the store closed meanwhile, and :func:`connected` checks one
when a connection takes it. Standard library only; ``select`` and ``socket`` (for TLS) are
imported when first needed.
"""

from __future__ import annotations

import _socket

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl
    from typing import List, Optional, Tuple


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
