"""The library as a custom workflow engine uses it: ours against boto3, s3fs and obstore.

``pegasus-cloudio bench library``: ``--count`` files of ``--size`` bytes up to an embedded MinIO
and back down, ``--threads`` workers, every contestant a fresh process (start-up included) that
imports only its own library (:mod:`pegasus_cloudio_bench.library_worker`):

* ``ours``: :class:`transfer.client.Client` ``copy`` (one engine batch);
* ``ours-fsspec``: the same through ``fsspec.filesystem("cloudio")`` bulk ``put``/``get``;
* ``ours-bundles``: ``Client(bundles=True)``: the batch as bundles, read back from them;
* ``boto3``: ``put_object``/``get_object`` on a thread pool of ``--threads``;
* ``s3fs``: bulk ``put``/``get`` (its asyncio concurrency);
* ``obstore``: ``obstore.put``/``get`` on a thread pool of ``--threads``;
* ``ours-before`` (with ``--before CHECKOUT``): ``ours`` from that source tree (its
  ``PYTHONPATH``), taking its turn in the same rounds: an A/B of a change under one load.

Tools take turns in alternating rounds (the order rotates each round); wall time, CPU (user +
system of the process) and requests (counted by a proxy in front of MinIO) are reported per
run, and the median per tool. Every download is checked byte for byte. Targets (issue #23):
ours per-file wall and CPU <= obstore's; through fsspec >= 3x faster than s3fs; with bundles
>= 5x faster than obstore.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from pegasus_cloudio_bench.harness import Measurement, Progress, files_identical, fresh_dir, make_inputs, measure, tool_env
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import TcpProxy

BUCKET = "library"
WORKER = "pegasus_cloudio_bench.library_worker"
TOOLS = ("ours", "ours-fsspec", "ours-bundles", "boto3", "s3fs", "obstore")


@dataclass(frozen=True)
class Params:
    count: int = 2000
    size: int = 300
    threads: int = 8
    rounds: int = 3
    tools: Tuple[str, ...] = TOOLS
    before: str = ""  # a source tree whose ``ours`` runs as ``ours-before``


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, default=2000, help="files (default 2000)")
    parser.add_argument("--size", type=int, default=300, help="bytes per file (default 300)")
    parser.add_argument("--threads", type=int, default=8, help="workers of every tool (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated subset of {','.join(TOOLS)}")
    parser.add_argument("--before", metavar="CHECKOUT", default="",
                        help="also run ours from this source tree, as ours-before, in the same rounds")


def run_from_args(args: argparse.Namespace) -> Dict[str, object]:
    tools = tuple(t for t in args.tools.split(",") if t)
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        raise SystemExit(f"bench library: unknown tool(s) {', '.join(unknown)} (known: {', '.join(TOOLS)})")
    if args.before:
        if not os.path.isfile(os.path.join(args.before, "transfer", "client.py")):
            raise SystemExit(f"bench library: --before {args.before}: not a source tree (no transfer/client.py)")
        tools += ("ours-before",)
    return run(Params(args.count, args.size, args.threads, args.rounds, tools, os.path.abspath(args.before)
                      if args.before else ""), Progress())


def _worker(tool: str, env: Dict[str, str], before: str) -> Tuple[str, Dict[str, str]]:
    """(the worker's tool name, its environment): ``ours-before`` is ``ours`` from ``before``."""
    if tool != "ours-before":
        return tool, env
    return "ours", {**env, "PYTHONPATH": os.pathsep.join((before, os.path.join(before, "bench")))}


def run(params: Params, progress: Progress) -> Dict[str, object]:
    root = tempfile.mkdtemp(prefix="pegasus-cloudio-library-")
    runs: Dict[str, List[Dict[str, object]]] = {f"{t} {d}": [] for t in params.tools for d in ("up", "down")}
    try:
        with MinioServer() as server, TcpProxy((server.host, server.port)) as proxy:
            src, names = make_inputs(root, params.count, params.size)
            names_file = os.path.join(root, "names")
            with open(names_file, "w") as fh:
                fh.write("\n".join(names))
            env = tool_env({"AWS_EC2_METADATA_DISABLED": "true"})

            def job(tool: str, direction: str, prefix: str, local: str) -> Measurement:
                name, worker_env = _worker(tool, env, params.before)
                argv = [sys.executable, "-m", WORKER, name, direction, proxy.url(), server.access_key,
                        server.secret_key, BUCKET, prefix, names_file, local, str(params.threads)]
                return measure(tool, direction, params.count, argv, worker_env, proxy)

            progress.phase("creating the bucket and the objects to download")
            from transfer.client import Client

            with Client(endpoint=proxy.url(), access_key=server.access_key, secret_key=server.secret_key) as client:
                client.mkdir(f"s3://{BUCKET}")
            for tool, prefix in (("ours", "data"), ("ours-bundles", "bundled")):
                if job(tool, "up", prefix, src).exit_code != 0:
                    raise RuntimeError(f"set-up upload with {tool} failed")
            for number in range(params.rounds):
                order = list(params.tools[number % len(params.tools):] + params.tools[:number % len(params.tools)])
                for tool in order:
                    progress.phase(f"round {number + 1}/{params.rounds}: {tool}")
                    up = job(tool, "up", f"up/{tool}/{number}", src)
                    out = fresh_dir(root, f"down-{tool}-{number}")
                    down = job(tool, "down", "bundled" if tool == "ours-bundles" else "data", out)
                    identical = down.exit_code == 0 and files_identical(src, out, names)
                    shutil.rmtree(out, ignore_errors=True)
                    runs[f"{tool} up"].append(_row(up, True))
                    runs[f"{tool} down"].append(_row(down, identical))
            progress.done()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = {key: _median(rows) for key, rows in runs.items() if rows}
    return {"scenario": "library", "count": params.count, "size": params.size, "threads": params.threads,
            "rounds": params.rounds, "runs": runs, "median": summary, "targets": _targets(summary)}


def _row(m: Measurement, identical: bool) -> Dict[str, object]:
    return {"wall_s": round(m.wall_s, 3), "cpu_s": round(m.cpu_s, 3), "requests": m.requests,
            "connections": m.connections, "exit_code": m.exit_code, "identical": identical}


def _median(rows: List[Dict[str, object]]) -> Dict[str, object]:
    ok = all(r["exit_code"] == 0 and r["identical"] for r in rows)
    return {"wall_s": round(statistics.median(float(r["wall_s"]) for r in rows), 3),  # type: ignore[arg-type]
            "cpu_s": round(statistics.median(float(r["cpu_s"]) for r in rows), 3),  # type: ignore[arg-type]
            "requests": int(statistics.median(int(r["requests"]) for r in rows)),  # type: ignore[call-overload]
            "ok": ok}


def _both(summary: Dict[str, Dict[str, object]], tool: str, what: str) -> Optional[float]:
    """Up plus down: the round trip the targets are stated for."""
    try:
        return float(summary[f"{tool} up"][what]) + float(summary[f"{tool} down"][what])  # type: ignore[arg-type]
    except KeyError:
        return None


def _targets(summary: Dict[str, Dict[str, object]]) -> List[Dict[str, object]]:
    checks = [("ours wall <= obstore wall", "ours", "obstore", "wall_s", 1.0),
              ("ours-before wall <= obstore wall", "ours-before", "obstore", "wall_s", 1.0),
              ("ours wall <= ours-before wall", "ours", "ours-before", "wall_s", 1.0),
              ("ours CPU <= obstore CPU", "ours", "obstore", "cpu_s", 1.0),
              ("ours-fsspec >= 3x faster than s3fs", "ours-fsspec", "s3fs", "wall_s", 1 / 3),
              ("ours-bundles >= 5x faster than obstore", "ours-bundles", "obstore", "wall_s", 1 / 5)]
    found = []
    for name, ours, theirs, what, limit in checks:
        a, b = _both(summary, ours, what), _both(summary, theirs, what)
        if a is None or b is None or b <= 0:
            continue
        found.append({"target": name, "ours": round(a, 3), "theirs": round(b, 3), "ratio": round(a / b, 3),
                      "met": a / b <= limit})
    return found


def format_table(result: Dict[str, object]) -> str:
    """The medians as a table, then the targets."""
    lines = [f"bench library: {result['count']} x {result['size']} B, {result['threads']} threads, "
             f"{result['rounds']} alternating rounds (medians; wall and CPU per file in ms)",
             f"{'tool':<20}{'wall s':>9}{'CPU s':>9}{'wall/f':>9}{'CPU/f':>9}{'requests':>10}  ok"]
    count = int(result["count"])  # type: ignore[call-overload]
    for key, row in result["median"].items():  # type: ignore[attr-defined]
        lines.append(f"{key:<20}{row['wall_s']:>9.3f}{row['cpu_s']:>9.3f}{1000 * row['wall_s'] / count:>9.3f}"
                     f"{1000 * row['cpu_s'] / count:>9.3f}{row['requests']:>10}  {'yes' if row['ok'] else 'NO'}")
    for target in result["targets"]:  # type: ignore[attr-defined]
        lines.append(f"target {target['target']}: {target['ours']} vs {target['theirs']} "
                     f"(ratio {target['ratio']}): {'met' if target['met'] else 'NOT met'}")
    return "\n".join(lines)
