"""Many small files staged out to and back in from a store, against the stock tool.

In one run, on an embedded MinIO behind a counting proxy on loopback:

* ours: ``pegasus-cloudio-transfer --threads T`` stages all N files out, then in (node cache
  off); then in again with users' defaults (a node cache that starts empty: every file a miss);
* ours bundled: the same with ``PEGASUS_CLOUDIO_BUNDLE=1`` (out, then in);
* Go: Pegasus's Go ``pegasus-transfer --threads T`` (the stock tool of Pegasus 6,
  :mod:`pegasus_cloudio_bench.go_tool`), all N files, both directions;
* stock: ``pegasus-transfer --threads T`` (pegasus-wms-worker 5.1.3, one ``pegasus-s3``
  process per file) on two samples (S/4 and S files) per direction, extrapolated linearly
  to N and labelled as such;
* s5cmd ``cp`` with its defaults, all N files, both directions (skipped with --no-s5cmd);
* the start-up cost of ``pegasus-cloudio-transfer`` on an empty input.

Every stage-in result is compared byte for byte with the originals.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from pegasus_cloudio_bench.go_tool import GO, STOCK_NOTE, go_argv, go_env
from pegasus_cloudio_bench.harness import (
    Measurement, Progress, add_sample_arguments, extrapolate, files_identical, fresh_dir,
    StoreWorkspace, measure, ratio, resolve_sample, run_rows, sample_problems, sample_sizes, tool_env, wire_moved,
)
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import TcpProxy
from pegasus_cloudio_testbed.stock import make_stock_home
from pegasus_cloudio_testbed.tools import ensure_s5cmd

BUCKET = "bench"
OURS = "pegasus-cloudio-transfer"
SITE = "minio"
IDENTITY = f"bench@{SITE}"


@dataclass(frozen=True)
class Params:
    count: int = 6173
    size: int = 300
    threads: int = 5
    stock_sample: int = 200
    s5cmd: bool = True
    rtt_ms: float = 0.0


STORES = {"s3": __name__, "gcs": "pegasus_cloudio_bench.small_files_gcs",
          "azure": "pegasus_cloudio_bench.small_files_azure", "scp": "pegasus_cloudio_bench.small_files_scp"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", choices=sorted(STORES), default="s3", help="staging store (default s3)")
    parser.add_argument("--count", type=_positive, default=6173, help="number of files (default 6173)")
    parser.add_argument("--size", type=_positive, default=300, help="bytes per file (default 300)")
    parser.add_argument("--threads", type=_positive, default=5, help="transfer threads (default 5)")
    add_sample_arguments(parser, "--stock-sample", "files the stock tool moves")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="emulated round trip added by the proxy")
    parser.add_argument("--no-s5cmd", action="store_true", help="skip the s5cmd comparison (s3 only)")


def usage_problems(args: argparse.Namespace) -> List[str]:
    return sample_problems("--stock-sample", args.stock_sample, args.count, args.allow_small_sample)


def run_from_args(args: argparse.Namespace) -> Dict[str, object]:
    params = Params(count=args.count, size=args.size, threads=args.threads,
                    stock_sample=resolve_sample(args.stock_sample, args.count),
                    s5cmd=not args.no_s5cmd, rtt_ms=args.rtt_ms)
    module = importlib.import_module(STORES[args.store])
    result: Dict[str, object] = module.run(params, Progress())
    return result


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def transfer_spec(pairs: Sequence[tuple], src_label: str, dst_label: str) -> bytes:  # type: ignore[type-arg]
    return json.dumps([
        {"type": "transfer", "lfn": os.path.basename(dst), "id": i,
         "src_urls": [{"site_label": src_label, "url": src}],
         "dest_urls": [{"site_label": dst_label, "url": dst}]}
        for i, (src, dst) in enumerate(pairs)]).encode()


class Workspace(StoreWorkspace):
    """A run's workspace on MinIO (``s3://IDENTITY/BUCKET``), with the stock tools' and s5cmd's
    environments beside ours."""

    def __init__(self, root: str, params: Params, server: MinioServer, proxy: TcpProxy) -> None:
        super().__init__(root, params, f"s3://{IDENTITY}/{BUCKET}")
        creds = server.write_pegasus_credentials(os.path.join(root, "credentials.conf"), site=SITE,
                                                 user="bench", endpoint=proxy.url())
        stock = make_stock_home(os.path.join(root, "stock"))
        self.stock_transfer = stock.transfer
        self.env = tool_env({"PEGASUS_CREDENTIALS": str(creds), "PEGASUS_CLOUDIO_CONFIG": os.devnull})
        self.stock_env = stock.env(self.env)
        self.s5cmd_env = tool_env({"AWS_ACCESS_KEY_ID": server.access_key,
                                   "AWS_SECRET_ACCESS_KEY": server.secret_key, "AWS_REGION": "us-east-1"})


def ours_argv(threads: int) -> List[str]:
    return [sys.executable, "-m", "pegasus_cloudio.dropin", "--threads", str(threads)]


def run(params: Params, progress: Progress) -> Dict[str, object]:
    root = tempfile.mkdtemp(prefix="pegasus-cloudio-bench-")
    try:
        with MinioServer() as server, TcpProxy((server.host, server.port), delay_ms=params.rtt_ms / 2) as proxy:
            ws = Workspace(root, params, server, proxy)
            runs = _run_all(ws, proxy, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report(params, runs)


def measure_ours(ws: Any, counter: Any, progress: Progress, mkdir_url: Optional[str] = None) -> Dict[str, object]:
    """Ours staging every file out, then in (checked byte for byte), after an optional mkdir.

    ``ws`` is any workspace with ``params, names, src, env, out_pairs, in_pairs, fresh_dir``;
    ``counter`` the proxy or relay the client talks through."""
    p = ws.params
    ours = ours_argv(p.threads)
    if mkdir_url is not None:
        progress.phase("creating the bucket")
        mkdir = json.dumps([{"type": "mkdir", "target": {"site_label": SITE, "url": mkdir_url}}])
        measure("ours", "mkdir", 0, ours, ws.env, counter, stdin=mkdir.encode())
    runs: Dict[str, object] = {}
    progress.phase(f"ours: stage-out of {p.count} files", wire_moved(counter, True), p.count * p.size)
    runs["ours_out"] = measure(OURS, "stage-out", p.count, ours, ws.env, counter,
                               stdin=transfer_spec(ws.out_pairs("ours", ws.names), "local", SITE))
    dest = ws.fresh_dir("in-ours")
    progress.phase(f"ours: stage-in of {p.count} files", wire_moved(counter, False), p.count * p.size)
    ours_in = runs["ours_in"] = measure(OURS, "stage-in", p.count, ours, ws.env, counter,
                                        stdin=transfer_spec(ws.in_pairs("ours", ws.names, dest), SITE, "local"))
    runs["ours_in_identical"] = ours_in.exit_code == 0 and files_identical(ws.src, dest, ws.names)
    return runs


def measure_startup(ws: Any, counter: Any, progress: Progress) -> float:
    """Median wall time of ours on an empty input (what every job pays at least)."""
    progress.phase("ours: start-up on an empty input (5 runs)")
    walls = [measure(OURS, "empty", 0, ours_argv(ws.params.threads), ws.env, counter, stdin=b"[]").wall_s
             for _ in range(5)]
    return statistics.median(walls)


def measure_go(ws: Any, counter: Any, progress: Progress) -> Dict[str, object]:
    """The Go tool staging every file out, then in (checked byte for byte): all files, no sample.

    ``ws`` and ``counter`` as for `measure_ours`."""
    p = ws.params
    argv, env = go_argv(p.threads), go_env(ws.env)
    progress.phase(f"{GO}: stage-out of {p.count} files", wire_moved(counter, True), p.count * p.size)
    runs: Dict[str, object] = {"go_out": measure(GO, "stage-out", p.count, argv, env, counter,
                                                 stdin=transfer_spec(ws.out_pairs("go", ws.names), "local", SITE))}
    dest = ws.fresh_dir("in-go")
    progress.phase(f"{GO}: stage-in of {p.count} files", wire_moved(counter, False), p.count * p.size)
    go_in = runs["go_in"] = measure(GO, "stage-in", p.count, argv, env, counter,
                                    stdin=transfer_spec(ws.in_pairs("go", ws.names, dest), SITE, "local"))
    runs["go_in_identical"] = go_in.exit_code == 0 and files_identical(ws.src, dest, ws.names)
    return runs


def _ours_variants(ws: Workspace, proxy: TcpProxy, progress: Progress) -> Dict[str, object]:
    """Ours stage-in with users' defaults (an empty node cache), and ours bundled out and in."""
    p = ws.params
    cache = ws.fresh_dir("node-cache")
    os.chmod(cache, 0o700)
    dest = ws.fresh_dir("in-ours-cache")
    progress.phase(f"ours: stage-in of {p.count} files, node cache on (all misses)", wire_moved(proxy, False),
                   p.count * p.size)
    runs: Dict[str, object] = {"ours_in_cache_miss": measure(
        f"{OURS} (node cache on, all misses)", "stage-in", p.count, ours_argv(p.threads),
        dict(ws.env, PEGASUS_CLOUDIO_CACHE_DIR=cache), proxy,
        stdin=transfer_spec(ws.in_pairs("ours", ws.names, dest), SITE, "local"))}
    identical = files_identical(ws.src, dest, ws.names)
    bundled, label = dict(ws.env, PEGASUS_CLOUDIO_BUNDLE="1"), f"{OURS} (bundled)"
    progress.phase(f"ours bundled: stage-out of {p.count} files", wire_moved(proxy, True), p.count * p.size)
    runs["bundled_out"] = measure(label, "stage-out", p.count, ours_argv(p.threads), bundled, proxy,
                                  stdin=transfer_spec(ws.out_pairs("bundled", ws.names), "local", SITE))
    dest = ws.fresh_dir("in-bundled")
    progress.phase(f"ours bundled: stage-in of {p.count} files", wire_moved(proxy, False), p.count * p.size)
    runs["bundled_in"] = measure(label, "stage-in", p.count, ours_argv(p.threads), bundled, proxy,
                                 stdin=transfer_spec(ws.in_pairs("bundled", ws.names, dest), SITE, "local"))
    runs["variants_identical"] = identical and files_identical(ws.src, dest, ws.names)
    return runs


def _run_all(ws: Workspace, proxy: TcpProxy, progress: Progress) -> Dict[str, object]:
    runs = measure_ours(ws, proxy, progress, mkdir_url=f"s3://{IDENTITY}/{BUCKET}")
    runs.update(_ours_variants(ws, proxy, progress))
    runs.update(measure_go(ws, proxy, progress))
    runs["stock_out"], runs["stock_in"] = _stock(ws, proxy, progress)
    if ws.params.s5cmd:
        runs["s5cmd_out"], runs["s5cmd_in"] = _s5cmd(ws, proxy, progress)
    runs["empty_input_wall_s"] = measure_startup(ws, proxy, progress)
    progress.done()
    return runs


def _stock(ws: Workspace, proxy: TcpProxy, progress: Progress) -> tuple:  # type: ignore[type-arg]
    p = ws.params
    sizes = sample_sizes(p.count, p.stock_sample)
    argv = [str(ws.stock_transfer), "--threads", str(p.threads)]
    out: List[Measurement] = []
    into: List[Measurement] = []
    for size in sizes:
        names = ws.names[:size]
        progress.phase(f"stock pegasus-transfer: stage-out sample of {size} files", wire_moved(proxy, True),
                       size * p.size)
        out.append(measure("stock pegasus-transfer", "stage-out", size, argv, ws.stock_env, proxy,
                           stdin=transfer_spec(ws.out_pairs(f"stock{size}", names), "local", SITE)))
        dest = ws.fresh_dir(f"in-stock{size}")
        progress.phase(f"stock pegasus-transfer: stage-in sample of {size} files", wire_moved(proxy, False),
                       size * p.size)
        into.append(measure("stock pegasus-transfer", "stage-in", size, argv, ws.stock_env, proxy,
                            stdin=transfer_spec(ws.in_pairs(f"stock{size}", names, dest), SITE, "local")))
    return extrapolate(out[0], out[-1], p.count), extrapolate(into[0], into[-1], p.count)


def _s5cmd(ws: Workspace, proxy: TcpProxy, progress: Progress) -> tuple:  # type: ignore[type-arg]
    progress.phase("building/locating s5cmd")
    s5cmd = str(ensure_s5cmd())
    p = ws.params
    base = [s5cmd, "--endpoint-url", proxy.url()]
    progress.phase(f"s5cmd: stage-out of {p.count} files", wire_moved(proxy, True), p.count * p.size)
    out = measure("s5cmd cp", "stage-out", p.count,
                  base + ["cp", f"{ws.src}/*", f"s3://{BUCKET}/s5cmd/"], ws.s5cmd_env, proxy)
    dest = ws.fresh_dir("in-s5cmd")
    progress.phase(f"s5cmd: stage-in of {p.count} files", wire_moved(proxy, False), p.count * p.size)
    into = measure("s5cmd cp", "stage-in", p.count,
                   base + ["cp", f"s3://{BUCKET}/s5cmd/*", dest + "/"], ws.s5cmd_env, proxy)
    return out, into


def report(params: Params, runs: Dict[str, object]) -> Dict[str, object]:
    measured = {k: v for k, v in runs.items() if isinstance(v, Measurement)}
    ours_in, ours_out = measured["ours_in"], measured["ours_out"]
    ratios: Dict[str, Optional[float]] = {
        "stage_in_speedup_vs_stock": ratio(measured["stock_in"].wall_s, ours_in.wall_s),
        "stage_out_speedup_vs_stock": ratio(measured["stock_out"].wall_s, ours_out.wall_s),
    }
    ratios.update(_go_ratios(measured))
    if "s5cmd_in" in measured:
        ratios["stage_in_wall_vs_s5cmd"] = ratio(ours_in.wall_s, measured["s5cmd_in"].wall_s)
        ratios["stage_out_wall_vs_s5cmd"] = ratio(ours_out.wall_s, measured["s5cmd_out"].wall_s)
    targets = {
        "stage_in_at_least_150x_stock": (ratios["stage_in_speedup_vs_stock"] or 0) >= 150,
        "stage_in_within_1.5x_s5cmd": (ratios.get("stage_in_wall_vs_s5cmd") or 99) <= 1.5
        if "s5cmd_in" in measured else None,
        "cpu_per_get_at_most_0.6ms": ours_in.cpu_ms_per_file <= 0.6,
        "connections_at_most_threads_plus_2": ours_in.connections <= params.threads + 2
        and ours_out.connections <= params.threads + 2,
        "empty_input_under_0.3s": float(runs["empty_input_wall_s"]) < 0.3,  # type: ignore[arg-type]
        "stage_in_files_identical": bool(runs["ours_in_identical"]) and bool(runs["variants_identical"])
        and bool(runs["go_in_identical"]),
        **_go_targets(params.rtt_ms, ratios),
    }
    return make_result(params, runs, ratios, targets, load_average=[round(x, 2) for x in os.getloadavg()],
                       notes=[STOCK_NOTE])


def make_result(params: Params, runs: Dict[str, object], ratios: Dict[str, Optional[float]],
                targets: Mapping[str, Optional[bool]], *, digits: int = 2, **extra: object) -> Dict[str, object]:
    """The small-files result, every store's scenario's: its measured ``runs`` (and the
    ``empty_input_wall_s`` among them), ``ratios`` rounded to ``digits``, ``targets``, and the
    scenario's ``extra`` keys (``store``: which, when not S3; ``notes``)."""
    return {
        "benchmark": "small-files",
        "params": params.__dict__,
        "runs": [m.as_dict() for m in runs.values() if isinstance(m, Measurement)],
        "empty_input_wall_s": round(float(runs["empty_input_wall_s"]), 4),  # type: ignore[arg-type]
        "ratios": {k: (round(v, digits) if v is not None else None) for k, v in ratios.items()},
        "targets": dict(targets),
        **extra,
    }


def _go_ratios(measured: Dict[str, Measurement]) -> Dict[str, Optional[float]]:
    """Ours (each variant) against the Go tool, wall and client CPU, in one run."""
    go_in, go_out = measured["go_in"], measured["go_out"]
    return {
        "stage_in_wall_vs_go": ratio(measured["ours_in"].wall_s, go_in.wall_s),
        "stage_in_cpu_vs_go": ratio(measured["ours_in"].cpu_s, go_in.cpu_s),
        "stage_out_wall_vs_go": ratio(measured["ours_out"].wall_s, go_out.wall_s),
        "cache_miss_stage_in_wall_vs_go": ratio(measured["ours_in_cache_miss"].wall_s, go_in.wall_s),
        "cache_miss_stage_in_cpu_vs_go": ratio(measured["ours_in_cache_miss"].cpu_s, go_in.cpu_s),
        "bundled_stage_in_wall_vs_go": ratio(measured["bundled_in"].wall_s, go_in.wall_s),
        "bundled_stage_out_wall_vs_go": ratio(measured["bundled_out"].wall_s, go_out.wall_s),
        "go_stage_in_speedup_vs_stock": ratio(measured["stock_in"].wall_s, go_in.wall_s),
    }


def _go_targets(rtt_ms: float, ratios: Dict[str, Optional[float]]) -> Dict[str, Optional[bool]]:
    """Issue 38's targets against the Go tool: the 20 ms ones at 20 ms, the loopback ones at 0 ms."""
    def at_most(name: str, bound: float, applies: bool) -> Optional[bool]:
        return ((ratios[name] or 99) <= bound) if applies else None

    far, near = rtt_ms == 20, rtt_ms == 0
    return {
        "stage_in_wall_at_most_0.25x_go_at_20ms": at_most("stage_in_wall_vs_go", 0.25, far),
        "bundled_stage_in_wall_at_most_0.05x_go_at_20ms": at_most("bundled_stage_in_wall_vs_go", 0.05, far),
        "stage_out_wall_at_most_0.5x_go_at_20ms": at_most("stage_out_wall_vs_go", 0.5, far),
        "cache_miss_stage_in_wall_at_most_0.8x_go_on_loopback": at_most("cache_miss_stage_in_wall_vs_go", 0.8, near),
        "cache_miss_cpu_per_get_at_most_0.6x_go_on_loopback": at_most("cache_miss_stage_in_cpu_vs_go", 0.6, near),
    }



COLUMNS = (("files", "files", "d"), ("wall s", "wall_s", ".2f"), ("cpu s", "cpu_s", ".2f"),
           ("files/s", "files_per_s", ".1f"), ("cpu ms/file", "cpu_ms_per_file", ".3f"),
           ("requests", "requests", "d"), ("conns", "connections", "d"))


def format_table(result: Dict[str, object]) -> str:
    rows = run_rows(result["runs"], COLUMNS)  # type: ignore[arg-type]
    rows.append("")
    rows.append(f"empty-input start-up (median of 5): {result['empty_input_wall_s']:.3f} s")
    for name, value in result["ratios"].items():  # type: ignore[attr-defined]
        rows.append(f"{name}: {value}")
    for name, ok in result["targets"].items():  # type: ignore[attr-defined]
        rows.append(f"target {name}: {'n/a' if ok is None else ('met' if ok else 'NOT MET')}")
    for note in result.get("notes", []):  # type: ignore[attr-defined]
        rows.append(f"note: {note}")
    return "\n".join(rows)
