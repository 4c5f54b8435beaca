"""Deadlines on whole exchanges with peers, enforced by shutting their sockets down.

A socket timeout bounds one read, not an exchange: a peer that drips a byte just inside the
timeout (headers or body) would hold a job forever, and a buffered ``readinto`` loops over
reads without returning. So each exchange is watched: past its deadline a watchdog thread
(one per :class:`Deadlines`, started on first use, polling every ``tick`` seconds) shuts the
socket down, which ends whatever read is blocked on it, and marks the exchange as late.
"""

from __future__ import annotations

import _socket
import threading
import time
from typing import Dict, Optional

__all__ = ["Deadlines", "Watch"]


class Watch:
    """One watched exchange; ``late`` once the watchdog has shut its socket down."""

    __slots__ = ("sock", "at", "late")

    def __init__(self, sock: _socket.socket, at: float) -> None:
        self.sock = sock
        self.at = at
        self.late = False


class Deadlines:
    """Thread-safe; :meth:`close` stops the watchdog."""

    def __init__(self, tick: float = 0.1) -> None:
        self._tick = tick
        self._watches: Dict[int, Watch] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def watch(self, sock: _socket.socket, seconds: float) -> Watch:
        """Shut ``sock`` down unless :meth:`end` is called within ``seconds``."""
        watch = Watch(sock, time.monotonic() + seconds)
        with self._lock:
            self._watches[id(watch)] = watch
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="p2p-deadlines", daemon=True)
                self._thread.start()
        return watch

    def end(self, watch: Watch) -> bool:
        """Stop watching (idempotent); True if the deadline had passed (the socket is shut down)."""
        with self._lock:
            self._watches.pop(id(watch), None)
            return watch.late

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            now = time.monotonic()
            with self._lock:
                late = [w for w in self._watches.values() if w.at < now]
                for w in late:
                    w.late = True
                    del self._watches[id(w)]
            for w in late:
                try:  # the plain socket's shutdown: wakes a blocked read, even inside TLS
                    _socket.socket.shutdown(w.sock, _socket.SHUT_RDWR)
                except OSError:
                    pass
