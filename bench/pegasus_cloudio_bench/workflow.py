"""Workflow makespan: the Montage-shaped DAG staged four ways, against VM-local storage.

The DAG of ``examples/montage_like`` (``--producers`` jobs each writing ``--files`` small
files, one job reading them all) runs on ``--slots`` worker slots spread over ``--nodes``
simulated nodes, each node with its own cache directory. Each job does what PegasusLite does:
stage-in with a transfer tool, compute (a CPU burn of ``--compute`` seconds of CPU time, then
the job's file I/O), stage-out. The store is MinIO behind the test proxy at ``--rtt-ms``.

Modes, in one run: stock ``pegasus-transfer`` (5.1.3, the Python tool Pegasus 5 ships); Pegasus's
Go ``pegasus-transfer`` (the stock tool to come, :mod:`pegasus_cloudio_bench.go_tool`); ours per file; ours with bundles and
the node cache; the same with a node stager per node (``pegasus-cloudio stager``: the jobs'
drop-in hands its work to one long-lived process per node, so no job pays Python's start-up;
the stagers' CPU is charged to the jobs); VM-local storage (every job runs in one local
directory, nothing staged).
When the stock run would pass ``--stock-budget`` seconds, it stops once at least 20% of the
jobs have run and its makespan is extrapolated by job count: a lower bound, since the jobs
that never ran include the concat job, which reads every file (the result marks it
``makespan_lower_bound``; its ratio goes to ``ratios_lower_bound``, never among the figures,
and its result is not checked, which ``results_correct`` reports as not checked, not met).
Requests and bytes are counted at the proxy, the same way for every mode. Each run also gives
its serial tail (:func:`tail`: the concat job's steps after the last producer, the part of the
makespan no other job's compute hides, where a tool's round trips show) and the 1-minute load
before and after it: on shared cores the load, not the tool, can decide a round. Our drop-in and
stager are the commands a wheel install gives users (:mod:`pegasus_cloudio_testbed.wheel`:
from a checkout, a wheel built from it in a fresh venv), not an editable install, whose import
hook would cost every job step about 8 ms of CPU that users never pay.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pegasus_cloudio_bench.dag import (
    HEADER, RESULT, Job, JobTiming, expected_result, montage_like, run_dag, run_step,
)
from pegasus_cloudio_bench.go_tool import go_argv, go_env
from pegasus_cloudio_bench.harness import Progress, measure, ratio, tool_env, wire_moved
from pegasus_cloudio_bench.small_files import BUCKET, IDENTITY, SITE, _positive, ours_argv, transfer_spec
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import Shaping, TcpProxy
from pegasus_cloudio_testbed.stager import StagerProcess
from pegasus_cloudio_testbed.stock import make_stock_home
from pegasus_cloudio_testbed.wheel import installed_bin

MODES = ("stock", "go", "per-file", "bundles+cache", "stager", "vm-local")
# Issue 24's targets at 0.5 s of compute: the drop-in alone (bundles + cache), and with the stager.
TARGET_RATIOS = {"bundles+cache": 1.3, "stager": 1.1}
# Issue 38's, against the Go tool's makespan at 0.5 s of compute.
GO_TARGET_RATIOS = {"bundles+cache": 0.8, "stager": 0.75}
HEADER_TEXT = b"SIMPLE  = T\nNAXIS   = 2\nCTYPE1  = 'RA---TAN'\nCTYPE2  = 'DEC--TAN'\nEND\n"


@dataclass(frozen=True)
class Params:
    producers: int = 32
    files: int = 20
    size: int = 300
    slots: int = 8
    nodes: int = 4
    threads: int = 5
    computes: Tuple[float, ...] = (0.5, 5.0)
    rtt_ms: float = 20.0
    modes: Tuple[str, ...] = MODES
    stock_budget_s: float = 1800.0
    repeats: int = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--producers", type=_positive, default=32, help="producer jobs (default 32)")
    parser.add_argument("--files", type=_positive, default=20, help="small files per producer (default 20)")
    parser.add_argument("--size", type=_positive, default=300, help="bytes per small file (default 300)")
    parser.add_argument("--slots", type=_positive, default=8, help="worker slots (default 8)")
    parser.add_argument("--nodes", type=_positive, default=4, help="simulated nodes (default 4)")
    parser.add_argument("--threads", type=_positive, default=5, help="transfer threads per job (default 5)")
    parser.add_argument("--compute", type=float, action="append",
                        help="CPU seconds per job; repeatable (default 0.5 and 5)")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="round trip added by the proxy (default 20)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--repeats", type=_positive, default=2,
                        help="rounds of our modes and VM-local, in alternating order; the fastest of each is "
                             "reported (default 2; stock runs once)")
    parser.add_argument("--stock-budget", type=float, default=1800.0,
                        help="seconds past which the stock run is sampled and extrapolated (default 1800)")


def run_from_args(args: argparse.Namespace) -> Dict[str, object]:
    modes = tuple(m for m in args.modes.split(",") if m)
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f"pegasus-cloudio bench workflow: unknown mode(s) {', '.join(unknown)}")
    params = Params(args.producers, args.files, args.size, args.slots, args.nodes, args.threads,
                    tuple(args.compute or (0.5, 5.0)), args.rtt_ms, modes, args.stock_budget, args.repeats)
    return run(params, Progress())


class ToolStager:
    """Stage with a pegasus-transfer-compatible command, files in ``s3://.../<prefix>/``."""

    shared_dir: Optional[str] = None

    def __init__(self, argv: Sequence[str], env_of_node: Sequence[Dict[str, str]], prefix: str) -> None:
        self._argv = list(argv)
        self._env_of_node = env_of_node
        self._prefix = prefix

    def url(self, name: str) -> str:
        return f"s3://{IDENTITY}/{BUCKET}/{self._prefix}/{name}"

    def stage_in(self, job: Job, node: int, workdir: str) -> float:
        pairs = [(self.url(n), f"file://{workdir}/{n}") for n in job.inputs]
        return run_step(job, "stage-in", self._argv, workdir, self._env_of_node[node], transfer_spec(pairs, SITE, "local"))

    def stage_out(self, job: Job, node: int, workdir: str) -> float:
        pairs = [(f"file://{workdir}/{n}", self.url(n)) for n in job.outputs]
        return run_step(job, "stage-out", self._argv, workdir, self._env_of_node[node], transfer_spec(pairs, "local", SITE))


class LocalStager:
    """VM-local storage: every job runs in one directory on the local disk."""

    def __init__(self, shared_dir: str) -> None:
        self.shared_dir: Optional[str] = shared_dir

    def stage_in(self, job: Job, node: int, workdir: str) -> float:
        """Nothing to do: the inputs are already there."""
        return 0.0

    def stage_out(self, job: Job, node: int, workdir: str) -> float:
        """Nothing to do: the outputs stay where the next job reads them."""
        return 0.0


class Bed:
    """The store, the proxy, credentials and the per-mode environments of one run."""

    def __init__(self, root: str, params: Params, server: MinioServer, proxy: TcpProxy) -> None:
        self.root, self.params, self.server, self.proxy = root, params, server, proxy
        creds = server.write_pegasus_credentials(os.path.join(root, "credentials.conf"), site=SITE,
                                                 user="bench", endpoint=proxy.url())
        self.env = tool_env({"PEGASUS_CREDENTIALS": str(creds), "PEGASUS_CLOUDIO_CONFIG": os.devnull})
        self.stock = make_stock_home(os.path.join(root, "stock"))
        self.stock_env = self.stock.env(self.env)
        self.bin_dir = installed_bin(os.path.join(root, "wheel"))  # ours as users install it
        self.installed_env = {k: v for k, v in self.env.items() if k != "PYTHONPATH"}

    def ours(self, args: Sequence[str], stdin: bytes) -> None:
        done = measure("ours", "setup", 0, ours_argv(self.params.threads) + list(args), self.env, self.proxy,
                       stdin=stdin)
        if done.exit_code != 0:
            raise RuntimeError("benchmark set-up transfer failed (see above)")

    def stager(self, mode: str, prefix: str, sockets: Sequence[str] = ()) -> Any:
        p = self.params
        if mode == "vm-local":
            shared = os.path.join(self.root, prefix)
            os.makedirs(shared)
            with open(os.path.join(shared, HEADER), "wb") as fh:
                fh.write(HEADER_TEXT)
            return LocalStager(shared)
        header = os.path.join(self.root, HEADER)
        with open(header, "wb") as fh:
            fh.write(HEADER_TEXT)
        stager = ToolStager([], [], prefix)
        self.ours([], transfer_spec([(f"file://{header}", stager.url(HEADER))], "local", SITE))
        if mode == "stock":
            return ToolStager([str(self.stock.transfer), "--threads", str(p.threads)], [self.stock_env] * p.nodes,
                              prefix)
        if mode == "go":
            return ToolStager(go_argv(p.threads), [go_env(self.env)] * p.nodes, prefix)
        envs = [dict(self.installed_env) for _ in range(p.nodes)]
        if mode in ("bundles+cache", "stager"):
            for node, env in enumerate(envs):
                env.update(PEGASUS_CLOUDIO_BUNDLE="1",
                           PEGASUS_CLOUDIO_CACHE_DIR=os.path.join(self.root, f"node{node}", "cache"))
                if mode == "stager":
                    env["PEGASUS_CLOUDIO_STAGER"] = sockets[node]
        return ToolStager([os.path.join(self.bin_dir, "pegasus-cloudio-transfer"), "--threads", str(p.threads)],
                          envs, prefix)

    def result_bytes(self, stager: Any) -> bytes:
        """``fits.tbl`` as the run left it (fetched with ours, outside the counted window)."""
        if stager.shared_dir is not None:
            with open(os.path.join(stager.shared_dir, RESULT), "rb") as fh:
                return fh.read()
        dest = os.path.join(self.root, "check", RESULT)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        self.ours([], transfer_spec([(stager.url(RESULT), f"file://{dest}")], SITE, "local"))
        with open(dest, "rb") as fh:
            data = fh.read()
        shutil.rmtree(os.path.dirname(dest))
        return data


def run(params: Params, progress: Progress) -> Dict[str, object]:
    root = tempfile.mkdtemp(prefix="pegasus-cloudio-workflow-")
    try:
        with MinioServer() as server, TcpProxy((server.host, server.port),
                                               shaping=Shaping.rtt(params.rtt_ms)) as proxy:
            bed = Bed(root, params, server, proxy)
            bed.ours([], json.dumps([{"type": "mkdir", "target": {"site_label": SITE,
                                                                  "url": f"s3://{IDENTITY}/{BUCKET}"}}]).encode())
            startup = _startups(bed, progress)
            runs = [run for compute in params.computes for run in _rounds(bed, compute, progress)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    progress.done()
    return report(params, runs, startup)


def _startups(bed: Bed, progress: Progress) -> Dict[str, float]:
    """Median wall time of each tool on an empty input: what every staging step pays."""
    progress.phase("tool start-up on an empty input (5 runs each)")
    argvs = {"ours": (ours_argv(bed.params.threads), bed.env),
             "stock": ([str(bed.stock.transfer), "--threads", str(bed.params.threads)], bed.stock_env),
             "go": (go_argv(bed.params.threads), go_env(bed.env))}
    return {name: round(statistics.median(measure(name, "empty", 0, argv, env, bed.proxy, stdin=b"[]").wall_s
                                          for _ in range(5)), 4)
            for name, (argv, env) in argvs.items()}


def _rounds(bed: Bed, compute: float, progress: Progress) -> List[Dict[str, object]]:
    """Every mode at one compute time. Load from outside drifts during a run, so our modes and
    VM-local run ``repeats`` rounds in alternating order (A B C, C B A, ...) and each keeps its
    fastest round (all rounds' makespans are listed); stock, the slowest by far, runs once."""
    p = bed.params
    ours = [m for m in p.modes if m != "stock"]
    found: Dict[str, List[Dict[str, object]]] = {m: [] for m in p.modes}
    for r in range(p.repeats):
        for mode in (ours if r % 2 == 0 else ours[::-1]):
            found[mode].append(_run_mode(bed, mode, compute, progress, f"r{r}"))
    if "stock" in found:
        found["stock"].append(_run_mode(bed, "stock", compute, progress, "r0"))
    best = []
    for mode in p.modes:
        fastest = dict(min(found[mode], key=lambda run: float(run["makespan_s"])))  # type: ignore[arg-type]
        fastest["rounds_makespan_s"] = [run["makespan_s"] for run in found[mode]]
        fastest["result_correct"] = all(run["result_correct"] is not False for run in found[mode]) \
            if fastest["result_correct"] is not None else None
        best.append(fastest)
    return best


def _run_mode(bed: Bed, mode: str, compute: float, progress: Progress, round_name: str) -> Dict[str, object]:
    p = bed.params
    prefix = f"{mode.replace('+', '-')}-{compute:g}-{round_name}"
    with ExitStack() as stack:
        daemons = [stack.enter_context(StagerProcess(bed.installed_env, [os.path.join(bed.bin_dir, "pegasus-cloudio")]))
                   for _ in range(p.nodes if mode == "stager" else 0)]
        stager = bed.stager(mode, prefix, [d.socket_path for d in daemons])
        jobs = montage_like(p.producers, p.files, p.size)
        progress.phase(f"{mode}, compute {compute:g} s: {len(jobs)} jobs on {p.slots} slots / {p.nodes} nodes",
                       wire_moved(bed.proxy, None))  # both ways, no total: the jobs read what others wrote
        bed.proxy.reset_counters()
        budget = p.stock_budget_s if mode == "stock" else float("inf")

        def stop(timings: List[JobTiming], elapsed: float) -> bool:
            return len(timings) >= 0.2 * len(jobs) and elapsed * len(jobs) / len(timings) > budget

        before = sum(d.children_cpu_s() for d in daemons)
        store_before, bench_before, load_before = bed.server.cpu_s(), time.process_time(), os.getloadavg()[0]
        timings = run_dag(jobs, stager, slots=p.slots, nodes=p.nodes, root=os.path.join(bed.root, prefix),
                          compute_s=compute, env=bed.env, stop=stop)
        counters = bed.proxy.snapshot()
        time.sleep(0.2 if daemons else 0)  # let the stagers reap their last jobs
        stager_cpu = sum(d.children_cpu_s() for d in daemons) - before
        other_cpu = {"store_cpu_s": round(bed.server.cpu_s() - store_before, 3),
                     "proxy_and_scheduler_cpu_s": round(time.process_time() - bench_before, 3),
                     "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    complete = len(timings) == len(jobs)
    correct = complete and bed.result_bytes(stager) == expected_result(jobs, HEADER_TEXT, p.size)
    return {**_summary(mode, compute, jobs, timings, counters, complete, correct, stager_cpu), **other_cpu}


def _summary(mode: str, compute: float, jobs: List[Job], timings: List[JobTiming], counters: Dict[str, Any],
             complete: bool, correct: bool, stager_cpu_s: float = 0.0) -> Dict[str, object]:
    """One run's figures; CPU the node stagers spent on the jobs is charged to the jobs."""
    measured = max(t.end for t in timings) - min(t.start for t in timings)
    scale = len(jobs) / len(timings)
    n = len(timings)
    return {
        "mode": mode, "compute_s": compute, "jobs": len(jobs), "jobs_run": n, "extrapolated": not complete,
        "makespan_lower_bound": not complete,
        "makespan_s": round(measured * scale, 3), "measured_s": round(measured, 3),
        "requests": round(counters["requests"] * scale), "requests_by_method":
            {k: round(v * scale) for k, v in counters["requests_by_method"].items()},
        "connections": round(counters["connections"] * scale),
        "bytes": round((counters["bytes_up"] + counters["bytes_down"]) * scale),
        "mean_stage_in_s": round(sum(t.staged_in - t.start for t in timings) / n, 4),
        "mean_compute_s": round(sum(t.computed - t.staged_in for t in timings) / n, 4),
        "mean_stage_out_s": round(sum(t.end - t.computed for t in timings) / n, 4),
        "mean_staging_cpu_s": round((sum(t.staging_cpu_s for t in timings) + stager_cpu_s) / n, 4),
        "stager_cpu_s": round(stager_cpu_s, 3),
        "concat_stage_in_s": next((round(t.staged_in - t.start, 4) for t in timings if t.id == "concat"), None),
        "tail": tail(timings),
        "result_correct": correct if complete else None,
        "jobs_timeline": [t.as_dict() for t in timings],
    }


def tail(timings: List[JobTiming]) -> Optional[Dict[str, float]]:
    """The DAG's serial end, after the last producer: what no other job's compute hides.

    While producers run, their compute keeps every core busy and one job's staging waits
    behind another's compute, so staging costs the makespan its CPU, not its round trips.
    Once the last producer ends, the concat job runs alone: its stage-in, compute and
    stage-out are all on the makespan. None when the concat job did not run.
    """
    concat = next((t for t in timings if t.id == "concat"), None)
    if concat is None:
        return None
    producers_end = max((t.end for t in timings if t.id != "concat"), default=concat.start)
    return {"producers_end_s": round(producers_end, 4), "wait_s": round(concat.start - producers_end, 4),
            "stage_in_s": round(concat.staged_in - concat.start, 4),
            "compute_s": round(concat.computed - concat.staged_in, 4),
            "stage_out_s": round(concat.end - concat.computed, 4)}


def report(params: Params, runs: List[Dict[str, object]], startup: Dict[str, float]) -> Dict[str, object]:
    by = {(r["mode"], r["compute_s"]): r for r in runs}
    ratios: Dict[str, Optional[float]] = {}
    lower_bounds: Dict[str, Optional[float]] = {}
    targets: Dict[str, Optional[bool]] = {}
    for compute in params.computes:
        local = by.get(("vm-local", compute))
        if local is None:
            continue
        for mode in params.modes:
            if mode != "vm-local" and (mode, compute) in by:
                run = by[(mode, compute)]
                value = ratio(float(run["makespan_s"]), float(local["makespan_s"]))  # type: ignore[arg-type]
                into = lower_bounds if run.get("makespan_lower_bound") else ratios
                into[f"{mode}_vs_vm_local_at_{compute:g}s"] = round(value, 2) if value is not None else None
    for mode, limit in TARGET_RATIOS.items():
        key = f"{mode}_vs_vm_local_at_0.5s"
        if key in ratios:
            targets[f"{mode}_within_{limit:g}x_vm_local_at_0.5s"] = (ratios[key] or 99) <= limit
    ratios.update(_versus_go(params, by))
    for mode, limit in GO_TARGET_RATIOS.items():
        key = f"{mode}_vs_go_at_0.5s"
        if key in ratios:
            targets[f"{mode}_within_{limit:g}x_go_at_0.5s"] = (ratios[key] or 99) <= limit
    targets["results_correct"] = results_correct(runs)
    return {
        "benchmark": "workflow", "params": {**params.__dict__, "cores": os.cpu_count()},
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "tool_startup_s": startup, "runs": runs, "ratios": ratios, "ratios_lower_bound": lower_bounds,
        "results_unchecked": [f"{r['mode']} at {r['compute_s']:g} s" for r in runs if r["result_correct"] is None],
        "targets": targets,
    }


def _versus_go(params: Params, by: Dict[Tuple[object, object], Dict[str, object]]) -> Dict[str, Optional[float]]:
    """Each of our modes' makespan over the Go tool's, per compute time (both always complete)."""
    found: Dict[str, Optional[float]] = {}
    for compute in params.computes:
        go = by.get(("go", compute))
        for mode in ("per-file", "bundles+cache", "stager"):
            if go is not None and (mode, compute) in by:
                value = ratio(float(by[(mode, compute)]["makespan_s"]), float(go["makespan_s"]))  # type: ignore[arg-type]
                found[f"{mode}_vs_go_at_{compute:g}s"] = round(value, 2) if value is not None else None
    return found


def results_correct(runs: List[Dict[str, object]]) -> Optional[bool]:
    """False if any run's result was wrong; None (not met, not failed: unknown) if some run's
    result was never checked (an extrapolated run stopped before the concat job); else True."""
    seen = [r["result_correct"] for r in runs]
    if any(value is False for value in seen):
        return False
    return None if any(value is None for value in seen) else True


def format_table(result: Dict[str, object]) -> str:
    p = result["params"]
    rows = [f"{p['producers'] + 1} jobs ({p['producers']} x {p['files']} files of {p['size']} B, 1 concat) "  # type: ignore[index]
            f"on {p['slots']} slots / {p['nodes']} nodes, {p['cores']} cores, rtt {p['rtt_ms']:g} ms; "  # type: ignore[index]
            f"load {result['load_average']}",
            f"{'mode':<14} {'compute':>7} {'makespan s':>11} {'requests':>9} {'stage-in s/job':>15} "
            f"{'stage-out s/job':>16} {'staging cpu/job':>16} {'concat in s':>12} {'correct':>8}"]
    for r in result["runs"]:  # type: ignore[attr-defined]
        mark = (f" (lower bound: extrap. from {r['jobs_run']}/{r['jobs']} jobs, concat not run)"
                if r["extrapolated"] else "")
        if len(r.get("rounds_makespan_s", [])) > 1:
            mark += f" rounds {r['rounds_makespan_s']}"
        makespan = (">=" if r.get("makespan_lower_bound", r["extrapolated"]) else "") + f"{r['makespan_s']:.2f}"
        rows.append(f"{r['mode']:<14} {r['compute_s']:>7g} {makespan:>11} {r['requests']:>9} "
                    f"{r['mean_stage_in_s']:>15.3f} {r['mean_stage_out_s']:>16.3f} {r['mean_staging_cpu_s']:>16.3f} "
                    f"{r['concat_stage_in_s'] or 0:>12.3f} {str(r['result_correct']):>8}{mark}")
    for r in result["runs"]:  # type: ignore[attr-defined]
        t, load = r.get("tail"), r.get("load_average_1min")
        if t:
            rows.append(f"{r['mode']:<14} after the last producer ({t['producers_end_s']:.2f} s): concat in "
                        f"{t['stage_in_s']:.3f} s, compute {t['compute_s']:.3f} s, out {t['stage_out_s']:.3f} s"
                        + (f"; load {load[0]} -> {load[1]}" if load else ""))
    startup = result["tool_startup_s"]
    shown = (", ".join(f"{tool} {seconds:.3f} s" for tool, seconds in startup.items()) if isinstance(startup, dict)
             else str(startup))
    # wall time of the whole command in this run (on these loaded cores); a job step's own CPU is `bench startup`'s
    rows.append(f"wall time of one call on an empty input, whole process, median of 5: {shown}")
    rows += [f"{k}: {v}" for k, v in result["ratios"].items()]  # type: ignore[attr-defined]
    rows += [f"{k}: >= {v} (lower bound)" for k, v in result.get("ratios_lower_bound", {}).items()]  # type: ignore[attr-defined]
    unchecked = result.get("results_unchecked") or []
    for k, v in result["targets"].items():  # type: ignore[attr-defined]
        verdict = "n/a" if v is None else ("met" if v else "NOT MET")
        if k == "results_correct" and v is None and unchecked:
            verdict = f"not checked for {', '.join(unchecked)} (extrapolated); every checked run correct"  # type: ignore[arg-type]
        rows.append(f"target {k}: {verdict}")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover - convenience
    sys.exit("run as: pegasus-cloudio bench workflow")
