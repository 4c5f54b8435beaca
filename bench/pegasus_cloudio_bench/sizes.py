"""Time vs file size (seed 002, Fig. 6 and 7): one file down and up, per tool and round trip.

In one run, on an embedded MinIO behind the test proxy at each ``--rtts`` value: for every
size in ``--sizes`` (default 0 B, 1 KB, 1 MB, 100 MB, 1 GB), each tool uploads one file and
downloads one object (the same object for every tool), timed as a whole process:

* ours: ``pegasus-cloudio-transfer``;
* stock: ``pegasus-transfer`` 5.1.3, the Python tool Pegasus 5 ships (one ``pegasus-s3`` process
  per file), ``--threads 1``;
* go: Pegasus's Go ``pegasus-transfer`` (the stock tool to come: aws-sdk-go-v2's transfer
  manager), ``--threads 1``;
* s5cmd ``cp``; boto3 (``upload_file`` / ``download_file``, s3transfer's defaults).

Sizes above ``--max-shaped`` run only at the first RTT (moving gigabytes through the Python
proxy at every RTT would take the whole report's time). Every download is checked by size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pegasus_cloudio_bench.go_tool import go_argv, go_env
from pegasus_cloudio_bench.harness import Progress, measure, tool_env, wire_moved
from pegasus_cloudio_bench.small_files import BUCKET, IDENTITY, SITE, ours_argv, transfer_spec
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import Shaping, TcpProxy
from pegasus_cloudio_testbed.stock import make_stock_home
from pegasus_cloudio_testbed.tools import ensure_s5cmd

TOOLS = ("ours", "stock", "go", "s5cmd", "boto3")
SIZE_WORDS = {"0": 0, "1KB": 10**3, "1MB": 10**6, "100MB": 10**8, "1GB": 10**9}

_BOTO3 = r"""
import sys, boto3
endpoint, direction, bucket, key, path = sys.argv[1:6]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
if direction == "upload":
    s3.upload_file(path, bucket, key)
else:
    s3.download_file(bucket, key, path)
"""


@dataclass(frozen=True)
class Params:
    sizes: Tuple[int, ...] = (0, 10**3, 10**6, 10**8, 10**9)
    rtts: Tuple[float, ...] = (0.0, 2.0, 20.0, 50.0)
    tools: Tuple[str, ...] = TOOLS
    max_shaped: int = 10**8
    repeats: int = 1


def parse_size(text: str) -> int:
    """``1MB`` -> 1000000; plain integers are bytes."""
    word = text.strip().upper()
    return SIZE_WORDS[word] if word in SIZE_WORDS else int(word)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="0,1KB,1MB,100MB,1GB", help="file sizes (default 0,1KB,1MB,100MB,1GB)")
    parser.add_argument("--rtts", default="0,2,20,50", help="round trips in ms (default 0,2,20,50)")
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"subset of {','.join(TOOLS)}")
    parser.add_argument("--max-shaped", default="100MB", help="largest size run at RTTs after the first")
    parser.add_argument("--repeats", type=int, default=1, help="runs per point, median reported (default 1)")


def params_from_args(args: argparse.Namespace) -> Params:
    return Params(tuple(parse_size(s) for s in args.sizes.split(",")),
                  tuple(float(r) for r in args.rtts.split(",")), tuple(t for t in args.tools.split(",") if t),
                  parse_size(args.max_shaped), max(1, args.repeats))


def run_from_args(args: argparse.Namespace) -> Dict[str, object]:
    return run(params_from_args(args), Progress())


class Clients:
    """The command line of each tool for one transfer, through one endpoint."""

    def __init__(self, root: str, server: MinioServer, endpoint: str) -> None:
        creds = server.write_pegasus_credentials(os.path.join(root, f"creds-{endpoint[-5:]}.conf"), site=SITE,
                                                 user="bench", endpoint=endpoint)
        self.endpoint = endpoint
        self.env = tool_env({"PEGASUS_CREDENTIALS": str(creds), "PEGASUS_CLOUDIO_CONFIG": os.devnull})
        stock = make_stock_home(os.path.join(root, "stock"))
        self.stock_transfer, self.stock_env = str(stock.transfer), stock.env(self.env)
        self.aws_env = tool_env({"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key,
                                 "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
        self._s5cmd: Optional[str] = None

    def command(self, tool: str, upload: bool, key: str, path: str) -> Tuple[List[str], Dict[str, str], bytes]:
        url = f"s3://{IDENTITY}/{BUCKET}/{key}"
        pair = (f"file://{path}", url) if upload else (url, f"file://{path}")
        spec = transfer_spec([pair], "local" if upload else SITE, SITE if upload else "local")
        if tool == "ours":
            return ours_argv(8), self.env, spec
        if tool == "stock":
            return [self.stock_transfer, "--threads", "1"], self.stock_env, spec
        if tool == "go":
            return go_argv(1), go_env(self.env), spec
        if tool == "s5cmd":
            if self._s5cmd is None:
                self._s5cmd = str(ensure_s5cmd())
            remote = f"s3://{BUCKET}/{key}"
            ends = [path, remote] if upload else [remote, path]
            return [self._s5cmd, "--endpoint-url", self.endpoint, "cp", *ends], self.aws_env, b""
        if tool == "boto3":
            argv = [sys.executable, "-c", _BOTO3, self.endpoint, "upload" if upload else "download", BUCKET, key, path]
            return argv, self.aws_env, b""
        raise ValueError(f"unknown tool {tool!r}")


def make_file(path: str, size: int) -> str:
    """``size`` random bytes at ``path`` (written in 8 MiB blocks)."""
    with open(path, "wb") as fh:
        left = size
        block = os.urandom(min(size, 8 << 20))
        while left > 0:
            fh.write(block[:left])
            left -= len(block)
    return path


def run(params: Params, progress: Progress) -> Dict[str, object]:
    root = tempfile.mkdtemp(prefix="pegasus-cloudio-sizes-")
    points: List[Dict[str, Any]] = []
    try:
        with MinioServer() as server:
            for index, rtt in enumerate(params.rtts):
                sizes = [s for s in params.sizes if index == 0 or s <= params.max_shaped]
                with TcpProxy((server.host, server.port), shaping=Shaping.rtt(rtt)) as proxy:
                    clients = Clients(root, server, proxy.url())
                    if index == 0:
                        _make_bucket(clients, proxy)
                    points += _at_rtt(root, clients, proxy, rtt, sizes, params, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    progress.done()
    return {"benchmark": "sizes", "params": params.__dict__, "load_average": [round(x, 2) for x in os.getloadavg()],
            "points": points}


def _make_bucket(clients: Clients, proxy: TcpProxy) -> None:
    spec = json.dumps([{"type": "mkdir", "target": {"site_label": SITE, "url": f"s3://{IDENTITY}/{BUCKET}"}}])
    measure("ours", "mkdir", 0, ours_argv(1), clients.env, proxy, stdin=spec.encode())


def _at_rtt(root: str, clients: Clients, proxy: TcpProxy, rtt: float, sizes: Sequence[int], params: Params,
            progress: Progress) -> List[Dict[str, Any]]:
    points = []
    for size in sizes:
        source = make_file(os.path.join(root, "source.dat"), size)
        argv, env, stdin = clients.command("ours", True, f"obj-{size}", source)
        measure("ours", "setup", 1, argv, env, proxy, stdin=stdin)
        for tool in params.tools:
            for upload in (True, False):
                direction = "upload" if upload else "download"
                progress.phase(f"rtt {rtt:g} ms, {size} B, {tool} {direction}", wire_moved(proxy, upload), size)
                points.append(_point(root, clients, proxy, tool, upload, size, source, params.repeats)
                              | {"rtt_ms": rtt})
        os.unlink(source)
    return points


def _point(root: str, clients: Clients, proxy: TcpProxy, tool: str, upload: bool, size: int, source: str,
           repeats: int) -> Dict[str, Any]:
    walls, ok = [], True
    requests = 0
    for i in range(repeats):
        dest = os.path.join(root, f"dest-{i}.dat")
        key = f"{tool}-{size}-{i}" if upload else f"obj-{size}"
        argv, env, stdin = clients.command(tool, upload, key, source if upload else dest)
        m = measure(tool, "upload" if upload else "download", 1, argv, env, proxy, stdin=stdin)
        walls.append(m.wall_s)
        requests = m.requests
        ok = ok and m.exit_code == 0 and (upload or os.path.getsize(dest) == size)
        if not upload and os.path.exists(dest):
            os.unlink(dest)
    wall = statistics.median(walls)
    return {"tool": tool, "direction": "upload" if upload else "download", "size": size, "wall_s": round(wall, 4),
            "mb_per_s": round(size / wall / 1e6, 2) if wall > 0 else None, "requests": requests, "ok": ok}


def format_table(result: Dict[str, Any]) -> str:
    rows = [f"{'rtt ms':>6} {'size B':>11} {'tool':<6} {'direction':<9} {'wall s':>8} {'MB/s':>9} {'reqs':>5} ok"]
    for p in result["points"]:
        rows.append(f"{p['rtt_ms']:>6g} {p['size']:>11} {p['tool']:<6} {p['direction']:<9} {p['wall_s']:>8.3f} "
                    f"{p['mb_per_s'] or 0:>9.2f} {p['requests']:>5} {p['ok']}")
    rows.append(f"load average at the end: {result['load_average']}")
    return "\n".join(rows)

