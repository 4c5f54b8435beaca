"""The drop-in's side of the node stager: hand this process's job to the stager.

:func:`hand_off` is called before the drop-in imports anything heavy. It returns the exit
code of the job the stager ran, or None when no stager took the job (nothing was run: the
caller runs it in-process). Only a stager running as this user is used (``SO_PEERCRED``).
SIGTERM, SIGINT and SIGHUP received while the stager runs the job are passed on to the
process running it, so HTCondor's eviction works as without the stager; the caller's own
handlers are back once the job has ended.

The installed ``pegasus-cloudio-transfer`` does the same in C (``native/pegasus_cloudio_transfer.c``)
when the environment names the stager; this module serves the Python drop-in (a stager named
in the config file, a wheel built without a C compiler). Their warnings and exit codes are
the same (``tests/test_native_front_end.py``): change both together.

Every job step pays this module's imports, so it uses the C modules ``_socket`` and
``_signal`` directly: ``socket`` and ``signal`` would add ``enum``, ``selectors`` and
``functools`` (about 5 ms of CPU per step on a 2-core VM).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module behind signal; no stub
import _socket
import os
import sys
TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~3 ms per job

from pegasus_cloudio.stager import wire

if TYPE_CHECKING:
    from typing import Any, Mapping, Optional, Sequence

FORWARDED = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)
_UCRED_BYTES = 12  # struct ucred: pid, uid, gid


def hand_off(path: str, argv: "Sequence[str]", env: "Mapping[str, str]") -> "Optional[int]":
    """Run ``argv`` in the stager at ``path``; None if it cannot take the job (one warning)."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            sock.connect(path)
        except OSError as err:
            _warn(f"node stager {path} ({wire.ENV_VAR}) not reachable ({err.strerror or err}); "
                  "transferring in this process")
            return None
        creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _UCRED_BYTES)
        peer_uid = int.from_bytes(creds[4:8], sys.byteorder)
        if peer_uid != os.getuid():
            _warn(f"node stager {path} runs as uid {peer_uid}, not as this user; transferring in this process")
            return None
        umask = os.umask(0o22)
        os.umask(umask)
        request = wire.encode_request(os.getcwd(), umask, argv, env)
        if len(request) > wire.MAX_REQUEST:  # the stager would refuse it after reading the header
            _warn(f"node stager {path} did not take the job (a request of {len(request)} bytes, over "
                  f"{wire.MAX_REQUEST}); transferring in this process")
            return None
        try:
            _send(sock, request)
            started = wire.read_reply(sock)
        except OSError as err:
            started, reason = None, err.strerror or str(err)
        else:
            reason = "it closed the connection"
        if started is not None and started[0] == wire.REFUSED:
            _warn(f"node stager {path} refused the job: {wire.read_reason(sock, started[1])}; "
                  "transferring in this process")
            return None
        if started is None or started[0] != wire.PID:
            _warn(f"node stager {path} did not take the job ({reason}); transferring in this process")
            return None
        return _wait(sock, started[1])
    finally:
        sock.close()


def _send(sock: "_socket.socket", request: bytes) -> None:
    """Send ``request``: its length with this process's streams and working directory as
    descriptors (:mod:`.wire`) in one message, then its bytes; OSError if that fails."""
    here = _above_streams(os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))  # O_PATH: no read right needed
    try:
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2, here))  # an array of C ints
        sock.sendmsg([wire.length(len(request))], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
    finally:
        os.close(here)
    sock.sendall(request)


def _above_streams(fd: int) -> int:
    """``fd`` moved to 3 or above (the low one closed). Open in place of a closed stdin, stdout
    or stderr, it would go out as that stream too; above them, the closed stream fails the send
    with EBADF and the job runs in this process, as it did before the directory was sent."""
    if fd >= 3:
        return fd
    import fcntl  # only here: every job step pays this module's imports
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def _wait(sock: "_socket.socket", pid: int) -> int:
    forwarded = []

    def forward(signum: int, frame: "Any") -> None:
        forwarded.append(signum)
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    previous = {signum: _signal.signal(signum, forward) for signum in FORWARDED}
    try:
        done = wire.read_reply(sock)
    except OSError:
        done = None
    finally:
        _restore(previous)
    if done is not None and done[0] == wire.EXIT:
        return done[1]
    if not forwarded:
        _warn(f"the node stager's process {pid} ended without an exit status")
    return 1


def _restore(previous: "Mapping[int, Any]") -> None:
    """Put back the handlers the forwarders replaced (a library caller's own), so no signal
    goes to the job's process once it has ended (its pid may be another process's by then).
    A handler not set from Python (None) cannot be put back: the default takes its place."""
    for signum, handler in previous.items():
        _signal.signal(signum, _signal.SIG_DFL if handler is None else handler)


def _warn(message: str) -> None:
    """One line on stderr; never raises: a line stderr refuses (closed, or None: the process
    started without one) is lost, not the job, as in the drop-in's log."""
    try:
        sys.stderr.write(f"pegasus-transfer: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
