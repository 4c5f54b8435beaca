"""What the test-bed servers share: a child-process lifecycle, stopping, probing HTTP."""

from __future__ import annotations

import abc
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Callable, Mapping, Optional, Sequence, Type, TypeVar, Union

STOP_GRACE_S = 10.0
_S = TypeVar("_S", bound="ServerProcess")


def terminate(proc: "subprocess.Popen[bytes]", grace: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; always reaps the process."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def answers_ok(url: str, context: Optional[ssl.SSLContext] = None) -> bool:
    """True when GET ``url`` answers 200 within two seconds."""
    try:
        with urllib.request.urlopen(url, timeout=2.0, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def process_cpu_s(pid: int, children: bool = False) -> float:
    """User + system CPU seconds of process ``pid`` (``children``: of its reaped children
    instead), from ``/proc``."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    first = 13 if children else 11  # utime stime, or cutime cstime (fields 14-17 of proc(5))
    return (int(fields[first]) + int(fields[first + 1])) / os.sysconf("SC_CLK_TCK")


class ServerProcess(abc.ABC):
    """A server child process with a private temp dir and a combined stdout/stderr log.

    Subclasses set ``LOG_NAME`` (and ``STOP_GRACE``), and implement `start` with
    `_make_tmp`, `_spawn_logged` and `_wait_until`. `stop` is idempotent and safe on a
    server that never started: it stops the process and deletes the temp dir.
    """

    LOG_NAME = "server.log"
    STOP_GRACE = STOP_GRACE_S

    def __init__(self) -> None:
        self._tmp: Optional[Path] = None
        self._proc: Optional["subprocess.Popen[bytes]"] = None
        self._log: Optional[IO[bytes]] = None

    @abc.abstractmethod
    def start(self: _S) -> _S:
        """Start the server and wait until it is ready; RuntimeError with the log tail if not."""

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.stop()

    def cpu_s(self) -> float:
        """CPU seconds the running server has used so far (0 when it is not running)."""
        return process_cpu_s(self._proc.pid) if self._proc is not None else 0.0

    @property
    def log_file(self) -> Optional[Path]:
        """The server's log while it runs."""
        return self._tmp / self.LOG_NAME if self._tmp is not None else None

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server log ("" if there is none)."""
        path = self.log_file
        if path is None or not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        self._discard_process()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _make_tmp(self, prefix: str, base_dir: Optional[Union[str, "os.PathLike[str]"]] = None) -> Path:
        if self._proc is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        self._tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=base_dir))
        return self._tmp

    def _spawn_logged(self, cmd: Sequence[str], env: Mapping[str, str]) -> None:
        """Start ``cmd`` in the temp dir with stdout and stderr appended to the log."""
        assert self._tmp is not None
        if self._log is not None:
            self._log.close()
        self._log = open(self._tmp / self.LOG_NAME, "ab")
        self._proc = subprocess.Popen(list(cmd), env=dict(env), stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, cwd=str(self._tmp))

    def _wait_until(self, deadline: float, ready: Callable[[], bool], poll: float = 0.05) -> bool:
        """Poll ``ready`` until it is true; False if the process exits or time runs out."""
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            if ready():
                return True
            time.sleep(poll)
        return False

    def _before_stop(self, proc: "subprocess.Popen[bytes]") -> None:
        """Hook run before the process is terminated."""

    def _discard_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            self._before_stop(proc)
            terminate(proc, self.STOP_GRACE)
        if self._log is not None:
            self._log.close()
            self._log = None
