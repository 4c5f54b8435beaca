"""The drop-in's side of the node stager: hand this process's job to the stager.

:func:`hand_off` is called before the drop-in imports anything heavy. It returns the exit
code of the job the stager ran, or None when no stager took the job (nothing was run: the
caller runs it in-process). Only a stager running as this user is used (``SO_PEERCRED``).
SIGTERM, SIGINT and SIGHUP received while the stager runs the job are passed on to the
process running it, so HTCondor's eviction works as without the stager.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~3 ms per job

from pegasus_cloudio.stager import wire

if TYPE_CHECKING:
    from typing import Any, Mapping, Optional, Sequence

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def hand_off(path: str, argv: "Sequence[str]", env: "Mapping[str, str]") -> "Optional[int]":
    """Run ``argv`` in the stager at ``path``; None if it cannot take the job (one warning)."""
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
    except OSError as err:
        _warn(f"node stager {path} ({wire.ENV_VAR}) not reachable ({err.strerror or err}); "
              "transferring in this process")
        return None
    with sock:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
        peer_uid = int.from_bytes(creds[4:8], sys.byteorder)
        if peer_uid != os.getuid():
            _warn(f"node stager {path} runs as uid {peer_uid}, not as this user; transferring in this process")
            return None
        umask = os.umask(0o22)
        os.umask(umask)
        request = wire.encode_request(os.getcwd(), umask, argv, env)
        try:
            socket.send_fds(sock, [wire.length(len(request))], [0, 1, 2])
            sock.sendall(request)
            started = wire.read_reply(sock)
        except OSError as err:
            started, reason = None, err.strerror or str(err)
        else:
            reason = "it closed the connection"
        if started is None or started[0] != wire.PID:
            _warn(f"node stager {path} did not take the job ({reason}); transferring in this process")
            return None
        return _wait(sock, started[1])


def _wait(sock: socket.socket, pid: int) -> int:
    forwarded = []

    def forward(signum: int, frame: "Any") -> None:
        forwarded.append(signum)
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        done = wire.read_reply(sock)
    except OSError:
        done = None
    if done is not None and done[0] == wire.EXIT:
        return done[1]
    if not forwarded:
        _warn(f"the node stager's process {pid} ended without an exit status")
    return 1


def _warn(message: str) -> None:
    sys.stderr.write(f"pegasus-transfer: {message}\n")
    sys.stderr.flush()
