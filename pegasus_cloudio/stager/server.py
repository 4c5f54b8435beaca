"""The node stager: accept a job from the drop-in, fork a ready copy of this process, run it.

The stager imports the drop-in and its backends once (:mod:`.preload`; the heavy ones,
:data:`ON_DEMAND`, once a job has used them) and generates its record classes' constructors,
then waits on a Unix socket in a private directory. Each connection from a process of the same user (checked with
``SO_PEERCRED``; others are refused) gets a forked child that takes over the client's
standard streams and working directory (descriptors the client sends), umask, environment
and arguments, runs the drop-in's ``main`` exactly as the command would, and reports the
exit code (:mod:`.wire`). A job the stager cannot fork for (the user's process limit) is
refused, as one from another namespace is: its client runs it, and the stager serves on. Cache
inserts of bundle members the job fetched are made after that answer
(:mod:`transfer.cache.behind`), so they overlap with the job's compute instead of delaying it. The stager
itself never runs a transfer and holds no threads, so forking it is safe; it reaps its
children and logs one line per job (pid, exit code, CPU seconds). Before serving it freezes
what it has loaded out of the garbage collector (:func:`gc.freeze`), so a child's collections
do not touch, and copy, the pages it shares with the stager.

What a job does in the stager is what it would do in-process; what differs: its CPU and
memory are charged to the stager's process tree, not to the job's (HTCondor's accounting and
cgroup limits do not see them), and the job's resource limits are the stager's.
"""

from __future__ import annotations

import gc
import io
import logging
import os
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import traceback
from types import FrameType
from typing import Dict, List, Optional, Set, Tuple

from pegasus_cloudio.stager import wire
from pegasus_cloudio.stager.warm import WarmSockets, report
from transfer.cache import behind
from pegasus_cloudio.stager.preload import ON_DEMAND, import_quietly, prepare_records

REQUEST_TIMEOUT_S = 30.0
REFUSE_S = 1.0  # the whole of a refusal (on the stager's loop)
MAX_PATH = 107  # sun_path holds 108 bytes with the terminating NUL

log = logging.getLogger("pegasus_cloudio.stager")
Request = Tuple[str, int, List[str], Dict[bytes, bytes]]  # cwd, umask, argv, environment


class StagerError(Exception):
    """The stager cannot start; the message names the path or setting."""


class _Stop(Exception):
    pass


def check_directory(directory: str) -> None:
    """Create the socket's directory (mode 700) or refuse one that others could reach into,
    or one reached through a symbolic link another user owns (as the node cache does)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    foreign = foreign_link(directory)
    if foreign:
        raise StagerError(f"{directory}: reached through {foreign}, a symbolic link owned by another user; "
                          "choose a --socket path of your own")
    st = os.stat(directory)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise StagerError(f"{directory}: the stager's socket directory must belong to this user and be private "
                          f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}; want uid {os.getuid()}, "
                          "mode 700)")


def foreign_link(path: str) -> str:
    """The first component of ``path`` that is a symbolic link owned by neither this user
    nor root ("" when none): whoever owns it decides where the path leads."""
    current = "/"
    for part in os.path.abspath(path).strip("/").split("/"):
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except OSError:
            return ""
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, os.getuid()):
            return current
    return ""


def listen(path: str) -> socket.socket:
    """A listening socket at ``path``; a stale socket file there is replaced, a live one refused."""
    path = os.path.abspath(path)
    if len(os.fsencode(path)) > MAX_PATH:
        raise StagerError(f"{path}: socket path longer than {MAX_PATH} bytes; choose a shorter --socket")
    check_directory(os.path.dirname(path))
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise StagerError(f"{path}: exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # stale: left by a stager that died
        else:
            raise StagerError(f"{path}: another stager is serving this socket")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(64)
    return sock


def hold_standard_descriptors() -> None:
    """Open ``/dev/null`` on each of descriptors 0-2 that is closed (a service manager may
    start the stager so): the listening socket or the reports' pipe would take it, and a copy
    puts the job's streams there."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end (``struct ucred``: pid, uid, gid)."""
    return int.from_bytes(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)[4:8], sys.byteorder)


def peer_pid(conn: socket.socket) -> int:
    return int.from_bytes(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)[0:4], sys.byteorder)


_VIEWS = (("mount namespace", "ns/mnt", "a container or MOUNT_UNDER_SCRATCH"),
          ("root directory", "root", "a container or chroot"),
          ("pid namespace", "ns/pid", "its signals could not reach the job here"))


def foreign_view(pid: int) -> str:
    """Why process ``pid`` sees another system than this one ("" when it sees the same): a
    different mount namespace (a container, HTCondor's ``MOUNT_UNDER_SCRATCH``) or root
    directory, where paths it sends would name other files here; or a different pid
    namespace, where the pid the client is sent (to pass SIGTERM on to) names another
    process or none, so the job could not be stopped."""
    for what, name, why in _VIEWS:
        try:
            theirs, ours = os.stat(f"/proc/{pid}/{name}"), os.stat(f"/proc/self/{name}")
        except OSError as err:
            return f"cannot check its {what} ({err.strerror})"
        if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
            return f"it runs in another {what} ({why})"
    return ""


class Stager:
    """Serve jobs on ``path`` until SIGTERM/SIGINT (then the socket file is removed)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.served = 0
        self.cpu_s = 0.0
        self._listener: Optional[socket.socket] = None
        self._serving = False  # the accept loop runs: only then does a stop interrupt it
        self._reaping = False
        self._stop_asked = False
        self._warm: Optional[WarmSockets] = None
        self._dispatching = False  # the loop is using the warm connections: the reaper leaves them
        self._reap_again = False  # a child ended while the reaper could not reap: reap again

    def serve(self) -> None:
        hold_standard_descriptors()
        self._listener = listen(self.path)
        self._warm = WarmSockets()
        gc.collect()
        gc.freeze()  # what is loaded now stays put: forked children do not copy its pages to collect it
        signal.signal(signal.SIGCHLD, self._reap)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._stop)
        log.info("serving %s (pid %d); jobs use it with %s=%s", self.path, os.getpid(), wire.ENV_VAR, self.path)
        self._serving = True
        try:
            while True:
                conn, _ = self._listener.accept()
                self._dispatch(conn)
                self._import_learnt()
        except _Stop:
            pass
        finally:
            self._serving = False
            self._dispatching = True  # the reaper leaves the warm connections (and children) alone from now on
            self._listener.close()
            self._warm.close()
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        log.info("stopping: %d job(s) served, %.3f s of their CPU", self.served, self.cpu_s)

    def _dispatch(self, conn: socket.socket) -> None:
        uid = peer_uid(conn)
        if uid != os.getuid():
            log.warning("refused a connection from uid %d (this stager serves uid %d only)", uid, os.getuid())
            conn.close()
            return
        pid = peer_pid(conn)
        why = foreign_view(pid)
        if why:
            log.warning("refused a job (pid %d): %s", pid, why)
            _refuse(conn, why)
            return
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        failed = self._start(conn)
        if failed is not None:  # EAGAIN (the user's process limit, a unit's TasksMax), ENOMEM
            log.warning("refused a job (pid %d): cannot fork (%s)", pid, failed.strerror or failed)
            _refuse(conn, f"the stager cannot fork a process for it now ({failed.strerror or failed})")
        if self._reap_again:  # children ended meanwhile
            self._reap(signal.SIGCHLD, None)

    def _start(self, conn: socket.socket) -> Optional[OSError]:
        """Fork the copy that runs the job on ``conn``, lending it warm connections; None, or
        why ``fork`` failed (``conn`` is then still open, the connections handed out back)."""
        assert self._warm is not None
        failed = None
        self._dispatching = True  # the reaper leaves the warm connections and the children alone meanwhile
        try:
            self._warm.drain_reports()
            handed = self._warm.hand_out()
            pid = -1
            try:
                pid = self._fork(conn, handed)
            except OSError as err:
                failed = err
                self._warm.put_back()  # nobody had them
            finally:
                self._warm.lend(pid)  # the stager keeps its descriptors: lent, not given
            self._warm.refill()
        finally:
            self._dispatching = False
        return failed

    def _import_learnt(self) -> None:
        """Import the :data:`ON_DEMAND` modules finished jobs used (their copies reported them),
        so that later jobs find them loaded."""
        assert self._warm is not None
        wanted = [name for name in ON_DEMAND if name in self._warm.imports and name not in sys.modules]
        self._warm.imports.clear()
        if not wanted:
            return
        for name in wanted:
            if import_quietly(name):
                log.info("loaded %s, which a job used: later jobs find it loaded", name)
        prepare_records()
        gc.collect()
        gc.freeze()

    def _fork(self, conn: socket.socket, handed: Dict[Tuple[str, int], List[socket.socket]]) -> int:
        """Fork the job's copy (which never returns from here); the child's pid. OSError if
        ``fork`` fails (``conn`` is left open)."""
        assert self._warm is not None
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                assert self._listener is not None
                self._listener.close()
                for sock in self._warm.held():  # the stager's, not this job's
                    sock.close()
                os.close(self._warm.reports_r)
                code = _child(conn, handed, self._warm.reports_w, self._warm.fresh())
            finally:
                os._exit(code)
        conn.close()
        return pid

    def _reap(self, signum: int, frame: Optional[FrameType]) -> None:
        """Reap and log every finished job, and give back the sockets lent to its copy. A stop
        asked meanwhile (SIGTERM runs its handler between any two bytecodes, this one included)
        takes effect once this is done, so no finished job goes unlogged or unreaped.

        During a dispatch, or inside this handler (a SIGCHLD meanwhile), it only notes that a
        child ended, and the dispatch, or this handler, reaps once done (this one looks again
        if one was noted after its last look: no SIGCHLD comes later for it): a pid is freed only
        where the sockets lent under it are given back in the same step, so a copy forked
        with a reaped copy's pid is never given the other's sockets, nor theirs taken back."""
        if self._reaping or self._dispatching:
            self._reap_again = True
            return
        self._reap_again = True
        while self._reap_again:  # one noted after the inner loop's last look, before it ended
            self._reaping = True
            try:
                while self._reap_again:
                    self._reap_again = False
                    self._wait_all()
                    if self._warm is not None:
                        self._warm.drain_reports()  # the endpoints the finished jobs used: dial them now
            finally:
                self._reaping = False
        if self._stop_asked and self._serving:
            raise _Stop()

    def _wait_all(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self._warm is not None:
                self._warm.give_back(pid)
            cpu = usage.ru_utime + usage.ru_stime
            self.served += 1
            self.cpu_s += cpu
            log.info("job pid %d exited %d (%.3f s CPU)", pid, os.waitstatus_to_exitcode(status), cpu)

    def _stop(self, signum: int, frame: Optional[FrameType]) -> None:
        self._stop_asked = True
        if self._serving and not self._reaping:
            raise _Stop()


def _refuse(conn: socket.socket, why: str) -> None:
    """Take the client's request (its descriptors closed unused, so it finishes sending),
    tell it why it must run its job itself (one line), then hang up; all within
    :data:`REFUSE_S`, whatever the client does: this runs on the stager's loop, and a client
    that may not signal the stager (another pid namespace) must not hold it by sending slowly."""
    deadline = time.monotonic() + REFUSE_S
    try:
        _time_left(conn, deadline)
        header, fds, _, _ = socket.recv_fds(conn, wire.LENGTH_BYTES, wire.DESCRIPTORS)
        for fd in fds:
            os.close(fd)
        if len(header) == wire.LENGTH_BYTES:
            _discard(conn, min(int.from_bytes(header, "big"), wire.MAX_REQUEST), deadline)
        _time_left(conn, deadline)
        conn.sendall(wire.refusal(why))
    except OSError:
        pass
    conn.close()


def _time_left(conn: socket.socket, deadline: float) -> None:
    """Make ``conn``'s next call wait until ``deadline`` at most (TimeoutError once past)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the client's time is up")
    conn.settimeout(left)


def _discard(conn: socket.socket, size: int, deadline: float) -> None:
    """Read and drop ``size`` bytes (fewer if the client stops), by ``deadline``."""
    while size > 0:
        _time_left(conn, deadline)
        chunk = conn.recv(min(size, 1 << 16))
        if not chunk:
            return
        size -= len(chunk)


def _child(conn: socket.socket, warm_sockets: Dict[Tuple[str, int], List[socket.socket]], reports: int,
           fresh: Set[Tuple[str, int]]) -> int:
    """Become the client's job: its streams, directory, umask, environment; run the drop-in
    (on the connections the stager opened ahead and lends it, ``warm_sockets``: it closes its
    descriptors of them, never shuts one down; the addresses the job used
    are reported on ``reports`` once it is done, those not in ``fresh`` looked up after the
    job's answer: the stager looks no name up)."""
    from transfer.http import warm
    on_demand = [name for name in ON_DEMAND if name not in sys.modules]
    for address, sockets in warm_sockets.items():
        warm.adopt(address, sockets)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    logging.root.handlers.clear()  # the stager's own log: the job logs as it would in-process
    if logging.root.level != logging.WARNING:  # (the command's stager has it so: see cli.py)
        logging.root.setLevel(logging.WARNING)  # clears every logger's cache, so touches (copies) each
    received = _receive(conn)
    if received is None:
        return 2
    fds, request = received
    why = _unusable(fds)
    if why:
        for fd in fds:
            os.close(fd)
        _refuse_here(conn, why)
        return 2
    directory = fds.pop()
    for target, fd in enumerate(fds):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    _rebind_streams()
    if request is None:
        os.close(directory)
        sys.stderr.write("pegasus-transfer: the node stager got a malformed request\n")
        return 2
    cwd, umask, argv, env = request
    try:
        _enter(directory)
    except OSError as err:
        sys.stderr.write(f"pegasus-transfer: {cwd}: cannot enter the job's directory: {err.strerror}\n")
        return 1
    os.umask(umask)
    _take_environment(env)
    tempfile.tempdir = None
    sys.argv = ["pegasus-transfer", *argv]
    finishing = threading.Event()
    conn.sendall(wire.reply(wire.PID, os.getpid()))
    threading.Thread(target=_watch, args=(conn, finishing), daemon=True).start()
    behind.collect()
    code = _run(argv)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    used = warm.used()
    report(reports, [address for address in used if address in fresh], [n for n in on_demand if n in sys.modules])
    warm.discard()
    finishing.set()
    try:
        conn.sendall(wire.reply(wire.EXIT, code))
    except OSError:
        pass
    from pegasus_cloudio.dropin.main import leave_the_job  # preloaded
    leave_the_job()
    behind.drain()  # the job has its answer: fill the node cache now
    report(reports, [address for address in used if address not in fresh], look_up=True)  # may wait on a resolver
    return code


def _receive(conn: socket.socket) -> Optional[Tuple[List[int], Optional[Request]]]:
    """The descriptors the client sent (at least its three streams) and its request (None
    when malformed); None, with nothing to answer on, when it sent no header or fewer
    descriptors, or stopped sending for :data:`REQUEST_TIMEOUT_S`."""
    conn.settimeout(REQUEST_TIMEOUT_S)  # a client that connects and sends nothing
    try:
        header, fds, _, _ = socket.recv_fds(conn, wire.LENGTH_BYTES, wire.DESCRIPTORS)
    except OSError:
        return None
    if len(header) != wire.LENGTH_BYTES or len(fds) < 3:
        for fd in fds:
            os.close(fd)
        return None
    try:
        request = _request(conn, int.from_bytes(header, "big"))
    except OSError:
        request = None
    conn.settimeout(None)
    return fds, request


def _unusable(fds: List[int]) -> str:
    """Why the copy cannot run a job with the descriptors ``fds`` ("" when it can): the
    fourth must be the job's directory. A client sending only its streams is older than this
    stager (a separately built native client, an older installation's): finding its directory
    by its pid would enter another process's once the client is gone and its pid reused."""
    if len(fds) < wire.DESCRIPTORS:
        return (f"the client sent {len(fds)} descriptors, without its working directory "
                "(a client older than this stager)")
    if not stat.S_ISDIR(os.fstat(fds[3]).st_mode):
        return "the working directory descriptor the client sent is not a directory"
    return ""


def _refuse_here(conn: socket.socket, why: str) -> None:
    """Tell the client, whose request the copy has read, why it must run its job itself."""
    try:
        conn.sendall(wire.refusal(why))
    except OSError:
        pass


def _enter(directory: int) -> None:
    """Enter the job's directory, the one whose descriptor the client sent (and close that).
    Not whatever the path the client sent names by now: another user who may rename a
    directory on that path (a shared directory without the sticky bit) could have put one of
    hers there; nor the client's ``/proc/<pid>/cwd``: if the client died meanwhile, another
    process of the user may have its pid."""
    try:
        os.fchdir(directory)
    finally:
        os.close(directory)


def _take_environment(env: Dict[bytes, bytes]) -> None:
    """The environment (``os.environ`` and ``os.environb``, one mapping) becomes ``env``,
    changing only what differs: a job's environment is mostly the stager's, and ``clear()``
    then ``update()`` would unset and set every variable again (a quadratic ``clear``, and a
    system call each); as bytes, nothing is decoded and encoded again."""
    environ = os.environb
    for name in [name for name in environ if name not in env]:
        del environ[name]
    for name, value in env.items():
        if environ.get(name) != value:
            environ[name] = value


def _request(conn: socket.socket, size: int) -> Optional[Request]:
    if size > wire.MAX_REQUEST:
        return None
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(min(size - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return wire.decode_request_bytes(bytes(data))


def _rebind_streams() -> None:
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="surrogateescape")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="surrogateescape",
                                  line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True)


def _watch(conn: socket.socket, finishing: threading.Event) -> None:
    """The client closing the connection before the end means its job was killed: stop too."""
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass
    if not finishing.is_set():
        os.kill(os.getpid(), signal.SIGTERM)


def _run(argv: List[str]) -> int:
    from pegasus_cloudio.dropin.main import main
    try:
        return main(argv)
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            return int(done.code or 0)
        sys.stderr.write(f"{done.code}\n")
        return 1
    except BaseException:  # noqa: BLE001 - reported like an uncaught exception would be
        traceback.print_exc()
        return 1
