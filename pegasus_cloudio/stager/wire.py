"""Framing between the drop-in (client) and the node stager, over a Unix stream socket.

Request (client -> stager): one ``sendmsg`` carrying :data:`DESCRIPTORS` descriptors as
``SCM_RIGHTS``, the client's stdin, stdout, stderr and its working directory (``open(".",
O_PATH | O_DIRECTORY)``), and a 4-byte big-endian length, then that many bytes: NUL-separated
fields ``v1``, working directory, umask (decimal), argument count, the arguments, then one
``NAME=value`` field per environment variable (file-system encoding; none of these can hold
a NUL). The job runs in the directory the descriptor names; the path is only for messages
(another user may rename a directory on it, and the client's ``/proc/<pid>/cwd`` is another
process's once the client is gone and its pid reused). The stager refuses a request with
only the three streams (a client older than the descriptor: a native client built apart from
this package, another installation's) or whose fourth descriptor is not a directory; a
stager older than the descriptor takes the first three and drops the fourth.

Replies (stager -> client), 5 bytes each: ``P`` + pid of the process running the request
(first), ``X`` + its exit code (last), as signed big-endian integers. Or, instead of ``P``,
``R`` + a length, then that many bytes of UTF-8: the stager refuses the job and says why
(the client runs it itself). The connection closing
without ``X`` means that process died; the client then exits 1. The client closing the
connection means the job is gone (SIGKILL from HTCondor): the stager's process then stops as
on SIGTERM.

Standard library only and cheap to import (no json, no socket, no typing at run time): the client
imports it on every job. ``native/pegasus_cloudio_transfer.c``, the installed command's native
client, writes and reads the same bytes (its MAX_REQUEST and MAX_REASON are these): a change
here is a change there.
"""

from __future__ import annotations

import os
TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~3 ms per job

if TYPE_CHECKING:
    import _socket
    from typing import Dict, List, Mapping, Optional, Sequence, Tuple

ENV_VAR = "PEGASUS_CLOUDIO_STAGER"
VERSION = b"v1"
MAX_REQUEST = 16 * 1024 * 1024
LENGTH_BYTES = 4
DESCRIPTORS = 4  # stdin, stdout, stderr, the working directory
REPLY_BYTES = 5
PID, EXIT, REFUSED = b"P", b"X", b"R"
MAX_REASON = 1024


def encode_request(cwd: str, umask: int, argv: "Sequence[str]", env: "Mapping[str, str]") -> bytes:
    fields = [VERSION, os.fsencode(cwd), b"%d" % umask, b"%d" % len(argv), *map(os.fsencode, argv),
              *(os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items())]
    return b"\0".join(fields)


def decode_request(data: bytes) -> "Optional[Tuple[str, int, List[str], Dict[str, str]]]":
    """(cwd, umask, argv, env), or None when ``data`` is not a request of this version."""
    found = decode_request_bytes(data)
    if found is None:
        return None
    cwd, umask, argv, env = found
    return cwd, umask, argv, {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}


def decode_request_bytes(data: bytes) -> "Optional[Tuple[str, int, List[str], Dict[bytes, bytes]]]":
    """:func:`decode_request` with the environment as bytes, as ``os.environb`` takes it (the
    stager's copy sets it without decoding and encoding again every variable)."""
    fields = data.split(b"\0")
    try:
        if fields[0] != VERSION:
            return None
        umask, argc = int(fields[2]), int(fields[3])
        argv = [os.fsdecode(a) for a in fields[4:4 + argc]]
        pairs = [f.split(b"=", 1) for f in fields[4 + argc:]]
        if len(argv) != argc or any(len(p) != 2 or not p[0] for p in pairs) or not 0 <= umask <= 0o777:
            return None
        return os.fsdecode(fields[1]), umask, argv, {k: v for k, v in pairs}
    except (IndexError, ValueError):
        return None


def length(size: int) -> bytes:
    return size.to_bytes(LENGTH_BYTES, "big")


def reply(kind: bytes, value: int) -> bytes:
    return kind + value.to_bytes(REPLY_BYTES - 1, "big", signed=True)


def refusal(why: str) -> bytes:
    text = why.encode("utf-8", "replace")[:MAX_REASON]
    return reply(REFUSED, len(text)) + text


def read_reason(sock: "_socket.socket", size: int) -> str:
    """The text of a refusal of ``size`` bytes (what arrives of it)."""
    data = b""
    while len(data) < min(size, MAX_REASON):
        chunk = sock.recv(min(size, MAX_REASON) - len(data))
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace")


def read_reply(sock: "_socket.socket") -> "Optional[Tuple[bytes, int]]":
    """The next reply, or None when the connection closed first."""
    data = b""
    while len(data) < REPLY_BYTES:
        chunk = sock.recv(REPLY_BYTES - len(data))
        if not chunk:
            return None
        data += chunk
    return data[:1], int.from_bytes(data[1:], "big", signed=True)
