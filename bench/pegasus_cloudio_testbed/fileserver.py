"""A static file server over HTTP/1.1 (keep-alive), as the HTTP sources of workflows are
served: ``GET`` and ``HEAD`` of the files under one directory, strong ETags, one-part
``Range`` (206; 416 past the end) and ``If-Match`` (412), 404 for anything else.

Started with :func:`serve_files` on 127.0.0.1 (TLS when given :class:`TlsFiles`)."""

from __future__ import annotations

import os
import re
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional, Tuple, Type

from pegasus_cloudio_testbed.certs import TlsFiles
from pegasus_cloudio_testbed.webserver import serve

__all__ = ["serve_files"]

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


class _Files(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        path = self.translate_path(self.path)
        try:
            fh = open(path, "rb")
        except OSError:
            return self._empty(404)
        with fh:
            st = os.fstat(fh.fileno())
            if not os.path.isfile(path):
                return self._empty(404)
            etag = f'"{st.st_mtime_ns:x}-{st.st_size:x}"'
            if self.headers.get("If-Match") not in (None, etag):
                return self._empty(412)
            span = self._span(st.st_size)
            if span is None:
                return self._empty(416, [("Content-Range", f"bytes */{st.st_size}")])
            first, last = span
            ranged = "Range" in self.headers
            self.send_response(206 if ranged else 200)
            self.send_header("ETag", etag)
            self.send_header("Content-Length", str(last - first + 1))
            if ranged:
                self.send_header("Content-Range", f"bytes {first}-{last}/{st.st_size}")
            self.end_headers()
            if body:
                fh.seek(first)
                _copy(fh, self.wfile, last - first + 1)

    def _span(self, size: int) -> Optional[Tuple[int, int]]:
        """(first, last) byte of the answer; None for a range that starts past the end."""
        asked = _RANGE.fullmatch(self.headers.get("Range", ""))
        if asked is None:
            return 0, size - 1
        first = int(asked.group(1))
        last = min(int(asked.group(2)) if asked.group(2) else size - 1, size - 1)
        if first >= size or last < first:
            return None
        return first, last

    def _empty(self, status: int, headers: Any = ()) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
        pass


def _copy(source: Any, sink: Any, length: int) -> None:
    while length > 0:
        block = source.read(min(length, 1 << 16))
        if not block:
            return
        sink.write(block)
        length -= len(block)


def serve_files(directory: "os.PathLike[str]", tls: Optional[TlsFiles] = None) -> ThreadingHTTPServer:
    """A started server of the files under ``directory`` on a free port of 127.0.0.1 (stop it
    with ``shutdown()`` and ``server_close()``)."""
    root = os.fspath(directory)
    handler: Type[BaseHTTPRequestHandler] = type("Files", (_Files,), {
        "__init__": lambda self, *args, **kwargs: _Files.__init__(self, *args, directory=root, **kwargs)})
    return serve(handler, tls)


