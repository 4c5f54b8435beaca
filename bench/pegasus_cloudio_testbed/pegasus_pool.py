"""Workflows planned by the real ``pegasus-plan`` and run by DAGMan on a `CondorPool`.

The planner calls ``condor_submit_dag -no_submit``, so Pegasus runs inside the pool's root as
the submitter (Java 21, Debian's python3-yaml/-sqlalchemy/-git there), from the tarball
unpacked by `pegasus.ensure_pegasus` and bind-mounted at the same path. Everything a run
writes lives under ``pool.shared`` (same path inside and out, never ``/tmp``: DAGMan refuses
node logs there), so the host reads results, kickstart records and the stampede database
directly.

`PegasusOnPool` plans (``--submit``), waits for DAGMan's exit line and for ``pegasus-monitord``
to finish (``monitord.done``), and runs ``pegasus-statistics``/``pegasus-analyzer``.
`invocations` reads what every job's kickstart recorded, as monitord stored it (stampede
``invocation`` table): the executable each job really ran, its exit code and CPU time, which
is how tests count stock ``pegasus-transfer`` calls; `dagman_retries` and `held_jobs` name the jobs
DAGMan ran again and those HTCondor held. `SshdInRoot` is an OpenSSH server inside
the root (the submitter's account exists only there) for submit-host mode. `WorkerVenv`
installs our wheel with extras under the root's Python, the way a site installs it on workers.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from .condor_pool import CondorPool, PoolError
from .condor_root import PACKAGES
from .pegasus import cache_dir as pegasus_cache_dir
from .pegasus import ensure_pegasus
from .ports import free_port

__all__ = ["DAGMAN_CONFIG", "POOL_PACKAGES", "DagRun", "Invocation", "PegasusOnPool", "SshdInRoot", "dagman_retries",
           "held_jobs", "invocations", "stock_calls", "wheelhouse", "worker_venv"]

# The pool's root for planned runs: the plugin tests' packages plus an sshd (submit-host mode).
POOL_PACKAGES = tuple(dict.fromkeys([*PACKAGES, "openssh-server"]))
# DAGMan reads its nodes' logs every 5 s by default: with short jobs that is most of a level.
DAGMAN_CONFIG = "DAGMAN_USER_LOG_SCAN_INTERVAL = 1"
_EXIT = re.compile(r"EXITING WITH STATUS (\d+)")
_POLL_S = 1.0
_ROOT_PYTHON = "3.13"  # Debian 13's python3
_WHEELHOUSE_PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64",
                         "manylinux_2_34_x86_64", "linux_x86_64")


@dataclass(frozen=True)
class DagRun:
    """One planned workflow run: ``submit_dir`` (pegasus-plan's run directory), DAGMan's exit
    ``status`` (0 = every node succeeded), ``plan_s`` (pegasus-plan with --submit) and
    ``makespan_s`` (DAGMan's submission to its exit line, from the dagman.out timestamps)."""

    submit_dir: Path
    status: int
    plan_s: float
    makespan_s: float


@dataclass(frozen=True)
class Invocation:
    """One kickstart record (stampede ``invocation`` joined to its job): ``job`` (exec job id),
    ``transformation``, ``executable`` (the path kickstart ran), ``exitcode``,
    ``cpu_s`` (remote CPU time), ``duration_s``."""

    job: str
    transformation: str
    executable: str
    exitcode: int
    cpu_s: float
    duration_s: float


class PegasusOnPool:
    """Pegasus tools inside ``pool``'s root. ``pegasus_home`` must be bound into the pool."""

    def __init__(self, pool: CondorPool, pegasus_home: Path) -> None:
        self.pool = pool
        self.home = pegasus_home
        self._master_lock = threading.Lock()
        self._master_ready = False

    def env(self, bin_dir: Optional[Path] = None) -> Dict[str, str]:
        """PATH with ``bin_dir`` (default the install's ``bin``) first, then the root's."""
        return {"PATH": f"{bin_dir or self.home / 'bin'}:/usr/local/bin:/usr/bin:/bin"}

    def plan_and_run(self, set_dir: Path, plan_argv: Sequence[str], *, timeout: float = 600.0) -> DagRun:
        """Run ``plan_argv`` (a ``pegasus-plan ... --submit`` line; a relative planner path is
        taken from ``set_dir``) in ``set_dir`` with ``--relative-dir run``; wait for the end."""
        planner = plan_argv[0]
        bin_dir = (set_dir / planner).parent if "/" in planner else None
        argv = [str(set_dir / planner) if "/" in planner else planner, *plan_argv[1:]]
        argv[-1:-1] = ["--relative-dir", "run"]
        self._master_database(bin_dir, set_dir / _flag(argv, "--conf"))
        started = time.monotonic()
        done = self.pool.run(argv, cwd=set_dir, env=self.env(bin_dir), check=False, timeout=timeout)
        plan_s = time.monotonic() - started
        submit_dir = set_dir / _flag(argv, "--dir") / "run"
        if done.returncode != 0:
            raise PoolError(f"pegasus-plan exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}")
        status = self.wait(submit_dir, timeout)
        return DagRun(submit_dir, status, plan_s, dagman_makespan(submit_dir))

    def _master_database(self, bin_dir: Optional[Path], properties: Path) -> None:
        """Create the submitter's master database (``~/.pegasus/workflow.db``) once, before any
        plan: pegasus-plan creates it when missing, and plans started at once on a new pool
        raced to (``table dbversion already exists``, a failed plan)."""
        with self._master_lock:
            if not self._master_ready:
                tool = str((bin_dir or self.home / "bin") / "pegasus-db-admin")
                self.pool.run([tool, "update", "-t", "master", "-c", str(properties)], env=self.env(bin_dir),
                              timeout=300)
                self._master_ready = True

    def wait(self, submit_dir: Path, timeout: float) -> int:
        """DAGMan's exit status once it exited and monitord finished; PoolError on timeout."""
        deadline = time.monotonic() + timeout
        status: Optional[int] = None
        while time.monotonic() < deadline:
            if status is None:
                status = dagman_status(submit_dir)
            if status is not None and (submit_dir / "monitord.done").exists():
                return status
            time.sleep(_POLL_S)
        queue = self.pool.run(["condor_q", "-nobatch"], check=False).stdout[-2000:]
        raise PoolError(f"workflow in {submit_dir} not done in {timeout:.0f} s (DAGMan status {status}); "
                        f"queue:\n{queue}")

    def tool(self, name: str, *args: str, timeout: float = 300.0) -> "subprocess.CompletedProcess[str]":
        """Run ``pegasus-<name> ARGS`` of the install inside the root (not checked)."""
        return self.pool.run([str(self.home / "bin" / f"pegasus-{name}"), *args], env=self.env(), check=False,
                             timeout=timeout)


def _flag(argv: Sequence[str], name: str) -> str:
    return argv[list(argv).index(name) + 1]


def _dagman_out(submit_dir: Path) -> Optional[Path]:
    found = sorted(submit_dir.glob("*.dag.dagman.out"))
    return found[0] if found else None


def dagman_status(submit_dir: Path) -> Optional[int]:
    """The status of DAGMan's ``EXITING WITH STATUS`` line, None while it runs."""
    out = _dagman_out(submit_dir)
    if out is None:
        return None
    found = _EXIT.findall(out.read_text(errors="replace"))
    return int(found[-1]) if found else None


def dagman_makespan(submit_dir: Path) -> float:
    """Seconds between the first and the last timestamped line of the dagman.out."""
    out = _dagman_out(submit_dir)
    stamps = []
    for line in (out.read_text(errors="replace").splitlines() if out else []):
        if re.match(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d ", line):
            stamps.append(time.mktime(time.strptime(line[:17], "%m/%d/%y %H:%M:%S")))
    return max(stamps) - min(stamps) if stamps else 0.0


def invocations(submit_dir: Path) -> List[Invocation]:
    """Every kickstart record monitord stored for the run in ``submit_dir``."""
    [db] = sorted(submit_dir.glob("*.stampede.db"))
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT j.exec_job_id, i.transformation, i.executable, i.exitcode, "
            "COALESCE(i.remote_cpu_time, 0), i.remote_duration "
            "FROM invocation i JOIN job_instance ji ON i.job_instance_id = ji.job_instance_id "
            "JOIN job j ON ji.job_id = j.job_id WHERE i.task_submit_seq >= 0 ORDER BY j.exec_job_id").fetchall()
    return [Invocation(str(r[0]), str(r[1]), str(r[2]), int(r[3]), float(r[4]), float(r[5])) for r in rows]


def dagman_retries(submit_dir: Path) -> Dict[str, int]:
    """Jobs DAGMan ran more than once (exec job id -> runs), from the stampede database, with
    every ``Retrying node`` line of the dagman.out (a retry monitord missed still counts)."""
    [db] = sorted(submit_dir.glob("*.stampede.db"))
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT j.exec_job_id, COUNT(*) FROM job_instance ji JOIN job j "
                            "ON ji.job_id = j.job_id GROUP BY j.job_id HAVING COUNT(*) > 1").fetchall()
    retried = {str(job): int(count) for job, count in rows}
    [out] = sorted(submit_dir.glob("*.dag.dagman.out"))
    for node in re.findall(r"Retrying node (\S+)", out.read_text(errors="replace")):
        retried.setdefault(node, 2)
    return retried


def held_jobs(submit_dir: Path) -> List[str]:
    """The jobstate.log lines of jobs HTCondor held (``JOB_HELD``)."""
    return [line for line in (submit_dir / "jobstate.log").read_text(errors="replace").splitlines()
            if " JOB_HELD " in line]


def stock_calls(records: Sequence[Invocation], stock_tool: Path) -> List[Invocation]:
    """The records whose executable is ``stock_tool`` (links resolved, as the job ran it)."""
    stock = os.path.realpath(stock_tool)
    return [r for r in records if os.path.realpath(r.executable) == stock]


# -- an sshd inside the root (submit-host mode) ------------------------------------------------

_SSHD_CONFIG = """\
ListenAddress 127.0.0.1:{port}
HostKey {dir}/host_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {dir}/authorized_keys
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
AllowUsers {user}
UsePAM no
UseDNS no
PrintMotd no
X11Forwarding no
AllowTcpForwarding no
Subsystem sftp internal-sftp
"""


class SshdInRoot:
    """OpenSSH's sshd inside ``pool``'s root on a free 127.0.0.1 port, letting the submitter
    in with ``client_key`` (readable by the submitter only: the planner ships it to jobs).
    Files live in ``directory`` (under ``pool.shared``). Stopped with the pool (its
    namespace) or by `stop`."""

    def __init__(self, pool: CondorPool, directory: Path, *, timeout: float = 30.0) -> None:
        self.pool = pool
        self.dir = directory
        self.port = 0
        self.user = pool.submitter
        self.client_key = directory / "client_key"
        self.timeout = timeout

    def start(self) -> "SshdInRoot":
        self.dir.mkdir(parents=True, exist_ok=True)
        for key in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.dir / key)],
                           check=True, capture_output=True, timeout=60)
        shutil.copyfile(self.dir / "client_key.pub", self.dir / "authorized_keys")
        os.chown(self.client_key, self.pool.submitter_uid, self.pool.submitter_gid)
        os.chmod(self.client_key, 0o600)
        self.port = free_port()
        config = self.dir / "sshd_config"
        config.write_text(_SSHD_CONFIG.format(port=self.port, dir=self.dir, user=self.user))
        self.pool.run(["mkdir", "-p", "-m", "0755", "/run/sshd"], user="root")
        self.pool.run(["/usr/sbin/sshd", "-f", str(config), "-E", str(self.dir / "sshd.log")], user="root")
        self._wait_banner()
        return self

    def _wait_banner(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as conn:
                    if conn.recv(64).startswith(b"SSH-2.0"):
                        return
            except OSError:
                pass
            time.sleep(0.1)
        log = (self.dir / "sshd.log").read_text(errors="replace")[-1500:] if (self.dir / "sshd.log").exists() else ""
        raise PoolError(f"sshd in the pool's root did not answer on 127.0.0.1:{self.port}: {log}")

    def stop(self) -> None:
        pid_file = self.dir / "sshd.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().strip()), 15)
            except (ValueError, ProcessLookupError):
                pass


# -- our wheel with extras under the root's Python --------------------------------------------

WORKER_EXTRAS = ("gcs", "sftp")  # gs:// and scp:// on the workers (submit-host, GCS modes)


def wheelhouse(extras: Sequence[str] = WORKER_EXTRAS, cache: Optional[Path] = None) -> Path:
    """Wheels of the requirements setup.cfg lists for ``extras``, for the root's CPython
    (``pip download`` for that interpreter and platform), once per machine and requirement set,
    under ``cache`` (default: beside the unpacked Pegasus). ``make pool`` fetches them, so tests
    send nothing off the machine."""
    requirements = extra_requirements(extras)
    root = cache or pegasus_cache_dir()
    target = root / f"wheelhouse-cp{_ROOT_PYTHON.replace('.', '')}-{_digest(chr(10).join(requirements))}"
    if (target / ".complete").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    temp = root / f".{target.name}.{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version",
            _ROOT_PYTHON, "--implementation", "cp", "-d", str(temp)]
    for platform in _WHEELHOUSE_PLATFORMS:
        argv += ["--platform", platform]
    done = subprocess.run(argv + requirements, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        shutil.rmtree(temp, ignore_errors=True)
        raise PoolError(f"pip download for Python {_ROOT_PYTHON} failed: {done.stderr.strip()[-1500:]}")
    (temp / ".complete").write_text("\n".join(requirements) + "\n")
    if target.exists():
        shutil.rmtree(target)
    os.replace(temp, target)
    return target


def extra_requirements(extras: Sequence[str]) -> List[str]:
    """The requirement lines of ``extras`` in this checkout's setup.cfg."""
    import configparser

    cfg = configparser.ConfigParser()
    if not cfg.read(Path(__file__).resolve().parent.parent.parent / "setup.cfg"):
        raise PoolError("setup.cfg not found: planned runs need a source checkout")
    table = cfg["options.extras_require"]
    return [line.strip() for name in extras for line in table[name].splitlines() if line.strip()]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def worker_venv(pool: CondorPool, venv: Path, wheel: Path, extras: str = "", wheels: Optional[Path] = None) -> Path:
    """A venv made by the root's ``python3`` at ``venv`` (under ``pool.shared``), with ``wheel``
    installed, and its ``extras`` from ``wheels`` (no index; without ``wheels``, no
    dependencies: the core needs none); returns its ``bin``. pip runs from the pip package of
    this interpreter (pure Python), which must be bound into the root."""
    import pip

    pip_dir = Path(pip.__file__).resolve().parent
    wheel = Path(shutil.copy(wheel, venv.parent))  # readable by the submitter (pytest's tmp is not)
    pool.run(["python3", "-m", "venv", "--without-pip", str(venv)])
    source = ["--find-links", str(wheels), f"{wheel}[{extras}]"] if wheels else ["--no-deps", str(wheel)]
    pool.run([str(venv / "bin" / "python"), str(pip_dir), "install", "--quiet", "--no-index",
                  "--disable-pip-version-check", "--no-cache-dir", *source], timeout=600)
    return venv / "bin"


def main() -> int:
    """``python -m pegasus_cloudio_testbed.pegasus_pool``: unpack Pegasus and fetch the workers'
    wheelhouse (``make pool``), printing where they are."""
    try:
        print(ensure_pegasus())
        print(wheelhouse())
    except (RuntimeError, OSError) as err:
        print(f"planned-run set-up: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
