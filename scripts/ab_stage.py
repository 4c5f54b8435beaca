"""Many small files in and out, wheels of two source trees, alternating, on one MinIO.

    .venv/bin/python scripts/ab_stage.py BEFORE_TREE [--count 6173] [--size 300] [--rounds 5] [--json]
                                         [--bundles] [--instructions | --syscalls]

``BEFORE_TREE`` is a source checkout (``git archive 7437202 | tar -x -C DIR``); the other
contestant is this checkout. Each round runs, with each wheel's ``pegasus-cloudio-transfer``
(5 threads, the users' defaults otherwise): ``--count`` objects of ``--size`` bytes staged in
with the node cache on and empty (every file a miss, a first job on a node), the same with
the cache off, and the same files staged out to a fresh prefix; the trees take turns at going
first. With ``--bundles``, bundling is on for every run: the objects go up packed into bundles,
the stage-ins read them as members, the stage-out packs. The figures are each process's wall time and user + system CPU (``wait4``), and the
CPU of what it leaves running behind (the child that fills the node cache after the job's
answer, waited for before the next run starts: this script is their subreaper), medians over
the rounds, and this tree's over the other's: a development A/B for changes to requests,
connections and the cache, beside ``pegasus-cloudio bench small-files``, which races the
stock tools.

CPU seconds of one run move 0.5-2x on a shared machine of 2 cores, too much to tell 5% apart
in a few rounds. ``--instructions`` counts user-space instructions instead, which load does not
move: every run goes under valgrind's callgrind (about 50x slower; one round is enough), the
job's count is what it ran before and after its fork, the child's what it ran after (callgrind
dumps at ``fork``, so the child's file holds only its own). The kernel's part is not counted:
``--syscalls`` counts it the same way, in system calls, every run under ``strace -ff``
(a child is a process a ``clone`` without ``CLONE_THREAD`` made, its calls counted from its
first). The figures are then instructions or system calls, not CPU seconds
(``job_instructions``, ``behind_instructions``; ``job_syscalls``, ``behind_syscalls``).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Set, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout: the "this" contestant
sys.path.insert(0, HERE)

from pegasus_cloudio_bench.harness import ab_wheels, make_inputs  # noqa: E402
from pegasus_cloudio_bench.small_files import BUCKET, IDENTITY, SITE, transfer_spec  # noqa: E402
from pegasus_cloudio_testbed.minio import MinioServer  # noqa: E402

STEPS = ("in, cache on (all misses)", "in, cache off", "out")


_SERVERS: Set[int] = set()  # our children before the first run: MinIO


def _subreaper() -> None:
    """Become the reaper of our orphans: the child a drop-in forks to fill the node cache after
    its answer then ends here, where :func:`_reap` waits for it and counts its CPU."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise SystemExit(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")


def _children() -> Set[int]:
    found: Set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as fh:
            found.update(int(pid) for pid in fh.read().split())
    return found


def _reap() -> float:
    """Wait for every orphan a run left (a cache-filling child; not the servers started before
    the runs, :data:`_SERVERS`) and return their CPU seconds."""
    cpu = 0.0
    while True:
        left = _children() - _SERVERS
        if not left:
            return cpu
        for pid in left:
            try:
                _, _, usage = os.wait4(pid, 0)
            except ChildProcessError:
                continue
            cpu += usage.ru_utime + usage.ru_stime


COUNTERS = {  # what counts a run's work (see the module docstring): its command's prefix, its files
    "instructions": ["valgrind", "-q", "--tool=callgrind", "--trace-children=yes", "--dump-before=fork",
                     "--callgrind-out-file={dir}/cg.%p"],
    "syscalls": ["strace", "-f", "-qq", "-ff", "-o", "{dir}/st"],
}


def _instructions(files: List[str], job: int) -> Tuple[int, int]:
    """(the job's, its children's) instructions in callgrind's output ``files`` (``totals:``
    lines; a file is named by the process's id)."""
    counted = {True: 0, False: 0}
    for path in files:
        with open(path) as fh:
            counted[os.path.basename(path).split(".")[1] == str(job)] += sum(
                int(line.split()[1]) for line in fh if line.startswith("totals:"))
    return counted[True], counted[False]


def _syscalls(files: List[str], job: int) -> Tuple[int, int]:
    """(the job's, its children's) system calls in ``strace -ff``'s ``files`` (one per thread,
    named by its id): a child is a thread id a ``clone`` without ``CLONE_THREAD`` returned,
    and the threads of the job are every other file."""
    calls: Dict[int, int] = {}
    forked: Set[int] = set()
    for path in files:
        tid = int(os.path.basename(path).split(".")[1])
        with open(path, errors="replace") as fh:
            for line in fh:
                if line.startswith(("+++", "---")):
                    continue
                calls[tid] = calls.get(tid, 0) + 1
                if line.startswith(("clone(", "clone3(", "fork(", "vfork(")) and "CLONE_THREAD" not in line:
                    result = line.rsplit("=", 1)[-1].split()
                    if result and result[0].isdigit():
                        forked.add(int(result[0]))
    behind = sum(n for tid, n in calls.items() if tid in forked)
    return sum(calls.values()) - behind, behind


def _run(bin_dir: str, spec: bytes, env: Dict[str, str], cwd: str,
         counter: Optional[Tuple[str, str]] = None) -> Tuple[float, float, float]:
    """(wall s, CPU s, CPU s of what it left running behind) of one drop-in run: the next run
    starts only once those have ended. Exits naming the step when it fails. With ``counter``
    (a key of :data:`COUNTERS` and an empty directory for its files), the two CPU figures are
    what it counts instead (see the module docstring)."""
    command = [os.path.join(bin_dir, "pegasus-cloudio-transfer"), "--threads", "5"]
    if counter is not None:
        command = [arg.format(dir=counter[1]) for arg in COUNTERS[counter[0]]] + command
    started = time.monotonic()
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env, cwd=cwd)
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(spec)
    proc.stdin.close()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"{bin_dir}: a run failed: {err.decode()[-2000:]}")
    wall, cpu = time.monotonic() - started, usage.ru_utime + usage.ru_stime
    behind = _reap()
    if counter is None:
        return wall, cpu, behind
    files = glob.glob(os.path.join(counter[1], "*"))
    job, children = (_instructions if counter[0] == "instructions" else _syscalls)(files, proc.pid)
    for path in files:
        os.unlink(path)
    return wall, float(job), float(children)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="source checkout to compare with this one")
    parser.add_argument("--count", type=int, default=6173)
    parser.add_argument("--size", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--bundles", action="store_true",
                        help="bundling on (PEGASUS_CLOUDIO_BUNDLE=1): the files go up packed, and are read as members")
    counting = parser.add_mutually_exclusive_group()
    counting.add_argument("--instructions", action="store_true",
                          help="count user-space instructions under callgrind instead of CPU seconds")
    counting.add_argument("--syscalls", action="store_true", help="count system calls under strace instead")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="ab-stage-")
    unit = "instructions" if args.instructions else "syscalls" if args.syscalls else None
    counter = (unit, os.path.join(root, "counts")) if unit else None
    if counter is not None:
        os.mkdir(counter[1])
    trees = {"before": os.path.abspath(args.before), "this": HERE}
    found: Dict[Tuple[str, str], List[Tuple[float, float, float]]] = {}
    _subreaper()
    try:
        with MinioServer() as server:
            env, bins = ab_wheels(server, root, trees, SITE)
            if args.bundles:
                env = dict(env, PEGASUS_CLOUDIO_BUNDLE="1")
            _SERVERS.update(_children())
            src, names = make_inputs(root, args.count, args.size)

            def url(prefix: str, name: str) -> str:
                return f"s3://{IDENTITY}/{BUCKET}/{prefix}/{name}"

            _run(bins["this"], json.dumps([{"type": "mkdir", "target": {"site_label": SITE,
                                                                          "url": f"s3://{IDENTITY}/{BUCKET}"}}]).encode(),
                 env, root)
            _run(bins["this"], transfer_spec([(f"file://{src}/{n}", url("in", n)) for n in names], "local", SITE),
                 dict(env, PEGASUS_CLOUDIO_CACHE_DIR="off"), src)
            for r in range(args.rounds):
                # the trees take turns at going first: a drift over the rounds weighs on neither
                for name, bin_dir in (list(bins.items()) if r % 2 == 0 else list(bins.items())[::-1]):
                    job = os.path.join(root, f"{name}-{r}")
                    cache = os.path.join(root, f"cache-{name}-{r}")
                    steps = (
                        (transfer_spec([(url("in", n), f"file://{job}/on/{n}") for n in names], SITE, "local"),
                         dict(env, PEGASUS_CLOUDIO_CACHE_DIR=cache)),
                        (transfer_spec([(url("in", n), f"file://{job}/off/{n}") for n in names], SITE, "local"),
                         dict(env, PEGASUS_CLOUDIO_CACHE_DIR="off")),
                        (transfer_spec([(f"file://{src}/{n}", url(f"out-{name}-{r}", n)) for n in names], "local", SITE),
                         dict(env, PEGASUS_CLOUDIO_CACHE_DIR=cache)),
                    )
                    for step, (spec, step_env) in zip(STEPS, steps):
                        found.setdefault((name, step), []).append(_run(bin_dir, spec, step_env, src, counter))
                    shutil.rmtree(job, ignore_errors=True)
                    shutil.rmtree(cache, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    cpu_key, behind_key = (f"job_{unit}", f"behind_{unit}") if unit else ("cpu_s", "behind_cpu_s")
    digits = 0 if unit else 3
    rows: Dict[str, Dict[str, object]] = {}
    for step in STEPS:
        row: Dict[str, object] = {}
        for name in trees:
            row[name] = {"wall_s": statistics.median(w for w, _, _ in found[(name, step)]),
                         cpu_key: statistics.median(c for _, c, _ in found[(name, step)]),
                         behind_key: statistics.median(b for _, _, b in found[(name, step)])}
        this, before = found[("this", step)], found[("before", step)]
        row["wall_ratio"] = statistics.median(w for w, _, _ in this) / statistics.median(w for w, _, _ in before)
        row["cpu_ratio"] = statistics.median(c for _, c, _ in this) / statistics.median(c for _, c, _ in before)
        behind_before = statistics.median(b for _, _, b in before)
        if behind_before:
            row["behind_ratio"] = statistics.median(b for _, _, b in this) / behind_before
        row["per_round"] = {name: [[round(w, 3), round(c, digits), round(b, digits)] for w, c, b in found[(name, step)]]
                            for name in trees}  # [wall, CPU, behind CPU] of each round, in order
        rows[step] = row
    result = {"count": args.count, "size": args.size, "rounds": args.rounds, "bundles": args.bundles,
              "load": os.getloadavg()[0],
              "unit": unit or "CPU seconds", "steps": rows}
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        for step in STEPS:
            row = rows[step]
            b, t = (row[n][cpu_key] for n in ("before", "this"))  # type: ignore[index]
            bb, tb = (row[n][behind_key] for n in ("before", "this"))  # type: ignore[index]
            print(f"{step:28s} job: before {b:.6g} this {t:.6g} {unit or 's CPU'} ({row['cpu_ratio']:.3f}x)   "
                  f"behind: before {bb:.6g} this {tb:.6g} ({row.get('behind_ratio', float('nan')):.3f}x)   "
                  f"wall {row['wall_ratio']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
