"""The seeds' experiments as one report: ``pegasus-cloudio bench report --out DIR [--quick]``.

Runs the scenarios (workflow makespan, time vs size, threads, large file, cache table, timed
disk, request cost; the monitor's time series when ``--monitor FILE`` is given) and writes
``DIR/report.md`` with a table and plots per scenario, ``DIR/figures/*.png`` with the JSON of
each figure beside it, and ``DIR/results/<scenario>.json`` with each scenario's full result.
The seeds' published numbers appear beside ours, labelled "published".

``--quick`` runs every scenario at a small scale (a few minutes; CI runs it to check that the
report is complete, never how fast anything was). Progress: phases on a terminal, otherwise
a line on stderr at least every 30 seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, TextIO, Tuple

from pegasus_cloudio_bench import cache as cache_bench
from pegasus_cloudio_bench import disk, figures, large, sizes, threads, workflow
from pegasus_cloudio_bench import pool as pool_bench
from pegasus_cloudio_bench.harness import Progress
from pegasus_cloudio.cost.cli import bill
from pegasus_cloudio.cost.cli import format_table as cost_table
from pegasus_cloudio.cost.prices import DEFAULT_TABLES, request_class

HEARTBEAT_S = 30.0


class ReportProgress(Progress):
    """`Progress` on a terminal; otherwise a ``report: <phase> (N s)`` line every ``interval``."""

    def __init__(self, stream: TextIO = sys.stderr, interval: float = HEARTBEAT_S) -> None:
        super().__init__(stream)
        self._out = stream
        self._current = "starting"
        self._since = time.monotonic()
        self._beat = threading.Event()
        self._interval = interval
        self._heart: Optional[threading.Thread] = None
        if not stream.isatty():
            self._heart = threading.Thread(target=self._heartbeat, daemon=True)
            self._heart.start()

    def phase(self, text: str, moved: Optional[Callable[[], int]] = None, total: Optional[int] = None) -> "Progress":
        self._current, self._since = text, time.monotonic()
        return super().phase(text, moved, total)

    def scenario(self, name: str) -> None:
        self.phase(f"scenario {name}")
        if self._heart is not None:
            self._line(f"report: scenario {name}")

    def _line(self, text: str) -> None:
        self._out.write(text + "\n")
        self._out.flush()

    def _heartbeat(self) -> None:
        while not self._beat.wait(self._interval):
            self._line(f"report: {self._current} ({time.monotonic() - self._since:.0f} s)")

    def close(self) -> None:
        self.done()
        self._beat.set()


def _quick(quick: bool, small: Any, full: Any) -> Any:
    return small if quick else full


def scenarios(quick: bool) -> List[Tuple[str, Callable[[Progress], Dict[str, Any]], Callable[..., Any]]]:
    """(name, run(progress) -> result, module with format_table) in report order."""
    q = quick
    wf = _quick(q, workflow.Params(producers=2, files=8, threads=2, computes=(0.5,), stock_budget_s=5.0, repeats=1),
                workflow.Params(stock_budget_s=600.0))
    sz = _quick(q, sizes.Params(sizes=(0, 10**6), rtts=(20.0,)), sizes.Params())
    th = _quick(q, threads.Params(count=20, threads=(1, 4)), threads.Params())
    lg = _quick(q, large.Params(mib=16), large.Params())
    ca = _quick(q, cache_bench.Params(sources=2, sites=2, shared_files=2, shared_mib=0.5, source_files=1,
                                      source_mib=0.25, site_files=1, site_mib=0.1, parallel=2, concurrent=4,
                                      concurrent_mib=2.0, repeats=3, latency_mb="0,1,10"), cache_bench.Params())
    dk = _quick(q, disk.Params(transfer_mib=8, samples=3, interval_s=0.2), disk.Params())
    pl = _quick(q, pool_bench.Params(producers=2, files=3, configs="stock,go,ours bundles+cache"), pool_bench.Params())
    return [
        ("workflow", lambda p: workflow.run(wf, p), workflow.format_table),
        ("sizes", lambda p: sizes.run(sz, p), sizes.format_table),
        ("threads", lambda p: threads.run(th, p), threads.format_table),
        ("large", lambda p: large.run(lg, p), large.format_table),
        ("cache", lambda p: cache_bench.run(ca, p), cache_bench.format_table),
        ("disk", lambda p: disk.run(dk, p), disk.format_table),
        ("pool", lambda p: pool_bench.run(pl, p), pool_bench.format_table),
    ]


PLOTS: Dict[str, Callable[[Dict[str, Any], str], List[figures.Figure]]] = {
    "workflow": figures.workflow, "sizes": figures.sizes, "threads": figures.threads, "large": figures.large,
    "cache": figures.cache, "disk": figures.disk, "pool": figures.pool,
}

PUBLISHED: Dict[str, List[str]] = {
    "workflow": ["seed 002: Montage (10,429 jobs) with intermediate files in S3/GCS took about 4x (400%) the "
                 "makespan of VM-local storage; mConcatFit stage-in of 6,173 files took 1,862 s (AWS) and "
                 "4,387 s (Google) single-threaded, 790 s and 937 s with 5 threads."],
    "sizes": ["seed 002, Fig. 6/7: hourly up/downloads for a week; pegasus-s3 beat aws-cli and gsutil up to "
              "10 MB (upload) and 100 MB (download); the gap came from extra TCP connections per request."],
    "threads": ["seed 002, Fig. 10: makespan fell as threads grew up to 5, not beyond; 5 threads cut makespan "
                "21% (AWS) and 32% (Google)."],
    "large": ["(no seed figure: the target is ours >= 90% of the best tool in the same run)"],
    "cache": ["seed 003 cache daemon: get of a cached 100 MB file 3.951 s by copy, 1.841 s by symlink; "
              "put 4.36 s by copy, 0.008 s by symlink."],
    "disk": ["seed 002, Fig. 9: AWS general-purpose SSD 128 MB/s for ~60 dd iterations (4 MB x 1000), then under "
             "9 MB/s (burst credits spent); Google PD-SSD (70 GB) 33.6 MB/s sustained.",
             "seed 004: timed benchmark, transfer size 2M, sampled at fixed intervals over hours to show variability."],
    "pool": ["(no seed figure: the issue's first run on a real pool, 20 + 1 jobs: cloud-storage S3 49 s ours "
             "against 113 s stock, vm-storage 45 s vs 79 s, submit-host 55 s vs 106 s)"],
    "cost": ["seed 000 (2010 prices): $0.01 per 1,000 PUTs and per 10,000 GETs; S3 added $0.28 per Montage run "
             "(caching in the S3 client reduced it)."],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="directory for report.md, figures/ and results/")
    parser.add_argument("--quick", action="store_true", help="every scenario at a small scale (a few minutes)")
    parser.add_argument("--only", help="comma-separated scenarios to run (default: all)")
    parser.add_argument("--monitor", help="a `pegasus-cloudio monitor` time-series file to plot")
    parser.add_argument("--reuse", action="store_true",
                        help="take each scenario's result from OUT/results/NAME.json (e.g. the --json output "
                             "of a separate `bench NAME` run) instead of running it; a scenario with no saved "
                             "result is skipped, with a line saying so")


def run_from_args(args: argparse.Namespace) -> Dict[str, object]:
    only = set(args.only.split(",")) if args.only else None
    return build(args.out, quick=args.quick, only=only, monitor_file=args.monitor, reuse=args.reuse)


def workflow_cost(result: Dict[str, Any]) -> Dict[str, Any]:
    """Each workflow run's requests (counted at the proxy) priced with every default table."""
    rows = []
    for run in result["runs"]:
        counts = {"A": 0, "B": 0}
        for method, n in run["requests_by_method"].items():
            kind = request_class(method)
            if kind:
                counts[kind] += n
        rows.append({"site": run["mode"], "job_type": f"whole DAG, {run['compute_s']:g} s compute",
                     "mode": run["mode"], "compute_s": run["compute_s"], "class_a": counts["A"], "class_b": counts["B"],
                     "bytes_up": 0, "bytes_down": 0, "extrapolated": run["extrapolated"]})
    return bill(rows, list(DEFAULT_TABLES.values()))


def build(out: str, *, quick: bool, only: Optional[set] = None,  # type: ignore[type-arg]
          monitor_file: Optional[str] = None, stream: TextIO = sys.stderr, reuse: bool = False) -> Dict[str, object]:
    """Run the scenarios and write the report; return a summary (paths, figures, failures)."""
    folders = {k: os.path.join(out, k) for k in ("figures", "results")}
    for folder in folders.values():
        os.makedirs(folder, exist_ok=True)
    progress = ReportProgress(stream)
    sections: List[str] = []
    made: List[str] = []
    failed: Dict[str, str] = {}
    loads: Dict[str, Optional[List[float]]] = {}  # scenario -> load average when it was measured
    started = time.monotonic()
    try:
        for name, run, table in scenarios(quick):
            if only is not None and name not in only:
                continue
            saved = os.path.join(folders["results"], f"{name}.json")
            if reuse and not os.path.exists(saved):  # --reuse assembles: it never starts a bench
                progress.note(f"{name}: no saved result {saved}: skipped (run `pegasus-cloudio bench report "
                              f"--out {out} --only {name}` without --reuse to measure it)")
                sections.append(f"## {name}\n\nSkipped: no saved result (results/{name}.json) to reuse.\n")
                continue
            progress.scenario(name)  # after the skip: a skipped scenario has no "scenario X" line
            try:
                result = _load(saved) if reuse else _measured(run(progress))
            except Exception as err:  # noqa: BLE001 - one broken scenario must not lose the others
                failed[name] = f"{type(err).__name__}: {err}"
                sections.append(f"## {name}\n\nFAILED: {failed[name]}\n")
                continue
            loads[name] = measured_load(result)
            _dump(saved, result)
            try:
                figs = PLOTS[name](result, folders["figures"])
                sections.append(_section(name, table(result), figs))
            except (KeyError, TypeError, ValueError) as err:  # e.g. a reused result of an older format
                failed[name] = f"cannot draw the result: {type(err).__name__}: {err}"
                sections.append(f"## {name}\n\nFAILED: {failed[name]}\n")
                continue
            made += [f[0] for f in figs]
            if name == "workflow":
                priced = workflow_cost(result)
                _dump(os.path.join(folders["results"], "cost.json"), priced)
                cost_figs = figures.cost(priced["rows"], folders["figures"])
                sections.append(_section("cost", cost_table(priced, "requests counted at the test proxy, the same way "
                                                             "for every mode; extrapolated runs scaled", total=False), cost_figs))
                made += [f[0] for f in cost_figs]
        if monitor_file:
            from pegasus_cloudio.monitor import series as monitor_series
            points = monitor_series.read(monitor_file)
            figs = figures.monitor(points, monitor_series.shifts(points), folders["figures"])
            sections.append(_section("monitor", f"{len(points)} probes from {monitor_file}", figs))
            made += [f[0] for f in figs]
    finally:
        progress.close()
    report = os.path.join(out, "report.md")
    _write_report(report, sections, quick, time.monotonic() - started, reuse, loads)
    return {"benchmark": "report", "report": report, "figures": made, "failed": failed, "quick": quick}


def _measured(result: Dict[str, Any]) -> Dict[str, Any]:
    """``result`` with the load average at the end of its run, where the bench gave none."""
    if measured_load(result) is None:
        result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return result


def measured_load(result: Dict[str, Any]) -> Optional[List[float]]:
    """The load average a result was measured under (its ``load_average`` or ``load``), or None."""
    value = result.get("load_average", result.get("load"))
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, (list, tuple)) and value and all(isinstance(x, (int, float)) for x in value):
        return [float(x) for x in value]
    return None


def _load(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        loaded: Dict[str, Any] = json.load(fh)
    return loaded


def _dump(path: str, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, default=str)


def _section(name: str, table: str, figs: List[figures.Figure]) -> str:
    lines = [f"## {name}", "", "```", table, "```", ""]
    for fig, caption, _ in figs:
        lines += [f"![{caption}](figures/{fig}.png)", "", f"Data: [figures/{fig}.json](figures/{fig}.json)", ""]
    lines += [f"Published (not measured here): {text}" for text in PUBLISHED.get(name, [])]
    return "\n".join(lines) + "\n"


def _write_report(path: str, sections: List[str], quick: bool, seconds: float, reuse: bool = False,
                  loads: Optional[Dict[str, Optional[List[float]]]] = None) -> None:
    """``report.md``: the head says under which load each section was measured (1, 5 and 15
    minute averages at the end of its run, as its result recorded them), not the load while
    the report was put together."""
    measured = "; ".join(f"{name} " + (", ".join(f"{x:.2f}" for x in load) if load else "not recorded")
                         for name, load in (loads or {}).items())
    head = ["# pegasus-cloudio benchmark report", "",
            f"{'Quick run (small scale: checks completeness, not speed)' if quick else 'Full run'}"
            f"{' assembled from saved results' if reuse else ''}; {os.cpu_count()} cores; "
            f"load average when measured: {measured or 'nothing measured'}; {seconds:.0f} s.", "",
            "Each section is one run as its bench printed it, judged against the targets of its day. Today's "
            "figures, each with its command, date, load and baselines, and today's targets are in "
            "docs/benchmarks.md; a section's run may be older than that page's figure for the same scenario.", "",
            "Figures are ours unless labelled \"published\" (numbers from the seed papers, not measured here).", ""]
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        fh.write("\n".join(head) + "\n" + "\n".join(sections))
    os.replace(path + ".tmp", path)


def format_table(result: Dict[str, Any]) -> str:
    lines = [f"report: {result['report']}", f"figures: {', '.join(result['figures'])}"]
    lines += [f"FAILED {k}: {v}" for k, v in result["failed"].items()]
    return "\n".join(lines)
