"""Start-up cost of one job step: our drop-in against the stock tool and a bare interpreter.

Every Pegasus job step starts the transfer tool, on a core the jobs compute on, so the CPU a
step costs before (and while) it moves a few files is a per-job cost. In one run, alternating
the contestants round by round (A B C ..., then the reverse) so that drifting load from
outside falls on all of them alike, each ``--rounds`` times:

* ``python -c pass``: the interpreter's own floor (the venv's Python, ``site`` included);
* stock ``pegasus-transfer`` 5.1.3 (the Python tool Pegasus 5 ships) on an empty input;
* Pegasus's Go ``pegasus-transfer`` (the stock tool to come, :mod:`pegasus_cloudio_bench.go_tool`)
  on an empty input and staging in the same ``--objects``;
* ours (``pegasus-cloudio-transfer`` from a wheel install, :mod:`pegasus_cloudio_testbed.wheel`)
  on an empty input;
* ours staging in ``--objects`` small objects from MinIO (plain HTTP on loopback), node cache
  off, into a fresh directory each time;
* the same handed to a node stager (``pegasus-cloudio stager``): the step's own CPU plus the
  CPU of the stager's forked copy that ran it, by the installed command (the native front
  end, ``native/pegasus_cloudio_transfer.c``) and by the Python client it replaces
  (``pegasus-cloudio-transfer-py``); each also split into the client's and the stager's CPU;
* with ``--before CHECKOUT``, ours from a wheel of another source tree (an earlier commit),
  empty and with the objects: before and after in one run.

CPU is user + system time of the process and its children; medians are reported, with the
ratios the targets name (ours against the stock tool's empty start, in the same run).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

from pegasus_cloudio_bench.go_tool import STOCK_NOTE, go_argv, go_env
from pegasus_cloudio_bench.harness import Progress, make_inputs, measure, ratio, tool_env
from pegasus_cloudio_bench.small_files import BUCKET, IDENTITY, SITE, _positive, transfer_spec
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import TcpProxy
from pegasus_cloudio_testbed.stager import StagerProcess
from pegasus_cloudio_testbed.stock import make_stock_home
from pegasus_cloudio_testbed.wheel import installed_bin

CONTESTANTS = ("python -c pass", "stock empty", "Go empty", "ours empty", "Go objects", "ours objects",
               "ours objects via stager", "ours objects via stager, Python client")
VIA_STAGER = {"ours objects via stager": "pegasus-cloudio-transfer",
              "ours objects via stager, Python client": "pegasus-cloudio-transfer-py"}
EMPTY_TARGET = 0.7  # ours empty <= 0.7x the stock tool's empty start
OBJECTS_TARGET = 1.0  # ours with --objects files <= the stock tool's empty start
GO_STAGER_TARGET = 1.0  # ours via the stager <= the Go tool's CPU for the same objects
GO_OBJECTS_TARGET = 2.0  # ours without the stager <= 2x the Go tool's CPU for the same objects


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=_positive, default=15, help="runs of each contestant (default 15)")
    parser.add_argument("--objects", type=_positive, default=20, help="objects the staging step reads (default 20)")
    parser.add_argument("--size", type=_positive, default=300, help="bytes per object (default 300)")
    parser.add_argument("--threads", type=_positive, default=5, help="--threads of both tools (default 5)")
    parser.add_argument("--before", metavar="CHECKOUT", help="also measure ours from a wheel of this source tree")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="emulated round trip added by the proxy (default 0)")


def run_from_args(args: argparse.Namespace) -> Dict[str, object]:
    return run(args.rounds, args.objects, args.size, args.threads, Progress(), args.before, args.rtt_ms)


Step = Callable[[int], Tuple[float, float]]  # round -> (CPU s, wall s)
Split = Dict[str, Tuple[List[float], List[float]]]  # stager contestant -> (client CPU s, stager CPU s) per round


def run(rounds: int, objects: int, size: int, threads: int, progress: Progress,
        before: Optional[str] = None, rtt_ms: float = 0.0) -> Dict[str, object]:
    root = tempfile.mkdtemp(prefix="pegasus-cloudio-startup-")
    try:
        with MinioServer() as server, TcpProxy((server.host, server.port), delay_ms=rtt_ms / 2) as proxy:
            progress.phase("installing the wheel into a fresh venv")
            bin_dir = installed_bin(os.path.join(root, "wheel"))
            creds = server.write_pegasus_credentials(os.path.join(root, "credentials.conf"), site=SITE,
                                                     user="bench", endpoint=proxy.url())
            env = tool_env({"PEGASUS_CREDENTIALS": str(creds), "PEGASUS_CLOUDIO_CONFIG": os.devnull})
            env.pop("PYTHONPATH", None)  # ours as the wheel installs it, not the checkout
            ours = [os.path.join(bin_dir, "pegasus-cloudio-transfer"), "--threads", str(threads)]
            names = _upload(root, objects, size, ours, env, proxy)
            stock = make_stock_home(os.path.join(root, "stock"))
            with StagerProcess(env, [os.path.join(bin_dir, "pegasus-cloudio")]) as stager:
                split: Split = {name: ([], []) for name in VIA_STAGER}
                steps = _steps(root, bin_dir, ours, names, env, stock, stager, proxy, threads, split)
                if before:
                    old = [os.path.join(installed_bin(os.path.join(root, "before"), before),
                                        "pegasus-cloudio-transfer"), "--threads", str(threads)]
                    steps.update(_before_steps(root, old, names, env, proxy))
                cpu, wall = _alternate(steps, rounds, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    progress.done()
    return dict(report(cpu, wall, rounds, objects, size, threads), rtt_ms=rtt_ms, stager_split_ms_median={
        name: {"client": round(1000 * statistics.median(c), 1), "stager": round(1000 * statistics.median(s), 1)}
        for name, (c, s) in split.items()})


def _upload(root: str, objects: int, size: int, ours: List[str], env: Dict[str, str], proxy: TcpProxy) -> List[str]:
    src, names = make_inputs(root, objects, size)
    mkdir = [{"type": "mkdir", "target": {"site_label": SITE, "url": f"s3://{IDENTITY}/{BUCKET}"}}]
    for stdin in (json.dumps(mkdir).encode(),
                  transfer_spec([(f"file://{src}/{n}", _url(n)) for n in names], "local", SITE)):
        if measure("ours", "setup", 0, ours, env, proxy, stdin=stdin).exit_code != 0:
            raise RuntimeError("uploading the benchmark's objects failed (see above)")
    return names


def _url(name: str) -> str:
    return f"s3://{IDENTITY}/{BUCKET}/startup/{name}"


def _steps(root: str, bin_dir: str, ours: List[str], names: List[str], env: Dict[str, str], stock: object,
           stager: StagerProcess, proxy: TcpProxy, threads: int, split: Split) -> Dict[str, Step]:
    stock_argv = [str(stock.transfer), "--threads", str(threads)]  # type: ignore[attr-defined]
    stock_env = stock.env(env)  # type: ignore[attr-defined]
    staged = dict(env, PEGASUS_CLOUDIO_STAGER=stager.socket_path)
    go, genv = go_argv(threads), go_env(env)

    def run_one(argv: List[str], run_env: Dict[str, str], stdin: bytes) -> Tuple[float, float]:
        done = measure("step", "in", 0, argv, run_env, proxy, stdin=stdin)
        if done.exit_code != 0:
            raise RuntimeError(f"{argv[0]} exited {done.exit_code} (see above)")
        return done.cpu_s, done.wall_s

    def go_objects(n: int) -> Tuple[float, float]:
        dest = os.path.join(root, f"job-go-{n}")
        os.makedirs(dest)
        spec = transfer_spec([(_url(name), f"file://{dest}/{name}") for name in names], SITE, "local")
        cpu, wall = run_one(go, genv, spec)
        shutil.rmtree(dest)
        return cpu, wall

    def objects(n: int, via: str = "") -> Tuple[float, float]:
        """The step in-process, or handed to the stager by command ``via`` (its CPU split kept)."""
        dest = os.path.join(root, f"job-{list(VIA_STAGER).index(via) if via else 'o'}-{n}")
        os.makedirs(dest)
        spec = transfer_spec([(_url(name), f"file://{dest}/{name}") for name in names], SITE, "local")
        served = len(_stager_jobs_cpu_s(stager))
        argv = [os.path.join(bin_dir, VIA_STAGER[via]), *ours[1:]] if via else ours
        cpu, wall = run_one(argv, staged if via else env, spec)
        shutil.rmtree(dest)
        if not via:
            return cpu, wall
        in_stager = _next_job_cpu_s(stager, served)
        split[via][0].append(cpu)
        split[via][1].append(in_stager)
        return cpu + in_stager, wall

    return {
        "python -c pass": lambda n: run_one([os.path.join(bin_dir, "python"), "-c", "pass"], env, b""),
        "stock empty": lambda n: run_one(stock_argv, stock_env, b"[]"),
        "Go empty": lambda n: run_one(go, genv, b"[]"),
        "ours empty": lambda n: run_one(ours, env, b"[]"),
        "Go objects": go_objects,
        "ours objects": lambda n: objects(n),
        **{name: functools.partial(objects, via=name) for name in VIA_STAGER},
    }


def _stager_jobs_cpu_s(stager: StagerProcess) -> List[float]:
    """The CPU seconds of each job the stager has reaped, from its log ("job pid N exited C
    (S s CPU)", from wait4: exact, where /proc's children total moves in clock ticks and only
    once the stager has reaped)."""
    return [float(line.rsplit("(", 1)[1].split()[0]) for line in stager.log_tail(1 << 30).splitlines()
            if " job pid " in line]


def _next_job_cpu_s(stager: StagerProcess, served: int, timeout_s: float = 30.0) -> float:
    """The CPU of the job after the first ``served`` ones, once the stager has logged it."""
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = _stager_jobs_cpu_s(stager)
        if len(jobs) > served:
            return jobs[served]
        if time.monotonic() > deadline:
            raise RuntimeError(f"the stager logged no end of its job {served + 1} within {timeout_s:g} s")
        time.sleep(0.005)


def _before_steps(root: str, old: List[str], names: List[str], env: Dict[str, str],
                  proxy: TcpProxy) -> Dict[str, Step]:
    def run_one(stdin: bytes, dest: Optional[str]) -> Tuple[float, float]:
        done = measure("before", "in", 0, old, env, proxy, stdin=stdin)
        if done.exit_code != 0:
            raise RuntimeError(f"the --before drop-in exited {done.exit_code} (see above)")
        if dest:
            shutil.rmtree(dest)
        return done.cpu_s, done.wall_s

    def objects(n: int) -> Tuple[float, float]:
        dest = os.path.join(root, f"job-b{n}")
        os.makedirs(dest)
        return run_one(transfer_spec([(_url(name), f"file://{dest}/{name}") for name in names], SITE, "local"), dest)

    return {"before: ours empty": lambda n: run_one(b"[]", None), "before: ours objects": objects}


def _alternate(steps: Dict[str, Step], rounds: int, progress: Progress) -> Tuple[Dict[str, List[float]], Dict[str, List[float]]]:
    cpu: Dict[str, List[float]] = {name: [] for name in steps}
    wall: Dict[str, List[float]] = {name: [] for name in steps}
    order = list(steps)
    progress.phase(f"{len(order)} contestants x {rounds} rounds, alternating")
    for n in range(rounds):
        for name in (order if n % 2 == 0 else order[::-1]):
            c, w = steps[name](n)
            cpu[name].append(c)
            wall[name].append(w)
    return cpu, wall


def report(cpu: Dict[str, List[float]], wall: Dict[str, List[float]], rounds: int, objects: int, size: int,
           threads: int) -> Dict[str, object]:
    cpu_ms = {name: round(1000 * statistics.median(v), 1) for name, v in cpu.items()}
    wall_ms = {name: round(1000 * statistics.median(v), 1) for name, v in wall.items()}
    stock = cpu_ms["stock empty"]
    ratios = {f"{name} / stock empty": round(ratio(cpu_ms[name], stock) or 0.0, 2)
              for name in cpu_ms if name != "stock empty"}
    go = cpu_ms["Go objects"]
    ratios.update({f"{name} / Go objects": round(ratio(cpu_ms[name], go) or 0.0, 2)
                   for name in cpu_ms if name.startswith("ours objects")})
    ratios["ours empty / Go empty"] = round(ratio(cpu_ms["ours empty"], cpu_ms["Go empty"]) or 0.0, 2)
    targets = {
        f"ours_empty_within_{EMPTY_TARGET:g}x_stock_empty": ratios["ours empty / stock empty"] <= EMPTY_TARGET,
        f"ours_{objects}_objects_within_stock_empty": ratios["ours objects / stock empty"] <= OBJECTS_TARGET,
        f"ours_{objects}_objects_via_stager_within_{GO_STAGER_TARGET:g}x_go_cpu":
            ratios["ours objects via stager / Go objects"] <= GO_STAGER_TARGET,
        f"ours_{objects}_objects_within_{GO_OBJECTS_TARGET:g}x_go_cpu":
            ratios["ours objects / Go objects"] <= GO_OBJECTS_TARGET,
    }
    return {
        "benchmark": "startup",
        "params": {"rounds": rounds, "objects": objects, "size": size, "threads": threads, "cores": os.cpu_count()},
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpu_ms_median": cpu_ms, "wall_ms_median": wall_ms,
        "cpu_ms_all": {name: [round(1000 * x, 1) for x in v] for name, v in cpu.items()},
        "ratios": ratios, "targets": targets, "notes": [STOCK_NOTE],
    }


def format_table(result: Dict[str, object]) -> str:
    p = result["params"]
    rows = [f"{p['rounds']} alternating rounds, {p['objects']} objects of {p['size']} B, "  # type: ignore[index]
            f"--threads {p['threads']}, {p['cores']} cores; load {result['load_average']}",  # type: ignore[index]
            f"{'contestant':<26} {'CPU ms (median)':>16} {'wall ms (median)':>17}"]
    for name in [*CONTESTANTS, *(n for n in result["cpu_ms_median"] if n not in CONTESTANTS)]:  # type: ignore[attr-defined]
        rows.append(f"{name:<26} {result['cpu_ms_median'][name]:>16.1f} "  # type: ignore[index]
                    f"{result['wall_ms_median'][name]:>17.1f}")  # type: ignore[index]
    for name, cpu in result.get("stager_split_ms_median", {}).items():  # type: ignore[attr-defined]
        rows.append(f"{name}: client {cpu['client']:.1f} ms + stager {cpu['stager']:.1f} ms CPU (medians)")
    rows += [f"{k}: {v}" for k, v in result["ratios"].items()]  # type: ignore[attr-defined]
    rows += [f"target {k}: {'met' if v else 'NOT MET'}" for k, v in result["targets"].items()]  # type: ignore[attr-defined]
    rows += [f"note: {note}" for note in result.get("notes", [])]  # type: ignore[attr-defined]
    return "\n".join(rows)
