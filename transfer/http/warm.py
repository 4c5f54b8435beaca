"""Connections opened before a process needed them: the node stager's warm sockets.

The node stager (:mod:`pegasus_cloudio.stager`) keeps a few TCP connections open to the store
endpoints its jobs used, and lends some to each job's process, which :func:`adopt`\\ s them:
the stager keeps its own descriptor of each, and takes back, once this process has ended,
those the kernel says carried nothing. So this process only ever closes its descriptors
(:func:`discard`, :func:`forget`, a connection's close), never shuts a socket down: that would
end the stager's connection too. A :class:`~transfer.http.connection.Connection` to one of those
addresses then :func:`take`\\ s a socket instead of dialling: the connection's round trip
was paid before the job began. A taken socket counts as a reused keep-alive connection, so
one the server closed meanwhile fails as :class:`~transfer.errors.StaleConnection` and the
request is sent again on a fresh connection (:mod:`transfer.http.pool`).

Only plain TCP is shared: TLS, credentials and every request are the job's own. The
addresses a process connects to are recorded (:func:`used`) so that a stager's copy can tell
the stager which to keep warm. Process-wide state, like :mod:`transfer.cache.behind`; only a
process that imported this module uses it (connections look for it in ``sys.modules``, so a
job step outside the stager neither imports nor consults it).
"""

from __future__ import annotations

import _socket

from transfer import _threads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Sequence, Set, Tuple

    Address = Tuple[str, int]

_lock = _threads.Lock()  # connections are made from the engine's worker threads
_idle: "Dict[Address, List[_socket.socket]]" = {}
_used: "Set[Address]" = set()


def adopt(address: "Address", sockets: "Sequence[_socket.socket]") -> None:
    """Hand this process connected sockets to ``address`` (host as a job's URL names it)."""
    with _lock:
        _idle.setdefault(address, []).extend(sockets)


def on_hand(address: "Address") -> int:
    """How many warm sockets to ``address`` are waiting to be taken."""
    with _lock:
        return len(_idle.get(address, ()))


def take(address: "Address") -> "_socket.socket | None":
    """A warm socket to ``address`` for a new connection, or None (then dial)."""
    with _lock:
        _used.add(address)
        found = _idle.get(address)
        return found.pop() if found else None


def forget(address: "Address") -> None:
    """Close the warm sockets to ``address`` not taken yet (one of them turned out closed)."""
    with _lock:
        sockets = _idle.pop(address, [])
    for sock in sockets:
        sock.close()


def used() -> "List[Address]":
    """Addresses this process made connections to (what a stager keeps warm for later jobs)."""
    with _lock:
        return sorted(_used)


def discard() -> None:
    """Close the sockets not taken and forget everything (a stager's copy, at its end)."""
    with _lock:
        sockets = [sock for found in _idle.values() for sock in found]
        _idle.clear()
        _used.clear()
    for sock in sockets:
        sock.close()
