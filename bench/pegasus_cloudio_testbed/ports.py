"""Loopback port allocation."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    The port is found by binding to port 0 and closing the socket again, so
    another process may take it before the caller binds; callers that start
    servers should be ready to retry on "address already in use".
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
