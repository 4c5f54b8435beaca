"""Faults a :class:`~pegasus_cloudio_testbed.proxy.TcpProxy` injects into chosen requests.

Each :class:`Fault` hits the next ``times`` requests that match its :class:`Match`: reset
or truncate the response after some bytes, stall it, answer with an error status
(an S3 ``SlowDown`` by default) without forwarding the request, or corrupt the request's body.
"""

from __future__ import annotations

import http
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, List, Mapping, Optional, Tuple

from pegasus_cloudio_testbed.httpframe import RequestHead

SLOW_DOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    b"<RequestId>pegasus-cloudio-proxy</RequestId><HostId>pegasus-cloudio-proxy</HostId></Error>"
)

RESET, TRUNCATE, STALL, STATUS, CORRUPT = "reset", "truncate", "stall", "status", "corrupt"


# --------------------------------------------------------------------------- faults


@dataclass(frozen=True)
class Match:
    """Which requests a fault applies to; None fields match anything.

    ``method`` is compared case-insensitively; ``path`` is a substring of the
    request target (path plus query string, as sent on the request line).
    """

    method: Optional[str] = None
    path: Optional[str] = None

    def matches(self, method: str, target: str) -> bool:
        """True if a request with this method and target is selected."""
        if self.method is not None and self.method.upper() != method.upper():
            return False
        return self.path is None or self.path in target


@dataclass(frozen=True)
class Fault:
    """One fault, hitting the next ``times`` matching requests.

    Build with the class methods; fields are:
        kind: ``reset``, ``truncate``, ``stall``, ``status`` or ``corrupt`` (a request body).
        after_bytes: response bytes forwarded before reset/truncate/stall; for corrupt, the
            offset in the request body of the byte flipped.
        seconds: stall length.
        code, body, headers: the synthetic response of a ``status`` fault.
        times: how many matching requests it hits.
        match: which requests match.
        every: hit only every ``every``-th matching request (``dataclasses.replace`` a built
            fault: ``every=7`` resets 1 request in 7); the others pass untouched.
    """

    kind: str
    after_bytes: int = 0
    seconds: float = 0.0
    code: int = 503
    body: bytes = b""
    headers: Tuple[Tuple[str, str], ...] = ()
    times: int = 1
    match: Match = field(default_factory=Match)
    every: int = 1

    @classmethod
    def reset(cls, after_bytes: int = 0, *, times: int = 1, method: Optional[str] = None,
              path: Optional[str] = None) -> "Fault":
        """After ``after_bytes`` response bytes, abort the client connection with RST."""
        return cls(RESET, after_bytes=after_bytes, times=times, match=Match(method, path))

    @classmethod
    def truncate(cls, after_bytes: int = 0, *, times: int = 1, method: Optional[str] = None,
                 path: Optional[str] = None) -> "Fault":
        """After ``after_bytes`` response bytes, close the client connection with FIN."""
        return cls(TRUNCATE, after_bytes=after_bytes, times=times, match=Match(method, path))

    @classmethod
    def stall(cls, seconds: float, after_bytes: int = 0, *, times: int = 1,
              method: Optional[str] = None, path: Optional[str] = None) -> "Fault":
        """After ``after_bytes`` response bytes, forward nothing for ``seconds``, then close."""
        return cls(STALL, after_bytes=after_bytes, seconds=seconds, times=times,
                   match=Match(method, path))

    @classmethod
    def corrupt(cls, at: int = 0, *, times: int = 1, method: Optional[str] = None,
                path: Optional[str] = None) -> "Fault":
        """Flip one bit of the request body's byte ``at`` on its way to the server (same
        length, so only a checksum of the content tells): does the store refuse it?"""
        return cls(CORRUPT, after_bytes=at, times=times, match=Match(method, path))

    @classmethod
    def status(cls, code: int = 503, body: bytes = SLOW_DOWN_BODY,
               headers: Optional[Mapping[str, str]] = None, *, times: int = 1,
               method: Optional[str] = None, path: Optional[str] = None) -> "Fault":
        """Answer the request directly with ``code`` and ``body`` (S3 SlowDown by default).

        The request is never forwarded; its body is read and dropped, and the
        connection stays usable (unless the client sent ``Expect:
        100-continue``: then it may never send the body, so the answer carries
        ``Connection: close`` and the connection is closed after it).
        """
        pairs = tuple((headers or {"Content-Type": "application/xml"}).items())
        return cls(STATUS, code=code, body=body, headers=pairs, times=times,
                   match=Match(method, path))


class FaultBook:
    """Thread-safe list of pending faults with their remaining hit counts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: List[List[Any]] = []  # [Fault, remaining, matched so far]

    def replace(self, faults: Iterable[Fault]) -> None:
        with self._lock:
            self._pending = [[f, f.times, 0] for f in faults if f.times > 0]

    def take(self, method: str, target: str) -> Optional[Fault]:
        """The first pending fault matching the request (and due: see ``every``), consuming one hit."""
        with self._lock:
            for entry in self._pending:
                if entry[0].match.matches(method, target):
                    entry[2] += 1
                    if entry[2] % max(1, entry[0].every):
                        continue
                    entry[1] -= 1
                    if entry[1] == 0:
                        self._pending.remove(entry)
                    fault: Fault = entry[0]
                    return fault
        return None

    def pending(self) -> int:
        with self._lock:
            return sum(int(entry[1]) for entry in self._pending)




def status_response(fault: Fault, head: RequestHead, close: bool) -> bytes:
    try:
        reason = http.HTTPStatus(fault.code).phrase
    except ValueError:
        reason = "Injected"
    lines = [f"HTTP/1.1 {fault.code} {reason}"]
    skip = {"content-length", "connection"}
    lines += [f"{k}: {v}" for k, v in fault.headers if k.lower() not in skip]
    lines.append(f"Content-Length: {len(fault.body)}")
    if close:
        lines.append("Connection: close")
    head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head_bytes if head.method == "HEAD" else head_bytes + fault.body


