"""One rate per node: the pacing states (:mod:`transfer.pacing`) of a user's jobs on one node,
in one small file they all update under ``flock``.

Why a file: jobs are separate processes (drop-in runs, the node stager's forked copies, the
HTCondor plugin) that come and go; a file needs no server, and a job pays for it only once a
prefix is throttled (the first lookup of a prefix is one ``open`` that finds no file).

The file is ``rates`` in a directory private to the user: ``$XDG_RUNTIME_DIR/pegasus-cloudio``,
else ``/tmp/pegasus-cloudio-UID`` (a batch system that gives each job its own ``/tmp`` gives
each its own rate, as without this file). The directory must be the user's own, not a link, and closed to
others (mode 0700, made so when created); the file is opened with ``O_NOFOLLOW`` and must be a
regular file of the user; at most ``MAX_BYTES`` are read and ``MAX_KEYS`` prefixes kept (the
most recently cut). One line per prefix: ``key TAB last_max TAB cut_at TAB tokens TAB stamp TAB epoch
TAB taken`` (an older release's line, without ``taken``, is read with 0: its requests then wait at most
what they first booked); a line that does not parse is dropped. The first line, ``#v1 LENGTH CRC32``, checks the lines after
it: a look without the lock (:meth:`NodeStates.peek`) that overlaps a write sees a check that
fails and reads again under the lock (a file without it, from an older release, is read under
the lock only). Anything that goes wrong (an unsafe directory, a full
disk) makes the caller fall back to its own process's states, with one warning.
"""

from __future__ import annotations

import os

from transfer.lean import logger
from transfer.pacing import CALM_SECONDS, MAX_WAIT, LocalStates, RateState

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Mapping, Optional, Tuple

__all__ = ["MAX_BYTES", "MAX_KEYS", "NodeStates", "node_rate_dir"]

MAX_BYTES = 64 << 10
MAX_KEYS = 256
_MAX_RATE = 1e7  # requests/s: no store serves more to one prefix
_MAX_TAKEN = 2.0 ** 52  # reservations counted: past this a float no longer counts by one
_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_log = logger(__name__)


def node_rate_dir(env: Mapping[str, str]) -> str:
    """The directory of the node's rate file for ``env`` (see the module doc)."""
    runtime = env.get("XDG_RUNTIME_DIR", "").strip()
    if runtime:
        return os.path.join(runtime, "pegasus-cloudio")
    return f"/tmp/pegasus-cloudio-{os.getuid()}"


class NodeStates:
    """:class:`~transfer.pacing.States` in the node's rate file (module doc); falls back to
    this process's :class:`~transfer.pacing.LocalStates` for good after the first failure."""

    def __init__(self, directory: str, clock: Callable[[], float]) -> None:
        self._directory = directory
        self._path = os.path.join(directory, "rates")
        self._clock = clock
        self._fallback: Optional[LocalStates] = None
        self._unstorable = LocalStates()  # keys with a tab or newline: this process's own states

    def update(self, key: str, change: Callable[[Optional[RateState]], Tuple[Optional[RateState], float]]) -> float:
        if self._fallback is None and ("\t" in key or "\n" in key):
            return self._unstorable.update(key, change)
        if self._fallback is None:
            try:
                return self._update(key, change)
            except OSError as err:
                _log.warning("pacing: the node's rate file %s is not usable (%s); pacing this job alone",
                             self._path, err.strerror or err)
                self._fallback = LocalStates()
        return self._fallback.update(key, change)

    def peek(self, key: str) -> Optional[RateState]:
        """The key's state, read without ``flock`` (:meth:`~transfer.pacing.States.peek`): the file
        is written whole in one ``pwrite`` and its header checks it, so a read that overlaps a
        write (or finds a file without the header) is done again under the lock."""
        if self._fallback is None and "\t" not in key and "\n" not in key:
            try:
                fd = self._open(create=False)
                if fd is None:
                    return None
                try:
                    data = os.pread(fd, MAX_BYTES, 0)
                finally:
                    os.close(fd)
                checked = _checked(data)
                if checked is not None:
                    return _parse(checked, self._clock()).get(key)
            except OSError:
                pass  # the locked read below says so, once, and falls back
        found: List[Optional[RateState]] = [None]

        def look(state: Optional[RateState]) -> Tuple[Optional[RateState], float]:
            found[0] = state
            return state, 0.0

        self.update(key, look)
        return found[0]

    def _update(self, key: str, change: Callable[[Optional[RateState]], Tuple[Optional[RateState], float]]) -> float:
        fd = self._open(create=False)
        if fd is None:  # no file: no prefix of this node was throttled (yet)
            state, result = change(None)
            if state is None:
                return result
            fd = self._open(create=True)
            assert fd is not None
        import fcntl  # only once a file exists: a job whose prefixes were never throttled skips it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            data = os.pread(fd, MAX_BYTES, 0)
            states = _parse(_checked(data) or data, self._clock())  # (no header: an older release's file)
            state, result = change(states.get(key))
            if state is states.get(key):  # read only (or nothing to forget): no write
                return result
            if state is None:
                del states[key]
            else:
                states[key] = state
            data = _format(states, self._clock())
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            return result
        finally:
            os.close(fd)  # releases the lock

    def _open(self, create: bool) -> Optional[int]:
        if create:
            _private_dir(self._directory)
        else:
            try:
                _check_dir(self._directory)
            except FileNotFoundError:
                return None
        try:
            fd = os.open(self._path, _FLAGS | (os.O_CREAT if create else 0), 0o600)
        except FileNotFoundError:
            return None
        info = os.fstat(fd)
        import stat
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            os.close(fd)
            raise OSError(0, "not a regular file of this user")
        return fd


def _check_dir(path: str) -> None:
    import stat
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise OSError(0, f"{path} is not a directory of this user closed to writes by others")


def _private_dir(path: str) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    _check_dir(path)


def _checked(data: bytes) -> Optional[bytes]:
    """The lines of ``data`` its header vouches for; None if it has none or they fail its check."""
    head, _, body = data.partition(b"\n")
    fields = head.split(b" ")
    if len(fields) != 3 or fields[0] != b"#v1" or not fields[1].isdigit():
        return None
    body = body[:int(fields[1])]
    import zlib
    return body if len(body) == int(fields[1]) and b"%08x" % zlib.crc32(body) == fields[2] else None


def _parse(data: bytes, now: float) -> Dict[str, RateState]:
    """The file's states; a line that does not parse, or with a rate that is not positive or a
    time in the future, is dropped (the file is the user's, but any of their jobs may be wrong)."""
    states: Dict[str, RateState] = {}
    for line in data.decode("utf-8", "replace").split("\n"):
        fields = line.split("\t")
        if len(fields) not in (6, 7):
            continue
        try:
            numbers = [float(f) for f in fields[1:]]
        except ValueError:
            continue
        finite = all(n == n and abs(n) != float("inf") for n in numbers)
        if finite and 0 < numbers[0] <= _MAX_RATE and numbers[1] <= now + 1 and numbers[3] <= now + 1 \
                and numbers[4] <= now + MAX_WAIT + 1 and numbers[5:] <= [_MAX_TAKEN]:
            states[fields[0]] = RateState(*numbers)
    return states


def _format(states: Dict[str, RateState], now: float) -> bytes:
    """The file's text: calm states dropped, the MAX_KEYS most recently cut kept, within MAX_BYTES."""
    live = sorted((s.cut_at, k) for k, s in states.items() if now - s.cut_at < CALM_SECONDS)[-MAX_KEYS:]
    lines, size = [], 0
    for _, key in reversed(live):
        s = states[key]
        line = f"{key}\t{s.last_max!r}\t{s.cut_at!r}\t{s.tokens!r}\t{s.stamp!r}\t{s.epoch!r}\t{s.taken!r}\n".encode()
        if size + len(line) > MAX_BYTES - 64:  # (room for the header)
            break
        lines.append(line)
        size += len(line)
    body = b"".join(lines)
    import zlib
    return b"#v1 %d %08x\n" % (len(body), zlib.crc32(body)) + body
