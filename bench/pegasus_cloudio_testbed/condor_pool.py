"""A real HTCondor pool on loopback: collector, negotiator, schedd and named startds.

`CondorPool` runs a cached Debian root of `condor_root` (``suite``: Debian 13 with HTCondor
23.9 from ``minicondor`` by default, or ``testing`` with HTCondor 25.x) as a service manager
would: ``condor_master -f`` by ``chroot`` under ``env -i``, as root, with the daemons on
127.0.0.1 (the collector on a free port, the others on ephemeral ones, no shared port). Jobs
run as the non-root submitter ``cloudio``.

Isolation, so that several pools (pytest processes, worktrees) run at once:
- each pool lives in its own directory under ``/var/tmp/cloudio-pools`` (not under
  ``/tmp``: DAGMan refuses node logs there, ``DAGMAN_USE_STRICT``), ``$PEGASUS_CLOUDIO_POOL_DIR``
  overrides the base;
- the root is an overlayfs over the cached root, with the pool's own ``/etc/condor``,
  ``/var/lib/condor`` and ``/var/log/condor`` in its upper layer (mount and unmount 0.2 s;
  a copy of the 594 MB root took 28 s at load average 40);
- every mount (the overlay, ``/proc``, ``/dev``, ``/sys``, and the caller's directories,
  bind-mounted at the same path inside as outside) is made in a private mount namespace
  created for the master (``unshare --mount``), so nothing is mounted in the machine's
  namespace, no two pools share a mount point, and the kernel drops every mount when the
  pool's last process exits;
- cgroups are named per pool (``BASE_CGROUP``), so two pools' slots never share one.

Commands run inside the root with `run` (by ``nsenter`` into the master's namespace and
root, under ``env -i``, as the submitter unless told otherwise). `stop` removes what jobs
remain (``condor_rm``), stops the master by its PID (SIGTERM, then SIGKILL after a grace),
kills whatever still runs in the pool's namespace and deletes the pool directory
(``$PEGASUS_CLOUDIO_KEEP_POOL=1`` keeps it, with the logs). A pool whose owner died without
`stop` (a killed pytest) is reaped by the next `start` on the machine (`reap_orphans`).

Directories under `shared` are bind-mounted at the same path inside and outside: tests keep
job directories there (`user_dir`). HTCondor's logs are readable from outside in `log_dir`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Dict, List, Mapping, Optional, Sequence, Type, Union

from .condor_root import ROOTS, SUBMITTER, SUITE, build_root
from .ports import free_port

__all__ = ["CondorPool", "PoolError", "POOL_BASE", "reap_orphans"]

POOL_BASE_ENV = "PEGASUS_CLOUDIO_POOL_DIR"
POOL_BASE = "/var/tmp/cloudio-pools"
KEEP_ENV = "PEGASUS_CLOUDIO_KEEP_POOL"   # set: `stop` keeps the pool directory (logs) for a look
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_POLL_S = 0.5
_STOP_GRACE_S = 30.0
_CONFIG_DIR = "/etc/condor/config.d"
_BASE_CONFIG = "50-pegasus-cloudio-pool.conf"

_CONFIG = """\
# Written by pegasus_cloudio_testbed.condor_pool for pool {name}, read after the package's
# 00-minicondor (FS authentication required, daemons as condor@UID_DOMAIN).
MAIL = /bin/true
CONDOR_HOST = 127.0.0.1
COLLECTOR_HOST = 127.0.0.1:{port}
NETWORK_INTERFACE = 127.0.0.1
BIND_ALL_INTERFACES = False
USE_SHARED_PORT = False
ENABLE_IPV6 = False
COLLECTOR_NAME = {name}
UID_DOMAIN = {name}
FILESYSTEM_DOMAIN = {name}
TRUST_UID_DOMAIN = True

use POLICY : ALWAYS_RUN_JOBS
MOUNT_UNDER_SCRATCH =
USE_PID_NAMESPACES = False
BASE_CGROUP = pegasus-cloudio-{name}
# quick cycles: tests wait on them
NEGOTIATOR_INTERVAL = 2
NEGOTIATOR_MIN_INTERVAL = 1
NEGOTIATOR_CYCLE_DELAY = 1
SCHEDD_INTERVAL = 2
UPDATE_INTERVAL = 2
STARTER_UPDATE_INTERVAL = 2
SHADOW_QUEUE_UPDATE_INTERVAL = 2
STARTD_CRON_AUTOPUBLISH = If_Changed

# every startd: {slots} static one-CPU slots (the package's ROLE: Execute makes one partitionable)
NUM_CPUS = {slots}
MEMORY = {memory}
SLOT_TYPE_1 = cpus=1
SLOT_TYPE_1_PARTITIONABLE = False
NUM_SLOTS_TYPE_1 = {slots}
DAEMON_LIST = MASTER, COLLECTOR, NEGOTIATOR, SCHEDD{startd_list}
{startds}"""

_STARTD = """
STARTD_{local} = $(STARTD)
STARTD_{local}_ARGS = -f -local-name {local}
{local}.STARTD_NAME = {name}
{local}.STARTD_LOG = $(LOG)/StartLog.{name}
{local}.STARTD_ADDRESS_FILE = $(LOG)/.startd_{name}_address
{local}.EXECUTE = {execute}
"""


class PoolError(RuntimeError):
    """The pool could not start, or a command inside it failed."""


class CondorPool:
    """One personal HTCondor pool for a test session (see the module docstring).

    Arguments:
        startds: the startds' names (distinct; each gets its own EXECUTE directory).
        slots: slots per startd (one CPU each).
        binds: host directories bind-mounted at the same path inside the root (created if
            missing): work dirs, a Pegasus dist, a venv.
        config: extra HTCondor configuration (plugin registration, startd cron), written to
            the pool's config directory before the daemons start; `add_config` adds more later.
        suite: the Debian suite of the root (a key of `condor_root.ROOTS`).
        packages: the root's packages (default: the suite's in `condor_root.ROOTS`;
            `condor_root.PACKAGES` extended, for example).

    Attributes (meaningful once started): ``dir`` (the pool directory), ``shared`` (bound
    inside at the same path), ``log_dir`` (HTCondor's logs, seen from outside), ``port``
    (collector), ``master_pid``, ``submitter``, ``submitter_uid``, ``submitter_gid``,
    ``startd_names``, ``hostname``, ``version`` (HTCondor's, e.g. ``(25, 0, 1)``).
    """

    def __init__(self, *, startds: Sequence[str] = ("node1", "node2"), slots: int = 2,
                 binds: Sequence[Union[str, Path]] = (), config: str = "",
                 suite: str = SUITE, packages: Optional[Sequence[str]] = None,
                 start_timeout: float = 240.0, memory_mb: int = 2048) -> None:
        if len(set(startds)) != len(startds) or not startds:
            raise ValueError(f"startd names must be distinct and at least one: {list(startds)}")
        for name in startds:
            if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
                raise ValueError(f"startd name {name!r}: lower-case letters, digits, '-'")
        if packages is None and suite not in ROOTS:
            raise ValueError(f"suite {suite!r} has no package list: pass packages (known: {', '.join(ROOTS)})")
        self.startd_names = list(startds)
        self.slots = slots
        self.binds = [Path(b).resolve() for b in binds]
        self.extra_config = config
        self.suite = suite
        self.packages = list(ROOTS[suite] if packages is None else packages)
        self.start_timeout = start_timeout
        self.memory_mb = memory_mb
        self.submitter = SUBMITTER
        self.submitter_uid = -1
        self.submitter_gid = -1
        self.hostname = socket.gethostname()
        self.port = 0
        self.master_pid = 0
        self.dir = Path()
        self.shared = Path()
        self.log_dir = Path()
        self.version: "tuple[int, int, int]" = (0, 0, 0)
        self._proc: Optional["subprocess.Popen[bytes]"] = None
        self._mnt_ns = ""
        self._homes: Dict[str, str] = {}

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> "CondorPool":
        """Build the root if needed, start the master, wait until every slot and the schedd
        are in the collector. Raises PoolError (with log tails) when they are not in time."""
        lower = build_root(self.packages, suite=self.suite)
        base = Path(os.environ.get(POOL_BASE_ENV) or POOL_BASE)
        base.mkdir(parents=True, exist_ok=True)
        reap_orphans(base)
        self.dir = Path(tempfile.mkdtemp(prefix="pool-", dir=base))
        (self.dir / "owner").write_text(f"{os.getpid()}\n")
        os.chmod(self.dir, 0o755)
        try:
            self._prepare(lower)
            self._launch(lower)
            self._wait_ready()
            self.version = self._condor_version()
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare(self, lower: Path) -> None:
        self.shared = self.dir / "shared"
        self.shared.mkdir(mode=0o755)
        upper = self.dir / "upper"
        self.log_dir = upper / "var" / "log" / "condor"
        self.submitter_uid, self.submitter_gid = _account(lower, self.submitter)
        self._homes = _homes(lower)
        condor = _account(lower, "condor")
        (self.dir / "work").mkdir()
        (self.dir / "root").mkdir()
        # the package's LOG, SPOOL, LOCK (/var/lock -> /run/lock), RUN and EXECUTE, owned by condor
        for sub in ("var/log/condor", "var/spool/condor", "run/lock/condor", "run/condor",
                    "var/lib/condor/execute", *(f"var/lib/condor/execute-{n}" for n in self.startd_names)):
            path = upper / sub
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, *condor)
        config_dir = upper / _CONFIG_DIR.lstrip("/")
        config_dir.mkdir(parents=True)
        self.port = free_port()
        (config_dir / _BASE_CONFIG).write_text(self._config())
        if self.extra_config:
            (config_dir / "60-caller.conf").write_text(self.extra_config + "\n")
        (upper / "etc" / "hosts").write_text(
            f"127.0.0.1 {self.hostname} localhost\n")

    def _config(self) -> str:
        startds = "".join(
            _STARTD.format(local=n.upper().replace("-", "_"), name=n, execute=f"/var/lib/condor/execute-{n}")
            for n in self.startd_names)
        listing = "".join(f", STARTD_{n.upper().replace('-', '_')}" for n in self.startd_names)
        return _CONFIG.format(name=self.dir.name, port=self.port,
                              startd_list=listing, startds=startds, slots=self.slots,
                              memory=self.memory_mb * self.slots)

    def _launch(self, lower: Path) -> None:
        root = self.dir / "root"
        lines = ["set -e",
                 f"mount -t overlay overlay -o lowerdir={lower},upperdir={self.dir / 'upper'},"
                 f"workdir={self.dir / 'work'} {root}"]
        for system in ("proc", "dev", "sys"):
            lines.append(f"mount --rbind /{system} {root}/{system}")
        for path in [self.shared, *self.binds]:
            lines += self._bind_lines(path)
        lines.append(f"exec chroot {root} /usr/bin/env -i PATH={_PATH} LANG=C.UTF-8 "
                     "/usr/sbin/condor_master -f")
        out = open(self.dir / "master.out", "wb")
        with out:
            self._proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", "\n".join(lines)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, env={"PATH": _PATH})
        self.master_pid = self._proc.pid

    def _wait_ready(self) -> None:
        want = {f"slot{i}@{n}@" for n in self.startd_names for i in range(1, self.slots + 1)}
        deadline = time.monotonic() + self.start_timeout
        seen: List[str] = []
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise PoolError(f"condor_master exited {self._proc.returncode} at start"
                                f"{self._diagnostics()}")
            if not self._mnt_ns and _mount_ns(self.master_pid) not in ("", _mount_ns(os.getpid())):
                self._mnt_ns = _mount_ns(self.master_pid)  # once unshare has made it
            slots = self.run(["condor_status", "-af", "Name"], user="root", check=False)
            schedds = self.run(["condor_status", "-schedd", "-af", "Name"], user="root", check=False)
            seen = slots.stdout.split()
            if (schedds.stdout.strip() and
                    all(any(s.startswith(w) for s in seen) for w in want)):
                return
            time.sleep(_POLL_S)
        raise PoolError(f"pool {self.dir} not ready in {self.start_timeout:.0f} s "
                        f"(slots seen: {seen}){self._diagnostics()}")

    def _condor_version(self) -> "tuple[int, int, int]":
        text = self.run(["condor_version"], user="root").stdout
        found = re.search(r"\$CondorVersion: (\d+)\.(\d+)\.(\d+) ", text)
        if not found:
            raise PoolError(f"condor_version in pool {self.dir.name} printed no version: {text[:200]!r}")
        major, minor, patch = (int(g) for g in found.groups())
        return major, minor, patch

    def _diagnostics(self) -> str:
        parts = []
        for name in ("MasterLog", "CollectorLog", "SchedLog",
                     *(f"StartLog.{n}" for n in self.startd_names)):
            parts.append(_tail(self.log_dir / name, name))
        parts.append(_tail(self.dir / "master.out", "master stdout"))
        return "".join(parts)

    def stop(self) -> None:
        """Idempotent: condor_rm leftovers, stop the master by PID, kill what remains in the
        pool's namespace (the kernel then drops its mounts), delete the pool directory."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                self.run(["condor_rm", "-all"], user="root", check=False, timeout=30)
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=_STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
            self._kill_namespace()
        if self.dir == Path() or not self.dir.exists():
            return
        if os.environ.get(KEEP_ENV):
            (self.dir / "owner").unlink(missing_ok=True)   # kept: reap_orphans leaves it
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_namespace(self) -> None:
        if not self._mnt_ns or self._mnt_ns == _mount_ns(os.getpid()):
            return
        for _ in range(100):
            left = [pid for pid in _pids() if _mount_ns(pid) == self._mnt_ns]
            if not left:
                return
            for pid in left:
                _kill(pid)
            time.sleep(0.1)
        raise PoolError(f"processes of pool {self.dir} survive SIGKILL: {left}")

    def __enter__(self) -> "CondorPool":
        return self.start()

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.stop()

    # -- using the pool ---------------------------------------------------------------------

    def run(self, args: Sequence[str], *, user: Optional[str] = None, cwd: Union[str, Path, None] = None,
            env: Optional[Mapping[str, str]] = None, input: Optional[str] = None,
            check: bool = True, timeout: float = 300.0) -> "subprocess.CompletedProcess[str]":
        """Run ``args`` inside the root as ``user`` (default: the submitter; ``"root"`` for
        root) in ``cwd`` (a path inside the root; default the user's home), with a clean
        environment plus ``env``. ``check``: raise PoolError on a non-zero exit."""
        done = subprocess.run(self._command(args, user, cwd, env), input=input, capture_output=True,
                              text=True, timeout=timeout, env={"PATH": _PATH})
        if check and done.returncode != 0:
            raise PoolError(f"{shlex.join(args)} (as {user or self.submitter} in pool {self.dir.name}) exited "
                            f"{done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
        return done

    def popen(self, args: Sequence[str], *, user: Optional[str] = None, cwd: Union[str, Path, None] = None,
              env: Optional[Mapping[str, str]] = None, stdout: Optional[IO[bytes]] = None,
              stderr: Optional[IO[bytes]] = None) -> "subprocess.Popen[bytes]":
        """Start ``args`` inside the root as `run` would, without waiting: a service beside
        the jobs (not a job: the starter would kill it with the job). Its PID is the
        command's own (nsenter and setpriv exec it); `stop` kills it if it still runs."""
        return subprocess.Popen(self._command(args, user, cwd, env), stdin=subprocess.DEVNULL,
                                stdout=stdout, stderr=stderr, env={"PATH": _PATH})

    def _command(self, args: Sequence[str], user: Optional[str], cwd: Union[str, Path, None],
                 env: Optional[Mapping[str, str]]) -> List[str]:
        user = user or self.submitter
        home = self._homes.get(user, "/")
        variables = {"PATH": _PATH, "LANG": "C.UTF-8", "HOME": home, "USER": user, "LOGNAME": user,
                     **(env or {})}
        command = ["nsenter", f"--target={self.master_pid}", "--mount", "--root"]
        if user != "root":
            command += ["setpriv", "--reuid", user, "--regid", user, "--init-groups", "--reset-env"]
        return command + ["/usr/bin/env", "-i", f"--chdir={cwd or home}",
                          *(f"{k}={v}" for k, v in variables.items()), *args]

    def _bind_lines(self, path: Path) -> List[str]:
        path.mkdir(parents=True, exist_ok=True)
        inside = shlex.quote(f"{self.dir / 'root'}{path}")
        return [f"mkdir -p {inside}", f"mount --bind {shlex.quote(str(path))} {inside}"]

    def bind(self, path: Union[str, Path]) -> Path:
        """Bind-mount host directory ``path`` (created if missing) at the same path inside
        the running pool; the mount goes with the pool. Returns the resolved path."""
        resolved = Path(path).resolve()
        script = "set -e\n" + "\n".join(self._bind_lines(resolved))
        done = subprocess.run(["nsenter", f"--target={self.master_pid}", "--mount", "--", "sh", "-c", script],
                              capture_output=True, text=True, env={"PATH": _PATH})
        if done.returncode != 0:
            raise PoolError(f"cannot bind {resolved} into pool {self.dir.name}: {done.stderr.strip()}")
        return resolved

    def user_dir(self, name: str) -> Path:
        """A fresh directory under `shared` owned by the submitter (same path inside)."""
        path = self.shared / name
        path.mkdir(parents=True)
        os.chown(path, self.submitter_uid, self.submitter_gid)
        return path

    def add_config(self, name: str, text: str) -> None:
        """Add config file ``70-<name>`` to ``/etc/condor/config.d`` (read after the pool's
        own and the constructor's ``config``) and ``condor_reconfig`` every daemon.

        The reconfig goes to the master by its address file, not through the collector
        (``-all``): the master's ad can be missing from the collector for up to
        MASTER_UPDATE_INTERVAL after start, when its first update beat the collector up."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"config file name {name!r}")
        self.run(["tee", f"{_CONFIG_DIR}/70-{name}"], user="root", input=text + "\n")
        self.run(["condor_reconfig"], user="root")

    def submit(self, description: str, cwd: Union[str, Path], *, user: Optional[str] = None) -> int:
        """``condor_submit`` ``description`` (a submit file's text) from ``cwd``; the cluster id."""
        done = self.run(["condor_submit", "-terse", "-"], input=description, cwd=cwd, user=user)
        first = done.stdout.split()[0]
        return int(first.split(".")[0])

    def wait_done(self, cluster: int, timeout: float = 300.0) -> Dict[str, str]:
        """Wait until every job of ``cluster`` left the queue (or is held: PoolError with the
        hold reason); the job's history ad as attribute -> value text (first job)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            held = self.run(["condor_q", str(cluster), "-hold", "-af", "HoldReason"], check=False)
            if held.stdout.strip():
                raise PoolError(f"job {cluster} held: {held.stdout.strip()}")
            queued = self.run(["condor_q", str(cluster), "-af", "ClusterId"], check=False)
            if queued.returncode == 0 and not queued.stdout.strip():
                return self.history(cluster)
            time.sleep(_POLL_S)
        raise PoolError(f"job {cluster} not done in {timeout:.0f} s: "
                        f"{self.run(['condor_q', str(cluster), '-better-analyze'], check=False).stdout[-2000:]}")

    def history(self, cluster: int) -> Dict[str, str]:
        """The history ad of job ``cluster``.0 (attribute -> unparsed value)."""
        done = self.run(["condor_history", "-l", "-limit", "1", f"{cluster}.0"])
        ad: Dict[str, str] = {}
        for line in done.stdout.splitlines():
            key, sep, value = line.partition(" = ")
            if sep:
                ad[key] = value
        return ad


def reap_orphans(base: Path) -> List[Path]:
    """Stop the pools under ``base`` whose owning process died without `stop` (a killed
    pytest): kill every process whose root is the pool's root, delete the directory.
    Returns the directories reaped."""
    reaped = []
    for owner in base.glob("pool-*/owner"):
        try:
            pid = int(owner.read_text().split()[0])
            os.kill(pid, 0)
            continue
        except ProcessLookupError:
            pass
        except (OSError, ValueError, IndexError):
            continue
        root = str(owner.parent / "root")
        for _ in range(50):
            left = [p for p in _pids() if _root_of(p) == root]
            if not left:
                break
            for p in left:
                _kill(p)
            time.sleep(0.1)
        shutil.rmtree(owner.parent, ignore_errors=True)
        reaped.append(owner.parent)
    return reaped


def _root_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/root")
    except OSError:
        return ""


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _account(root: Path, user: str) -> "tuple[int, int]":
    for line in (root / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3])
    raise PoolError(f"no user {user!r} in {root}/etc/passwd")


def _homes(root: Path) -> Dict[str, str]:
    fields = (line.split(":") for line in (root / "etc" / "passwd").read_text().splitlines())
    return {f[0]: f[5] for f in fields if len(f) > 5}


def _mount_ns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def _pids() -> List[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _tail(path: Path, label: str, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"\n--- {label}: absent"
    return f"\n--- {label} ({path}):\n" + "\n".join(text)
