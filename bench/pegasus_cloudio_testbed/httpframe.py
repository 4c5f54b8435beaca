"""HTTP/1.1 request framing for the proxy: find request heads in a client byte stream.

Bodies (Content-Length or chunked) are skipped, never parsed as requests; a stream that does
not look like HTTP switches the framer to raw relaying.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

_MAX_LINE = 64 * 1024            # longest request head / chunk-size line we parse

# --------------------------------------------------------------------------- HTTP framing


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    content_length: int
    chunked: bool
    expect_continue: bool


_HEAD, _BODY, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _RAW = range(6)
_TOKEN_START = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ\r\n")


class RequestFramer:
    """Splits a client-to-server byte stream into HTTP/1.1 requests.

    `feed` returns the bytes to forward. For each complete request head it
    calls ``on_head(head)``; a False answer swallows that request (head and
    body). Head bytes are held back until the head is complete, so a swallowed
    request never leaks upstream. Anything unparseable switches the framer to
    raw relaying for the rest of the connection.
    """

    def __init__(self, on_head: Callable[[RequestHead], bool]) -> None:
        self._on_head = on_head
        self._state = _HEAD
        self._buf = bytearray()
        self._left = 0      # body bytes left (_BODY) or chunk bytes + CRLF left (_CHUNK_DATA)
        self._keep = True   # forward the current request's bytes
        self.flip: Optional[int] = None  # set by on_head: XOR the body byte at this offset with 1

    @property
    def raw(self) -> bool:
        """True once the stream stopped looking like HTTP and is relayed as bytes."""
        return self._state == _RAW

    def feed(self, data: bytes) -> bytes:
        """Consume ``data``; return what should be sent upstream."""
        state = self._state
        if state == _BODY and len(data) < self._left and self.flip is None:  # fast path: inside a body
            self._left -= len(data)
            return data if self._keep else b""
        if state == _RAW:
            return data
        out: List[bytes] = []
        pos = 0
        while pos < len(data):
            pos = self._step(data, pos, out)
        return b"".join(out)

    def _step(self, data: bytes, pos: int, out: List[bytes]) -> int:
        state = self._state
        if state == _HEAD:
            return self._step_head(data, pos, out)
        if state == _RAW:
            out.append(data[pos:])
            return len(data)
        if state in (_BODY, _CHUNK_DATA):
            n = min(self._left, len(data) - pos)
            self._emit(data[pos:pos + n], out)
            self._left -= n
            if self._left == 0:
                self._state = _HEAD if state == _BODY else _CHUNK_SIZE
            return pos + n
        return self._step_line(data, pos, out)

    def _emit(self, chunk: bytes, out: List[bytes]) -> None:
        if self._keep and chunk:
            if self.flip is not None:
                chunk = self._flipped(chunk, self.flip)
            out.append(chunk)

    def _flipped(self, chunk: bytes, at: int) -> bytes:
        """``chunk`` with its byte ``at`` flipped, if it has one (else ``flip`` moves on)."""
        if at >= len(chunk):
            self.flip = at - len(chunk)
            return chunk
        self.flip = None
        return chunk[:at] + bytes([chunk[at] ^ 1]) + chunk[at + 1:]

    def _step_head(self, data: bytes, pos: int, out: List[bytes]) -> int:
        before = len(self._buf)
        self._buf += data[pos:]
        if self._buf[0] not in _TOKEN_START:
            return self._go_raw(out, len(data))
        end = self._buf.find(b"\r\n\r\n", max(0, before - 3))
        if end < 0:
            return len(data) if len(self._buf) <= _MAX_LINE else self._go_raw(out, len(data))
        raw = bytes(self._buf[:end + 4])
        self._buf.clear()
        head = _parse_head(raw)
        if head is None:
            out.append(raw)
            self._state = _RAW
        else:
            self._start_request(head, raw, out)
        return pos + (end + 4 - before)

    def _go_raw(self, out: List[bytes], consumed: int) -> int:
        out.append(bytes(self._buf))
        self._buf.clear()
        self._state = _RAW
        return consumed

    def _start_request(self, head: RequestHead, raw: bytes, out: List[bytes]) -> None:
        self.flip = None
        self._keep = self._on_head(head)
        flip, self.flip = self.flip, None
        self._emit(raw, out)
        self.flip = flip  # the body's bytes, never the head's
        if head.chunked:
            self._state = _CHUNK_SIZE
        elif head.content_length > 0:
            self._state, self._left = _BODY, head.content_length
        else:
            self._state = _HEAD

    def _step_line(self, data: bytes, pos: int, out: List[bytes]) -> int:
        """Chunk-size lines and trailer lines; forwarded as they arrive."""
        newline = data.find(b"\n", pos)
        stop = len(data) if newline < 0 else newline + 1
        self._emit(data[pos:stop], out)
        self._buf += data[pos:stop]
        if newline < 0:
            if len(self._buf) > _MAX_LINE:
                self._buf.clear()
                self._state = _RAW
            return stop
        line = bytes(self._buf).strip()
        self._buf.clear()
        if self._state == _TRAILER:
            if not line:
                self._state = _HEAD
            return stop
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            self._state = _RAW
            return stop
        if size == 0:
            self._state = _TRAILER
        else:
            self._state, self._left = _CHUNK_DATA, size + 2
        return stop


def _parse_head(raw: bytes) -> Optional[RequestHead]:
    """Parse a request head; None if it is not an HTTP/1.x request."""
    lines = raw.lstrip(b"\r\n").split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return None
    headers: Dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    try:
        length = int(headers.get(b"content-length", b"0"))
    except ValueError:
        return None
    return RequestHead(
        method=parts[0].decode("latin-1"),
        target=parts[1].decode("latin-1"),
        content_length=length,
        chunked=headers.get(b"transfer-encoding", b"").lower().endswith(b"chunked"),
        expect_continue=headers.get(b"expect", b"").lower() == b"100-continue",
    )


