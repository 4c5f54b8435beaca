"""How a proxy connection sends bytes on: directly, or shaped like a WAN link.

`Shaping` describes the link: a one-way delay, random jitter on top of it, and a bandwidth
cap per direction. A shaped link time-stamps each chunk and a sender thread delivers it when
due, so latency is added without limiting throughput (unless a rate cap is asked for).
Jitter never reorders bytes: a chunk is never due before the one queued ahead of it.
"""

from __future__ import annotations

import collections
import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Deque, Optional, Tuple, Union

_MAX_QUEUED = 32 * 1024 * 1024   # bytes buffered per direction by a delayed link


_Item = Union[bytes, Callable[[], None], None]


@dataclass(frozen=True)
class Shaping:
    """A emulated network path, applied to each direction of each connection.

    Fields:
        delay_ms: one-way delay added to every chunk (the round trip is twice this), plus
            one round trip before a new connection is relayed (the TCP handshake).
        jitter_ms: each chunk waits a further uniform random 0..jitter_ms (order is kept).
        rate_bps: bandwidth cap per direction in bytes per second; 0 means unlimited.
    """

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    rate_bps: float = 0.0

    def __post_init__(self) -> None:
        if min(self.delay_ms, self.jitter_ms, self.rate_bps) < 0:
            raise ValueError(f"shaping values must not be negative: {self}")

    @classmethod
    def rtt(cls, rtt_ms: float, *, jitter_ms: float = 0.0, rate_bps: float = 0.0) -> "Shaping":
        """The shaping of a path with round trip ``rtt_ms`` (half of it each way)."""
        return cls(rtt_ms / 2.0, jitter_ms, rate_bps)

    @property
    def active(self) -> bool:
        """False when the path is plain loopback (bytes are relayed directly)."""
        return bool(self.delay_ms or self.jitter_ms or self.rate_bps)

    def describe(self) -> str:
        """``rtt 20 ms, jitter 2 ms, 100 MB/s``: for benchmark tables."""
        parts = [f"rtt {2 * self.delay_ms:g} ms"]
        if self.jitter_ms:
            parts.append(f"jitter {self.jitter_ms:g} ms")
        if self.rate_bps:
            parts.append(f"{self.rate_bps / 1e6:g} MB/s")
        return ", ".join(parts)


class _Clock:
    """Due times of one direction: delay + jitter after the chunk leaves a rate-capped wire."""

    def __init__(self, shaping: Shaping, rng: Optional[random.Random] = None) -> None:
        self._delay = shaping.delay_ms / 1000.0
        self._jitter = shaping.jitter_ms / 1000.0
        self._rate = shaping.rate_bps
        self._rng = rng or random.Random()
        self._wire_free = 0.0
        self._last_due = 0.0

    def due(self, now: float, size: int) -> float:
        sent = now
        if self._rate:
            sent = max(now, self._wire_free) + size / self._rate
            self._wire_free = sent
        due = sent + self._delay + (self._rng.uniform(0.0, self._jitter) if self._jitter else 0.0)
        self._last_due = max(due, self._last_due)
        return self._last_due


class DirectLink:
    """Delivers bytes to a socket immediately; actions run in the caller's thread."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()  # the client side is written by both readers

    def send(self, data: bytes) -> None:
        with self._lock:
            self._sock.sendall(data)

    def call(self, action: Callable[[], None]) -> None:
        action()

    def finish(self) -> None:
        """No more items will follow."""

    def close(self) -> None:
        """Drop anything pending (nothing is ever pending here)."""


class DelayedLink:
    """Delivers bytes and actions to a socket when `Shaping` says they arrive.

    A sender thread (started by the owner via ``spawn``) sleeps until each item
    is due and coalesces data that is due together into one send. Queued bytes
    are capped at ``_MAX_QUEUED`` so a slow receiver still pushes back.
    """

    def __init__(self, sock: socket.socket, shaping: Shaping,
                 spawn: Callable[[Callable[[], None], str], None], name: str) -> None:
        self._sock = sock
        self._clock = _Clock(shaping)
        self._cv = threading.Condition()
        self._queue: Deque[Tuple[float, _Item]] = collections.deque()
        self._queued = 0
        self._closed = False
        spawn(self._run, name)

    def send(self, data: bytes) -> None:
        with self._cv:
            while self._queued > _MAX_QUEUED and not self._closed:
                self._cv.wait()
            self._put(data, len(data))
            self._queued += len(data)

    def call(self, action: Callable[[], None]) -> None:
        with self._cv:
            self._put(action)

    def finish(self) -> None:
        with self._cv:
            self._put(None)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._queue.clear()
            self._cv.notify_all()

    def _put(self, item: _Item, size: int = 0) -> None:
        if not self._closed:
            self._queue.append((self._clock.due(time.monotonic(), size), item))
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            item = self._next_due()
            if item is None:
                return
            if callable(item):
                item()
                continue
            self._sock.sendall(item)
            with self._cv:
                self._queued -= len(item)
                self._cv.notify_all()

    def _next_due(self) -> _Item:
        """Wait for the next item and its due time; None when finished or closed."""
        with self._cv:
            while not self._queue and not self._closed:
                self._cv.wait()
            if self._closed:
                return None
            due, item = self._queue.popleft()
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        if not isinstance(item, bytes):
            return item
        return self._coalesce(item)

    def _coalesce(self, first: bytes) -> bytes:
        parts = [first]
        now = time.monotonic()
        with self._cv:
            while self._queue and self._queue[0][0] <= now and isinstance(self._queue[0][1], bytes):
                parts.append(self._queue.popleft()[1])  # type: ignore[arg-type]
        return parts[0] if len(parts) == 1 else b"".join(parts)


Link = Union[DirectLink, DelayedLink]
