"""Montage's mConcatFit staging: many producers' small files gathered by one consumer.

Producers (default 100, as Pegasus horizontal clustering would emit) each stage out their
share of N files (default 6,173 of 300 bytes) with one ``pegasus-cloudio-transfer`` process;
one consumer stages all N in. In one run, on an embedded MinIO behind a counting proxy that
can add a round-trip delay (``--rtt-ms``):

* stock ``pegasus-transfer`` (the Python tool Pegasus 5 ships) consumer stage-in (two samples,
  extrapolated, labelled so);
* Pegasus's Go ``pegasus-transfer`` (the stock tool to come) consumer stage-in, all N files;
* ours per file: producers and consumer without bundling;
* ours bundled: the same with ``PEGASUS_CLOUDIO_BUNDLE=1`` (one bundle per producer);
* ours transparent: the bundled producers' output read by a consumer with bundling off
  (it finds the bundles after its first 404s, then reads members without a 404 each);
* the floor: one GET of one object holding the same bytes, plus writing the N files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional

from pegasus_cloudio_bench.go_tool import GO, STOCK_NOTE, go_argv, go_env
from pegasus_cloudio_bench.harness import (
    Measurement, Progress, add_sample_arguments, extrapolate, files_identical, measure, resolve_sample,
    run_rows, sample_problems, wire_moved,
)
from pegasus_cloudio_bench.small_files import BUCKET, IDENTITY, SITE, Workspace, _positive, ours_argv, transfer_spec
from pegasus_cloudio_bench.small_files import Params as SmallParams
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import TcpProxy


@dataclass(frozen=True)
class Params:
    count: int = 6173
    size: int = 300
    producers: int = 100
    threads: int = 5
    stock_sample: int = 100
    rtt_ms: float = 0.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=_positive, default=6173, help="files gathered (default 6173)")
    parser.add_argument("--size", type=_positive, default=300, help="bytes per file (default 300)")
    parser.add_argument("--producers", type=_positive, default=100, help="producer jobs (default 100)")
    parser.add_argument("--threads", type=_positive, default=5, help="transfer threads (default 5)")
    add_sample_arguments(parser, "--stock-sample", "files the stock tool stages in")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="round trip added by the proxy (e.g. 4)")


def usage_problems(args: argparse.Namespace) -> List[str]:
    return sample_problems("--stock-sample", args.stock_sample, args.count, args.allow_small_sample)


def run_from_args(args: argparse.Namespace) -> Dict[str, object]:
    params = Params(args.count, args.size, args.producers, args.threads,
                    resolve_sample(args.stock_sample, args.count), args.rtt_ms)
    return run(params, Progress())


def run(params: Params, progress: Progress) -> Dict[str, object]:
    root = tempfile.mkdtemp(prefix="pegasus-cloudio-mconcatfit-")
    try:
        with MinioServer() as server, TcpProxy((server.host, server.port), delay_ms=params.rtt_ms / 2) as proxy:
            small = SmallParams(count=params.count, size=params.size, threads=params.threads)
            ws = Workspace(root, small, server, proxy)
            runs = _run_all(ws, params, proxy, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report(params, runs)


def _shares(names: List[str], producers: int) -> List[List[str]]:
    per = -(-len(names) // producers)
    return [names[i:i + per] for i in range(0, len(names), per)]


def _producers(ws: Workspace, params: Params, proxy: TcpProxy, prefix: str, env: Dict[str, str]) -> Measurement:
    """All producers' stage-outs, one process each; their costs are summed."""
    parts = [measure("producer", "stage-out", len(share), ours_argv(params.threads), env, proxy,
                     stdin=transfer_spec(ws.out_pairs(prefix, share), "local", SITE))
             for share in _shares(ws.names, params.producers)]
    return Measurement(f"ours {prefix} producers", "stage-out", params.count, params.count,
                       sum(p.wall_s for p in parts), sum(p.cpu_s for p in parts), sum(p.requests for p in parts),
                       sum(p.connections for p in parts), max(p.exit_code for p in parts),
                       bytes_moved=sum(p.bytes_moved for p in parts))


def _consumer(ws: Workspace, params: Params, proxy: TcpProxy, prefix: str, env: Dict[str, str],
              label: str = "") -> Measurement:
    label = label or prefix
    dest = ws.fresh_dir(f"in-{label}")
    result = measure(f"ours {label} consumer", "stage-in", params.count, ours_argv(params.threads), env, proxy,
                     stdin=transfer_spec(ws.in_pairs(prefix, ws.names, dest), SITE, "local"))
    if not files_identical(ws.src, dest, ws.names):
        raise RuntimeError(f"{prefix} consumer staged in files that differ from the originals")
    return result


def _run_all(ws: Workspace, params: Params, proxy: TcpProxy, progress: Progress) -> Dict[str, Measurement]:
    bucket_spec = json.dumps([{"type": "mkdir", "target": {"site_label": SITE, "url": f"s3://{IDENTITY}/{BUCKET}"}}])
    measure("ours", "mkdir", 0, ours_argv(1), ws.env, proxy, stdin=bucket_spec.encode())
    bundled_env = dict(ws.env, PEGASUS_CLOUDIO_BUNDLE="1")
    runs: Dict[str, Measurement] = {}
    total = params.count * params.size
    for prefix, env in (("per-file", ws.env), ("bundled", bundled_env)):
        progress.phase(f"{params.producers} {prefix} producers stage out {params.count} files",
                       wire_moved(proxy, True), total)
        runs[f"{prefix}_out"] = _producers(ws, params, proxy, prefix, env)
        progress.phase(f"{prefix} consumer stages in {params.count} files", wire_moved(proxy, False), total)
        runs[f"{prefix}_in"] = _consumer(ws, params, proxy, prefix, env)
    progress.phase("transparent consumer (bundling off) stages in the bundled files", wire_moved(proxy, False), total)
    runs["transparent_in"] = _consumer(ws, params, proxy, "bundled", ws.env, "transparent")
    runs["floor_in"] = _floor(ws, params, proxy, progress)
    runs["stock_in"] = _stock(ws, params, proxy, progress)
    runs["go_in"] = _go(ws, params, proxy, progress)
    progress.done()
    return runs


def _floor(ws: Workspace, params: Params, proxy: TcpProxy, progress: Progress) -> Measurement:
    progress.phase("floor: one object with all the bytes", wire_moved(proxy, True), params.count * params.size)
    blob = os.path.join(ws.root, "all.bin")
    with open(blob, "wb") as out:
        for name in ws.names:
            with open(os.path.join(ws.src, name), "rb") as fh:
                out.write(fh.read())
    url = ws.object_url("floor", "all.bin")
    measure("ours", "upload", 1, ours_argv(1), ws.env, proxy,
            stdin=transfer_spec([(f"file://{blob}", url)], "local", SITE))
    dest = ws.fresh_dir("in-floor")
    progress.phase(f"floor: one GET, then {params.count} local files", wire_moved(proxy, False),
                   params.count * params.size)
    argv = [sys.executable, "-m", "pegasus_cloudio_bench.floor", url, dest, str(params.count), str(params.size)]
    result = measure("floor (1 GET + local writes)", "stage-in", params.count, argv, ws.env, proxy)
    if not files_identical(ws.src, dest, ws.names):
        raise RuntimeError("floor files differ from the originals")
    return result


def _stock(ws: Workspace, params: Params, proxy: TcpProxy, progress: Progress) -> Measurement:
    sizes = sorted({max(1, min(params.count, params.stock_sample) // 4), min(params.count, params.stock_sample)})
    samples = []
    for size in sizes:
        progress.phase(f"stock pegasus-transfer: stage-in sample of {size} files", wire_moved(proxy, False),
                       size * params.size)
        dest = ws.fresh_dir(f"in-stock{size}")
        samples.append(measure("stock pegasus-transfer", "stage-in", size,
                               [str(ws.stock_transfer), "--threads", str(params.threads)], ws.stock_env, proxy,
                               stdin=transfer_spec(ws.in_pairs("per-file", ws.names[:size], dest), SITE, "local")))
    return extrapolate(samples[0], samples[-1], params.count)


def _go(ws: Workspace, params: Params, proxy: TcpProxy, progress: Progress) -> Measurement:
    progress.phase(f"{GO}: consumer stage-in of {params.count} files", wire_moved(proxy, False),
                   params.count * params.size)
    dest = ws.fresh_dir("in-go")
    result = measure(f"{GO} consumer", "stage-in", params.count, go_argv(params.threads), go_env(ws.env), proxy,
                     stdin=transfer_spec(ws.in_pairs("per-file", ws.names, dest), SITE, "local"))
    if not files_identical(ws.src, dest, ws.names):
        raise RuntimeError(f"the {GO} consumer staged in files that differ from the originals")
    return result


def report(params: Params, runs: Dict[str, Measurement]) -> Dict[str, object]:
    per_in, bundled_in, floor = runs["per-file_in"], runs["bundled_in"], runs["floor_in"]
    ratios: Dict[str, Optional[float]] = {
        "consumer_request_reduction": _div(per_in.requests, bundled_in.requests),
        "bundled_vs_floor_wall": _div(bundled_in.wall_s, floor.wall_s),
        "bundled_speedup_vs_per_file": _div(per_in.wall_s, bundled_in.wall_s),
        "bundled_speedup_vs_stock": _div(runs["stock_in"].wall_s, bundled_in.wall_s),
        "producer_bundled_vs_per_file_wall": _div(runs["bundled_out"].wall_s, runs["per-file_out"].wall_s),
        "transparent_vs_per_file_wall": _div(runs["transparent_in"].wall_s, per_in.wall_s),
        "per_file_consumer_wall_vs_go": _div(per_in.wall_s, runs["go_in"].wall_s),
        "bundled_consumer_wall_vs_go": _div(bundled_in.wall_s, runs["go_in"].wall_s),
        "go_speedup_vs_stock": _div(runs["stock_in"].wall_s, runs["go_in"].wall_s),
    }
    speedup_target = 10.0 if params.rtt_ms >= 4 else 3.0
    targets = {
        "requests_at_least_50x_fewer": (ratios["consumer_request_reduction"] or 0) >= 50,
        f"bundled_at_least_{speedup_target:g}x_faster_than_per_file":
            (ratios["bundled_speedup_vs_per_file"] or 0) >= speedup_target,
        "bundled_within_2x_floor": (ratios["bundled_vs_floor_wall"] or 99) <= 2.0 if params.rtt_ms == 0 else None,
        "producers_bundled_no_slower": (ratios["producer_bundled_vs_per_file_wall"] or 99) <= 1.0,
        "transparent_no_slower_than_per_file": (ratios["transparent_vs_per_file_wall"] or 99) <= 1.0,
    }
    return {"benchmark": "mconcatfit", "params": params.__dict__, "runs": [m.as_dict() for m in runs.values()],
            "ratios": {k: (round(v, 2) if v is not None else None) for k, v in ratios.items()}, "targets": targets,
            "load_average": [round(x, 2) for x in os.getloadavg()], "notes": [STOCK_NOTE]}


def _div(a: float, b: float) -> Optional[float]:
    return a / b if b > 0 else None


def format_table(result: Dict[str, object]) -> str:
    rows = run_rows(result["runs"], (("files", "files", "d"), ("wall s", "wall_s", ".2f"),  # type: ignore[arg-type]
                                     ("cpu s", "cpu_s", ".2f"), ("requests", "requests", "d"),
                                     ("conns", "connections", "d"), ("bytes", "bytes_moved", "d")))
    rows.append(f"params: {result['params']}")
    rows += [f"{k}: {v}" for k, v in result["ratios"].items()]  # type: ignore[attr-defined]
    rows += [f"target {k}: {'n/a' if v is None else ('met' if v else 'NOT MET')}"
             for k, v in result["targets"].items()]  # type: ignore[attr-defined]
    rows += [f"note: {note}" for note in result.get("notes", [])]  # type: ignore[attr-defined]
    return "\n".join(rows)

