"""A Montage-shaped DAG and a slot scheduler that runs it the way PegasusLite runs jobs.

The DAG is the one of ``examples/montage_like``: ``producers`` jobs (mProject) each read the
header ``region.hdr`` and write ``files`` small files; one job (mConcatFit) reads all of them
and writes ``fits.tbl``. A job is released when every job it depends on has finished.

`run_dag` runs it on ``slots`` worker slots spread round-robin over ``nodes`` simulated nodes
(slot ``i`` is on node ``i % nodes``). Each job, like PegasusLite, makes a fresh work
directory on its node, stages its inputs in, runs its executable, stages its outputs out and
removes the directory; how a job stages is a `Stager` (a staging mode of the benchmark).
The executable burns ``compute_s`` of CPU time (not a sleep: the CPU it takes from staging
on a busy node is part of what is measured), then does the job's file I/O.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple, Union

HEADER = "region.hdr"
RESULT = "fits.tbl"

# The job executable: burn CPU time, then produce (project) or concatenate (concat). Run with
# ``python -I -S`` so its start-up is close to a compiled program's.
_COMPUTE = r"""
import os, sys, time
kind, burn = sys.argv[1], float(sys.argv[2])
end = time.process_time() + burn
x = 0
while time.process_time() < end:
    for i in range(20000):
        x += i * i
if kind == "project":
    prefix, count, size = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    head = open("region.hdr", "rb").read(200)
    for i in range(count):
        body = head + ("\n%s %d\n" % (prefix, i)).encode()
        with open("%s_%03d.fits" % (prefix, i), "wb") as fh:
            fh.write((body * (size // len(body) + 1))[:size])
else:
    names = sys.argv[3:]
    with open("fits.tbl.tmp", "wb") as out:
        for name in names:
            with open(name, "rb") as fh:
                out.write(fh.read())
    os.replace("fits.tbl.tmp", "fits.tbl")
"""


@dataclass(frozen=True)
class Job:
    """One job: its id, executable arguments, input and output file names, parents."""

    id: str
    args: List[str]
    inputs: List[str]
    outputs: List[str]
    parents: List[str] = field(default_factory=list)


def montage_like(producers: int, files: int, size: int) -> List[Job]:
    """The example's DAG: ``producers`` x ``files`` files of ``size`` bytes into one concat."""
    jobs: List[Job] = []
    small: List[str] = []
    for p in range(producers):
        prefix = f"p{p:04d}"
        outputs = [f"{prefix}_{i:03d}.fits" for i in range(files)]
        small += outputs
        jobs.append(Job(f"project_{p:04d}", ["project", prefix, str(files), str(size)], [HEADER], outputs))
    jobs.append(Job("concat", ["concat", *small], small, [RESULT], [j.id for j in jobs]))
    return jobs


def expected_result(jobs: Sequence[Job], header: bytes, size: int) -> bytes:
    """What ``fits.tbl`` must hold after a correct run (computed without running anything)."""
    parts = []
    for job in jobs:
        if job.args[0] == "project":
            prefix, count = job.args[1], int(job.args[2])
            for i in range(count):
                body = header[:200] + f"\n{prefix} {i}\n".encode()
                parts.append((body * (size // len(body) + 1))[:size])
    return b"".join(parts)


class Stager(Protocol):
    """How jobs get their inputs and put their outputs: one per benchmark mode.

    ``stage_in`` / ``stage_out`` run in the job's work directory ``workdir`` on node
    ``node``, return the CPU seconds they took and raise `JobFailed`. ``shared_dir`` is not None for VM-local storage: the job
    then runs in that directory and nothing is staged.
    """

    @property
    def shared_dir(self) -> Optional[str]: ...

    def stage_in(self, job: Job, node: int, workdir: str) -> float: ...

    def stage_out(self, job: Job, node: int, workdir: str) -> float: ...


class JobFailed(RuntimeError):
    """A job step exited non-zero; the message names the job, the step and the error tail."""


def run_step(job: Job, step: str, argv: Sequence[str], cwd: str, env: Dict[str, str],
             stdin: Optional[bytes] = None) -> float:
    """Run one step of a job; return the CPU seconds (user + system) it took.

    Raises `JobFailed` with its output's tail when it fails. The child is reaped with
    ``wait4`` so its CPU is its own even while other jobs' steps run in other threads.
    """
    with tempfile.TemporaryFile() as output:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=output, stderr=output,
                                cwd=cwd, env=env)
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin or b"")
        except BrokenPipeError:
            pass
        proc.stdin.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            output.seek(0)
            tail = output.read().decode(errors="replace").strip().splitlines()[-4:]
            raise JobFailed(f"job {job.id}: {step} exited {proc.returncode}: " + " | ".join(tail))
    return usage.ru_utime + usage.ru_stime


@dataclass
class JobTiming:
    """When one job ran and where: seconds from the start of the DAG."""

    id: str
    node: int
    slot: int
    start: float
    staged_in: float
    computed: float
    end: float
    staging_cpu_s: float = 0.0  # stage-in plus stage-out, user + system

    def as_dict(self) -> Dict[str, object]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def _compute(job: Job, workdir: str, compute_s: float, env: Dict[str, str]) -> None:
    argv = [sys.executable, "-I", "-S", "-c", _COMPUTE, job.args[0], str(compute_s), *job.args[1:]]
    run_step(job, "compute", argv, workdir, env)



def run_job(job: Job, stager: Stager, node: int, root: str, compute_s: float,
            env: Dict[str, str], clock: Callable[[], float], slot: int) -> JobTiming:
    """Everything PegasusLite does for one job, timed."""
    start = clock()
    if stager.shared_dir is not None:
        _compute(job, stager.shared_dir, compute_s, env)
        now = clock()
        return JobTiming(job.id, node, slot, start, start, now, now)
    workdir = os.path.join(root, f"node{node}", "jobs", job.id)
    os.makedirs(workdir)
    try:
        cpu = stager.stage_in(job, node, workdir)
        staged_in = clock()
        _compute(job, workdir, compute_s, env)
        computed = clock()
        cpu += stager.stage_out(job, node, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return JobTiming(job.id, node, slot, start, staged_in, computed, clock(), cpu)


def run_dag(jobs: Sequence[Job], stager: Stager, *, slots: int, nodes: int, root: str,
            compute_s: float, env: Dict[str, str],
            stop: Optional[Callable[[List["JobTiming"], float], bool]] = None) -> List[JobTiming]:
    """Run ``jobs`` on the slots; return the timings of the jobs that ran.

    Ready jobs start in DAG order as slots free up. ``stop(timings, elapsed)``, asked after
    each job, may end the run early (no new jobs start; running ones finish). The first
    failing job stops the run the same way and its `JobFailed` is raised.
    """
    started = time.monotonic()

    def clock() -> float:
        return time.monotonic() - started

    stopping = False
    waiting = {j.id: set(j.parents) for j in jobs}
    by_id = {j.id: j for j in jobs}
    done: "queue.Queue[Tuple[int, Union[JobTiming, BaseException]]]" = queue.Queue()
    free = list(range(slots))
    timings: List[JobTiming] = []

    def work(job: Job, slot: int) -> None:
        try:
            done.put((slot, run_job(job, stager, slot % nodes, root, compute_s, env, clock, slot)))
        except BaseException as err:  # noqa: BLE001 - handed to the scheduler thread
            done.put((slot, err))

    running = 0
    failure: Optional[BaseException] = None
    while True:
        ready = [i for i, deps in waiting.items() if not deps]
        while ready and free and not stopping and failure is None:
            job_id = ready.pop(0)
            del waiting[job_id]
            threading.Thread(target=work, args=(by_id[job_id], free.pop(0)), daemon=True).start()
            running += 1
        if running == 0:
            break
        slot, outcome = done.get()
        running -= 1
        free.append(slot)
        free.sort()
        if isinstance(outcome, BaseException):
            failure = failure or outcome
            continue
        timings.append(outcome)
        stopping = stopping or (stop is not None and stop(timings, clock()))
        for deps in waiting.values():
            deps.discard(outcome.id)
    if failure is not None:
        raise failure
    return timings
