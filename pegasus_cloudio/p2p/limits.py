"""Bounds on the cache daemon's connections: how many, from whom, and for how long.

An unauthenticated client must not be able to pin the daemon's threads or memory. Every
accepted connection takes a slot (at most ``max_connections`` in all and
``max_per_address`` from one address; beyond that it is closed at once, without a thread)
and gets a deadline: ``handshake_seconds`` for the TLS handshake and its first request,
``idle_seconds`` from the end of one response to the end of the next request's headers.
While a response is being sent there is no deadline (each send has its own timeout). A
watchdog thread shuts down the socket of a connection past its deadline, which ends a
handshake or header read dripping one byte at a time, however slow each byte is.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Dict, Optional

from transfer.lean import record

__all__ = ["ConnectionLimits", "Connections", "Slot"]


@record(frozen=True)
class ConnectionLimits:
    max_connections: int = 256
    max_per_address: int = 64  # one node: several jobs, each with its threads' kept-alive connections
    handshake_seconds: float = 5.0
    idle_seconds: float = 30.0
    send_seconds: float = 30.0


class Slot:
    """One admitted connection's deadline (None: none while a response is sent)."""

    __slots__ = ("sock", "address", "deadline")

    def __init__(self, sock: socket.socket, address: str, deadline: float) -> None:
        self.sock = sock
        self.address = address
        self.deadline: Optional[float] = deadline

    def expire_in(self, seconds: Optional[float]) -> None:
        self.deadline = None if seconds is None else time.monotonic() + seconds


class Connections:
    """Admission and deadlines for one server; thread-safe. ``refused`` counts the
    connections closed at admission, ``peak`` the most open at once."""

    def __init__(self, limits: ConnectionLimits, tick: float = 0.25) -> None:
        self.limits = limits
        self.refused = 0
        self.peak = 0
        self._slots: Dict[int, Slot] = {}
        self._per_address: Dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tick = tick
        self._watchdog = threading.Thread(target=self._watch, name="p2p-deadlines", daemon=True)
        self._watchdog.start()

    def admit(self, sock: socket.socket, address: str) -> Optional[Slot]:
        """A slot for a new connection, or None (over a limit: the caller closes it)."""
        with self._lock:
            held = self._per_address.get(address, 0)
            if len(self._slots) >= self.limits.max_connections or held >= self.limits.max_per_address:
                self.refused += 1
                return None
            slot = Slot(sock, address, time.monotonic() + self.limits.handshake_seconds)
            self._slots[id(slot)] = slot
            self._per_address[address] = held + 1
            self.peak = max(self.peak, len(self._slots))
            return slot

    def release(self, slot: Slot) -> None:
        with self._lock:
            if self._slots.pop(id(slot), None) is None:
                return
            left = self._per_address[slot.address] - 1
            if left:
                self._per_address[slot.address] = left
            else:
                del self._per_address[slot.address]

    def open_count(self) -> int:
        with self._lock:
            return len(self._slots)

    def close(self) -> None:
        self._stop.set()
        self._watchdog.join()

    def _watch(self) -> None:
        while not self._stop.wait(self._tick):
            now = time.monotonic()
            with self._lock:
                late = [s for s in self._slots.values() if s.deadline is not None and s.deadline < now]
            for slot in late:
                slot.deadline = None
                try:  # the plain socket's shutdown: wakes a blocked read, even inside TLS
                    socket.socket.shutdown(slot.sock, socket.SHUT_RDWR)
                except OSError:
                    pass
