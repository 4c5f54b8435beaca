"""Thread-safe traffic counters of a proxy: connections, requests, bytes, faults."""

from __future__ import annotations

import threading
from typing import Any, Dict

class Counters:
    """Traffic counters shared by all connection threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.connections = 0
            self.requests = 0
            self.by_method: Dict[str, int] = {}
            self.bytes_up = 0
            self.bytes_down = 0
            self.faults = 0

    def add_connection(self) -> None:
        with self._lock:
            self.connections += 1

    def add_request(self, method: str) -> None:
        with self._lock:
            self.requests += 1
            self.by_method[method] = self.by_method.get(method, 0) + 1

    def add_fault(self) -> None:
        with self._lock:
            self.faults += 1

    def add_up(self, n: int) -> None:
        with self._lock:
            self.bytes_up += n

    def add_down(self, n: int) -> None:
        with self._lock:
            self.bytes_down += n

    def snapshot(self) -> Dict[str, Any]:
        with self._lock:
            return {
                "connections": self.connections,
                "requests": self.requests,
                "requests_by_method": dict(self.by_method),
                "bytes_up": self.bytes_up,
                "bytes_down": self.bytes_down,
                "faults_triggered": self.faults,
            }


