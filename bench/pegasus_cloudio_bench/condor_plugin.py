"""One HTCondor plugin process for a job's small objects vs one plugin process per file.

In one run, on an embedded MinIO behind a counting proxy on loopback, with the plugin
invoked exactly as condor_starter invokes it (``-infile IN -outfile OUT [-upload]``):

* stage-out: one plugin process uploads all N files (``-upload``, N file ads);
* batch: one plugin process downloads all N objects (N file ads, one warm pool,
  ``PEGASUS_CLOUDIO_THREADS`` workers);
* per-file: the same plugin with one file ad per process, processes run one after another
  as a single-file (protocol v1) plugin is run; measured on two samples (S/4 and S files)
  and extrapolated linearly to N, labelled as such.

Targets: the batch uses at most threads + 2 connections and moves files at least 20x faster
than one process per file. Every downloaded file is compared byte for byte.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

from pegasus_cloudio_bench.harness import (
    Measurement, Progress, add_sample_arguments, extrapolate, files_identical, fresh_dir,
    make_inputs, measure, ratio, resolve_sample, run_rows, sample_problems, tool_env,
)
from pegasus_cloudio_bench.small_files import _positive
from pegasus_cloudio.condor.ads import classad
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import TcpProxy
from transfer import Engine, Mkdir, Session, parse_url

BUCKET = "condor-bench"
IDENTITY = "bench@minio"


@dataclass(frozen=True)
class Params:
    count: int = 1000
    size: int = 1024
    threads: int = 8
    sample: int = 100
    rtt_ms: float = 0.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=_positive, default=1000, help="objects for the job (default 1000)")
    parser.add_argument("--size", type=_positive, default=1024, help="bytes per object (default 1024)")
    parser.add_argument("--threads", type=_positive, default=8, help="PEGASUS_CLOUDIO_THREADS (default 8)")
    add_sample_arguments(parser, "--sample", "files fetched one process each")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="emulated round trip added by the proxy")


def usage_problems(args: argparse.Namespace) -> List[str]:
    return sample_problems("--sample", args.sample, args.count, args.allow_small_sample)


def run_from_args(args: argparse.Namespace) -> Dict[str, object]:
    params = Params(count=args.count, size=args.size, threads=args.threads,
                    sample=resolve_sample(args.sample, args.count),
                    rtt_ms=args.rtt_ms)
    return run(params, Progress())


def plugin_argv() -> List[str]:
    """The installed console script (as an administrator lists it), else the module."""
    script = Path(sys.executable).parent / "pegasus-cloudio-condor-plugin"
    return [str(script)] if script.exists() else [sys.executable, "-m", "pegasus_cloudio.condor.plugin"]


class Job:
    """A job sandbox: the files, input ads and plugin environment of one benchmark run."""

    def __init__(self, root: str, params: Params, server: MinioServer, proxy: TcpProxy) -> None:
        self.root, self.params = root, params
        self.src, self.names = make_inputs(root, params.count, params.size)
        creds = server.write_pegasus_credentials(os.path.join(root, "credentials.conf"), site="minio",
                                                 user="bench", endpoint=proxy.url())
        self.env = tool_env({"PEGASUS_CREDENTIALS": str(creds), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
                             "PEGASUS_CLOUDIO_THREADS": str(params.threads)})

    def url(self, name: str) -> str:
        return f"s3://{IDENTITY}/{BUCKET}/job/{name}"

    def argv(self, tag: str, pairs: Sequence[tuple], upload: bool = False) -> List[str]:  # type: ignore[type-arg]
        """Write ``.<tag>.in`` with one ad per (url, local) pair; the starter's command line."""
        ads = "".join(repr(classad().ClassAd({"Url": u, "LocalFileName": p})) for u, p in pairs)
        infile, outfile = os.path.join(self.root, f".{tag}.in"), os.path.join(self.root, f".{tag}.out")
        with open(infile, "w", encoding="utf-8") as fh:
            fh.write(ads)
        with open(outfile, "w", encoding="utf-8") as fh:
            fh.write(" " * 19264)
        return plugin_argv() + ["-infile", infile, "-outfile", outfile] + (["-upload"] if upload else [])

    def fresh_dir(self, name: str) -> str:
        return fresh_dir(self.root, name)


def run(params: Params, progress: Progress) -> Dict[str, object]:
    root = tempfile.mkdtemp(prefix="pegasus-cloudio-condor-bench-")
    try:
        with MinioServer() as server, TcpProxy((server.host, server.port), delay_ms=params.rtt_ms / 2) as proxy:
            job = Job(root, params, server, proxy)
            runs = _run_all(job, proxy, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report(params, runs)


def _make_bucket(job: Job) -> None:
    with Session(env=job.env) as session:
        [result] = Engine(session).run([Mkdir(parse_url(f"s3://{IDENTITY}/{BUCKET}"))])
    if not result.ok:
        raise RuntimeError(f"cannot create the benchmark bucket: {result.error}")


def _run_all(job: Job, proxy: TcpProxy, progress: Progress) -> Dict[str, object]:
    p = job.params
    progress.phase("creating bucket")
    _make_bucket(job)
    runs: Dict[str, object] = {}
    progress.phase(f"one plugin process: stage-out of {p.count} files")
    out_pairs = [(job.url(n), os.path.join(job.src, n)) for n in job.names]
    runs["batch_out"] = measure("plugin, one process", "stage-out", p.count,
                                job.argv("out", out_pairs, upload=True), job.env, proxy)
    dest = job.fresh_dir("in-batch")
    progress.phase(f"one plugin process: stage-in of {p.count} files")
    runs["batch_in"] = measure("plugin, one process", "stage-in", p.count,
                               job.argv("in", [(job.url(n), os.path.join(dest, n)) for n in job.names]),
                               job.env, proxy)
    runs["batch_identical"] = files_identical(job.src, dest, job.names)
    runs["per_file_in"], runs["per_file_identical"] = _per_file(job, proxy, progress)
    progress.done()
    return runs


def _per_file(job: Job, proxy: TcpProxy, progress: Progress) -> tuple:  # type: ignore[type-arg]
    """One process per file on two samples, extrapolated to the job's file count."""
    p = job.params
    sizes = sorted({max(1, min(p.count, p.sample) // 4), min(p.count, p.sample)})
    samples: List[Measurement] = []
    identical = True
    for size in sizes:
        dest = job.fresh_dir(f"in-single{size}")
        progress.phase(f"one plugin process per file: sample of {size} files")
        one_each = [measure("plugin, process per file", "stage-in", 1,
                            job.argv(f"single{i}", [(job.url(n), os.path.join(dest, n))]), job.env, proxy)
                    for i, n in enumerate(job.names[:size])]
        samples.append(_total(one_each))
        identical = identical and files_identical(job.src, dest, job.names[:size])
    return extrapolate(samples[0], samples[-1], p.count), identical


def _total(runs: Sequence[Measurement]) -> Measurement:
    """Sequential processes as one measurement (wall and CPU add up)."""
    first = runs[0]
    return Measurement(first.tool, first.direction, len(runs), len(runs), sum(r.wall_s for r in runs),
                       sum(r.cpu_s for r in runs), sum(r.requests for r in runs),
                       sum(r.connections for r in runs), max(r.exit_code for r in runs))


def report(params: Params, runs: Dict[str, object]) -> Dict[str, object]:
    measured = {k: v for k, v in runs.items() if isinstance(v, Measurement)}
    batch_in, batch_out, single = measured["batch_in"], measured["batch_out"], measured["per_file_in"]
    speedup = ratio(batch_in.files_per_s, single.files_per_s)
    limit = params.threads + 2
    return {
        "benchmark": "condor-plugin",
        "params": params.__dict__,
        "runs": [m.as_dict() for m in measured.values()],
        "ratios": {"stage_in_throughput_vs_process_per_file": round(speedup, 1) if speedup else None},
        "targets": {
            f"connections_at_most_threads_plus_2 ({limit})": batch_in.connections <= limit
            and batch_out.connections <= limit,
            "throughput_at_least_20x_process_per_file": (speedup or 0) >= 20,
            "all_exit_codes_zero": all(m.exit_code == 0 for m in measured.values()),
            "files_identical": bool(runs["batch_identical"]) and bool(runs["per_file_identical"]),
        },
    }



def format_table(result: Dict[str, object]) -> str:
    rows = run_rows(result["runs"], (("files", "files", "d"), ("wall s", "wall_s", ".2f"),  # type: ignore[arg-type]
                                     ("cpu s", "cpu_s", ".2f"), ("files/s", "files_per_s", ".1f"),
                                     ("requests", "requests", "d"), ("conns", "connections", "d")))
    rows.append("")
    for name, value in result["ratios"].items():  # type: ignore[attr-defined]
        rows.append(f"{name}: {value}")
    for name, ok in result["targets"].items():  # type: ignore[attr-defined]
        rows.append(f"target {name}: {'met' if ok else 'NOT MET'}")
    return "\n".join(rows)
