"""How a proxy connection sends bytes on: directly, or after a fixed one-way delay.

A delayed link time-stamps each chunk and a sender thread delivers it when due, so latency
is added without limiting throughput.
"""

from __future__ import annotations

import collections
import socket
import threading
import time
from typing import Callable, Deque, Tuple, Union

_MAX_QUEUED = 32 * 1024 * 1024   # bytes buffered per direction by a delayed link


_Item = Union[bytes, Callable[[], None], None]


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
    """Delivers bytes and actions to a socket ``delay`` seconds after they are queued.

    A sender thread (started by the owner via ``spawn``) sleeps until each item
    is due and coalesces data that is due together into one send. Queued bytes
    are capped at ``_MAX_QUEUED`` so a slow receiver still pushes back.
    """

    def __init__(self, sock: socket.socket, delay: float,
                 spawn: Callable[[Callable[[], None], str], None], name: str) -> None:
        self._sock = sock
        self._delay = delay
        self._cv = threading.Condition()
        self._queue: Deque[Tuple[float, _Item]] = collections.deque()
        self._queued = 0
        self._closed = False
        spawn(self._run, name)

    def send(self, data: bytes) -> None:
        with self._cv:
            while self._queued > _MAX_QUEUED and not self._closed:
                self._cv.wait()
            self._put(data)
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

    def _put(self, item: _Item) -> None:
        if not self._closed:
            self._queue.append((time.monotonic() + self._delay, item))
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
