"""HTTP/1.1 response framing: relay exactly one response from a server stream.

A front that answers some pipelined requests itself must know where each of the
server's responses ends, so that its own answers go out in request order.
`ResponseRelay.relay_one` forwards one response (interim ``1xx`` answers included)
and leaves any bytes of the next response buffered.
"""

from __future__ import annotations

from typing import Callable, Dict, Tuple

_RECV_SIZE = 128 * 1024
_MAX_HEAD = 64 * 1024

__all__ = ["ResponseRelay"]


class ResponseRelay:
    """Reads responses from ``recv`` and hands their bytes to ``send``, one at a time."""

    def __init__(self, recv: Callable[[int], bytes], send: Callable[[bytes], None]) -> None:
        self._recv, self._send = recv, send
        self._buf = bytearray()

    def relay_one(self, method: str) -> bool:
        """Relay the response to a ``method`` request; True if the connection stays usable.

        Raises EOFError if the server closes before the response is complete."""
        while True:
            status, headers, keep = self._relay_head()
            if not (100 <= status < 200) or status == 101:
                break
        if status == 101:
            self.relay_rest()
            return False
        if method == "HEAD" or status in (204, 304):
            return keep
        if headers.get("transfer-encoding", "").lower().endswith("chunked"):
            self._relay_chunked()
            return keep
        if "content-length" in headers:
            self._relay_exact(int(headers["content-length"]))
            return keep
        self.relay_rest()  # delimited by close
        return False

    def relay_rest(self) -> None:
        """Relay everything until the server closes."""
        if self._buf:
            self._send(bytes(self._buf))
            self._buf.clear()
        while True:
            data = self._recv(_RECV_SIZE)
            if not data:
                return
            self._send(data)

    def _fill(self) -> None:
        data = self._recv(_RECV_SIZE)
        if not data:
            raise EOFError("server closed mid-response")
        self._buf += data

    def _relay_head(self) -> Tuple[int, Dict[str, str], bool]:
        start = 0
        while True:
            end = self._buf.find(b"\r\n\r\n", start)
            if end >= 0:
                break
            if len(self._buf) > _MAX_HEAD:
                raise EOFError("response head too long")
            start = max(0, len(self._buf) - 3)
            self._fill()
        raw = bytes(self._buf[:end + 4])
        del self._buf[:end + 4]
        self._send(raw)
        return _parse_head(raw)

    def _relay_exact(self, size: int) -> None:
        while size > 0:
            if not self._buf:
                self._fill()
            take = min(size, len(self._buf))
            self._send(bytes(self._buf[:take]))
            del self._buf[:take]
            size -= take

    def _line(self) -> bytes:
        while True:
            end = self._buf.find(b"\r\n")
            if end >= 0:
                line = bytes(self._buf[:end + 2])
                del self._buf[:end + 2]
                self._send(line)
                return line
            if len(self._buf) > _MAX_HEAD:
                raise EOFError("chunk line too long")
            self._fill()

    def _relay_chunked(self) -> None:
        while True:
            size = int(self._line().split(b";", 1)[0].strip(), 16)
            if size == 0:
                while self._line() != b"\r\n":  # trailers, then the blank line
                    pass
                return
            self._relay_exact(size + 2)


def _parse_head(raw: bytes) -> Tuple[int, Dict[str, str], bool]:
    """(status, lower-cased headers, whether the connection persists)."""
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    try:
        status = int(rest[:3])
    except ValueError:
        raise EOFError(f"not an HTTP response: {lines[0][:80]!r}") from None
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    tokens = headers.get("connection", "").lower()
    keep = "close" not in tokens and (version != "HTTP/1.0" or "keep-alive" in tokens)
    return status, headers, keep
