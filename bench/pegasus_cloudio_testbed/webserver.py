"""A ``http.server`` handler served on 127.0.0.1 (TLS with a :func:`~pegasus_cloudio_testbed.certs.make_tls_files`
certificate when ``tls`` is given), on a thread of its own."""

from __future__ import annotations

import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional, Type

from pegasus_cloudio_testbed.certs import TlsFiles

__all__ = ["serve"]


def serve(handler: Type[BaseHTTPRequestHandler], tls: Optional[TlsFiles] = None) -> ThreadingHTTPServer:
    """A started server on a free port (``server.server_address[1]``); stop it with
    ``server.shutdown()`` and ``server.server_close()``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls.cert), str(tls.key))
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
