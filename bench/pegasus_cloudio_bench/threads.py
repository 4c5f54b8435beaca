"""Throughput vs threads for small files (seed 002, Fig. 10): ours and s5cmd, 1 to 32 workers.

In one run, on an embedded MinIO behind the test proxy at ``--rtt-ms``: ``--count`` files of
``--size`` bytes are staged in by ``pegasus-cloudio-transfer --threads T`` and by s5cmd
``--numworkers T`` for each T in ``--threads``; files per second and connections are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from pegasus_cloudio_bench.harness import Progress, files_identical, fresh_dir, make_inputs, measure, tool_env
from pegasus_cloudio_bench.small_files import BUCKET, IDENTITY, SITE, ours_argv, transfer_spec
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import Shaping, TcpProxy
from pegasus_cloudio_testbed.tools import ensure_s5cmd


@dataclass(frozen=True)
class Params:
    count: int = 500
    size: int = 300
    threads: Tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    rtt_ms: float = 20.0
    s5cmd: bool = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, default=500, help="files (default 500)")
    parser.add_argument("--size", type=int, default=300, help="bytes per file (default 300)")
    parser.add_argument("--threads", default="1,2,4,8,16,32", help="thread counts (default 1,2,4,8,16,32)")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="round trip added by the proxy (default 20)")
    parser.add_argument("--no-s5cmd", action="store_true", help="ours only")


def run_from_args(args: argparse.Namespace) -> Dict[str, object]:
    threads = tuple(int(t) for t in args.threads.split(","))
    return run(Params(args.count, args.size, threads, args.rtt_ms, not args.no_s5cmd), Progress())


def run(params: Params, progress: Progress) -> Dict[str, object]:
    root = tempfile.mkdtemp(prefix="pegasus-cloudio-threads-")
    points: List[Dict[str, Any]] = []
    try:
        with MinioServer() as server, TcpProxy((server.host, server.port), shaping=Shaping.rtt(params.rtt_ms)) as proxy:
            creds = server.write_pegasus_credentials(os.path.join(root, "creds.conf"), site=SITE, user="bench",
                                                     endpoint=proxy.url())
            env = tool_env({"PEGASUS_CREDENTIALS": str(creds), "PEGASUS_CLOUDIO_CONFIG": os.devnull})
            aws = tool_env({"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key,
                            "AWS_REGION": "us-east-1"})
            src, names = make_inputs(root, params.count, params.size)
            url = f"s3://{IDENTITY}/{BUCKET}"
            progress.phase(f"uploading {params.count} files")
            measure("ours", "setup", 0, ours_argv(8), env, proxy, stdin=json.dumps(
                [{"type": "mkdir", "target": {"site_label": SITE, "url": url}}]).encode())
            measure("ours", "setup", params.count, ours_argv(16), env, proxy,
                    stdin=transfer_spec([(f"file://{src}/{n}", f"{url}/t/{n}") for n in names], "local", SITE))
            s5cmd = str(ensure_s5cmd()) if params.s5cmd else None
            for threads in params.threads:
                dest = fresh_dir(root, "in")
                progress.phase(f"ours, {threads} threads")
                m = measure("ours", "stage-in", params.count, ours_argv(threads), env, proxy,
                            stdin=transfer_spec([(f"{url}/t/{n}", f"file://{dest}/{n}") for n in names], SITE, "local"))
                points.append(_point("ours", threads, m, files_identical(src, dest, names)))
                if s5cmd is not None:
                    dest = fresh_dir(root, "in")
                    progress.phase(f"s5cmd, {threads} workers")
                    m = measure("s5cmd", "stage-in", params.count, [s5cmd, "--endpoint-url", proxy.url(),
                                "--numworkers", str(threads), "cp", f"s3://{BUCKET}/t/*", dest + "/"], aws, proxy)
                    points.append(_point("s5cmd", threads, m, files_identical(src, dest, names)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    progress.done()
    return {"benchmark": "threads", "params": params.__dict__, "points": points,
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def _point(tool: str, threads: int, m: Any, identical: bool) -> Dict[str, Any]:
    return {"tool": tool, "threads": threads, "wall_s": round(m.wall_s, 3), "files_per_s": round(m.files_per_s, 1),
            "connections": m.connections, "requests": m.requests, "ok": m.exit_code == 0 and identical}


def format_table(result: Dict[str, Any]) -> str:
    rows = [f"{'tool':<6} {'threads':>7} {'wall s':>8} {'files/s':>9} {'conns':>6} {'reqs':>6} ok"]
    rows += [f"{p['tool']:<6} {p['threads']:>7} {p['wall_s']:>8.2f} {p['files_per_s']:>9.1f} {p['connections']:>6} "
             f"{p['requests']:>6} {p['ok']}" for p in result["points"]]
    rows.append(f"params {result['params']}; load {result['load_average']}")
    return "\n".join(rows)
