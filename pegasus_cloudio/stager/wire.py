"""Framing between the drop-in (client) and the node stager, over a Unix stream socket.

Request (client -> stager): one ``sendmsg`` carrying the client's stdin, stdout and stderr
as ``SCM_RIGHTS`` and a 4-byte big-endian length, then that many bytes of JSON
``{"v": 1, "argv": [...], "cwd": str, "env": {...}, "umask": int}``.

Replies (stager -> client), 5 bytes each: ``P`` + pid of the process running the request
(first), ``X`` + its exit code (last). The connection closing without ``X`` means that
process died; the client then exits 1. The client closing the connection means the job is
gone (SIGKILL from HTCondor): the stager's process then stops as on SIGTERM.

Standard library only, and cheap to import: the client imports it on every job.
"""

from __future__ import annotations

import socket
import struct
from typing import Optional, Tuple

ENV_VAR = "PEGASUS_CLOUDIO_STAGER"
VERSION = 1
MAX_REQUEST = 16 * 1024 * 1024
LENGTH = struct.Struct("!I")
REPLY = struct.Struct("!ci")
PID, EXIT = b"P", b"X"


def reply(kind: bytes, value: int) -> bytes:
    return REPLY.pack(kind, value)


def read_reply(sock: socket.socket) -> Optional[Tuple[bytes, int]]:
    """The next reply, or None when the connection closed first."""
    data = b""
    while len(data) < REPLY.size:
        chunk = sock.recv(REPLY.size - len(data))
        if not chunk:
            return None
        data += chunk
    kind, value = REPLY.unpack(data)
    return kind, value

