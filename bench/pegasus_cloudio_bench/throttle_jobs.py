"""N staging jobs released together against one store, and what each of them got.

`run_wave` starts every job's process at once (as a pool's slots would when a wave of jobs
lands), feeds each its input, waits for all of them (a job still running at the deadline is
killed and counts as failed) and checks every file each job should have written, byte for
byte. Used by ``pegasus-cloudio bench throttle``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

__all__ = ["Job", "JobResult", "Wave", "run_wave"]

_STDERR_TAIL = 2000


@dataclass(frozen=True)
class Job:
    """One job: its command, input on stdin, environment, and the files it must leave behind
    (destination path -> source path holding the expected bytes)."""

    argv: Sequence[str]
    stdin: bytes
    env: Mapping[str, str]
    expected: Mapping[str, str]
    cwd: Optional[str] = None


@dataclass(frozen=True)
class JobResult:
    exit_code: int
    wall_s: float
    missing: int          # expected files absent or not byte-identical
    stderr_tail: str


@dataclass(frozen=True)
class Wave:
    wall_s: float         # first start to last exit
    jobs: List[JobResult]

    @property
    def failed(self) -> int:
        """Jobs that exited non-zero or left a file missing or wrong."""
        return sum(1 for job in self.jobs if job.exit_code != 0 or job.missing)

    @property
    def missing(self) -> int:
        return sum(job.missing for job in self.jobs)

    @property
    def slowest_s(self) -> float:
        return max((job.wall_s for job in self.jobs), default=0.0)


def run_wave(jobs: Sequence[Job], timeout_s: float) -> Wave:
    """Run ``jobs`` at once; never raises for a job's failure (it is reported)."""
    started = time.monotonic()
    deadline = started + timeout_s
    procs = [subprocess.Popen(list(job.argv), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, env=dict(job.env), cwd=job.cwd, start_new_session=True)
             for job in jobs]
    results: Dict[int, JobResult] = {}
    threads = [threading.Thread(target=_finish, args=(i, proc, job, started, deadline, results), daemon=True)
               for i, (proc, job) in enumerate(zip(procs, jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - started
    return Wave(wall, [results[i] for i in range(len(jobs))])


def _finish(index: int, proc: "subprocess.Popen[bytes]", job: Job, started: float, deadline: float,
            results: Dict[int, JobResult]) -> None:
    try:
        _, err = proc.communicate(job.stdin, timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the tool and whatever it started
        _, err = proc.communicate()
        err += b"\nkilled at the wave's deadline"
    wall = time.monotonic() - started
    results[index] = JobResult(proc.returncode, wall, count_missing(job.expected),
                               err[-_STDERR_TAIL:].decode(errors="replace"))


def count_missing(expected: Mapping[str, str]) -> int:
    """Destinations that are absent or differ from their source's bytes."""
    missing = 0
    for dest, source in expected.items():
        try:
            with open(dest, "rb") as got, open(source, "rb") as want:
                same = got.read() == want.read()
        except OSError:
            same = False
        missing += 0 if same else 1
    return missing
