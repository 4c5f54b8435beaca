"""A real ``pegasus-cloudio stager`` process for tests and benchmarks.

``StagerProcess(env).start()`` runs the stager on a socket in a private temp directory and
waits until it accepts connections; ``socket_path`` is what jobs put in
``PEGASUS_CLOUDIO_STAGER``; ``children_cpu_s()`` is the CPU its finished jobs used (from
``/proc``), so a benchmark can charge staging CPU that ran in the stager to the jobs.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Mapping, Optional, Sequence

from .process import ServerProcess, process_cpu_s

__all__ = ["StagerProcess"]

_START_TIMEOUT_S = 30.0


class StagerProcess(ServerProcess):
    LOG_NAME = "stager.log"

    def __init__(self, env: Optional[Mapping[str, str]] = None, command: Sequence[str] = ()) -> None:
        """``command``: the ``pegasus-cloudio`` command to run (default: this interpreter's)."""
        super().__init__()
        self._env = dict(os.environ if env is None else env)
        self._command = list(command) or [sys.executable, "-m", "pegasus_cloudio.cli"]
        self.socket_path = ""

    def start(self) -> "StagerProcess":
        tmp = self._make_tmp("pegasus-cloudio-stager-")
        os.chmod(tmp, 0o700)
        self.socket_path = str(tmp / "stager.sock")
        self._spawn_logged([*self._command, "stager", "--socket", self.socket_path], self._env)
        if not self._wait_until(time.monotonic() + _START_TIMEOUT_S, self._accepts):
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"pegasus-cloudio stager did not start:\n{tail}")
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def children_cpu_s(self) -> float:
        """User + system CPU seconds of the jobs the stager has reaped so far."""
        return process_cpu_s(self.pid, children=True)

    def _accepts(self) -> bool:
        return os.path.exists(self.socket_path) and " stager: serving " in self.log_tail(5)
