"""Large files: one object of ``--mib`` MiB (default 1 GiB) down and up, directly on loopback.

No proxy: the client talks to MinIO itself, so the limit is the machine's. In one run, each
direction is timed for ours (parallel multipart uploads; downloads as the engine does them),
Pegasus's Go ``pegasus-transfer`` (aws-sdk-go-v2's transfer manager), s5cmd (parallel ranged GETs and multipart) and curl of a presigned URL (one stream), plus the
disk's own write rate for the same size (``fsync``-ed). The run's limit is the best rate any
tool reached in that direction; the figure of merit is ours as a fraction of it (target 90%).
Downloads are checked by SHA-256 against the source.

So that no tool pays for another's work, the tools take turns: ``--repeats`` rounds, each
timing every tool up then down, in alternating order (A B C, C B A, ...), each tool keeping its
best time per direction; and every timed transfer starts after ``sync``, with no dirty pages
left by the one before. On the project's VM a download that follows 1 GiB uploads is slower
for every tool (``docs/benchmarks.md``), so no tool may always come first or last.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from pegasus_cloudio_bench.disk import Params as DiskParams, _sample
from pegasus_cloudio_bench.harness import Progress, tree_bytes
from pegasus_cloudio_bench.sizes import Clients, make_file
from pegasus_cloudio_bench.small_files import BUCKET, IDENTITY, SITE
from pegasus_cloudio_testbed.minio import MinioServer

TARGET_FRACTION = 0.9
TOOLS = ("ours", "go", "s5cmd", "curl")
GO_TARGET = 0.95  # issue 38: ours at least 0.95x the Go tool's throughput, each direction


@dataclass(frozen=True)
class Params:
    mib: int = 1024
    repeats: int = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mib", type=int, default=1024, help="object size in MiB (default 1024)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per tool and direction, best kept (default 1)")


def run_from_args(args: argparse.Namespace) -> Dict[str, object]:
    return run(Params(args.mib, max(1, args.repeats)), Progress())


def _sha(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(8 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _presigned(server: MinioServer, method: str, key: str) -> str:
    import boto3  # type: ignore[import-untyped]  # a dev/bench dependency, only needed here
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                          aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key)
    return str(client.generate_presigned_url(method, Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=3600))


def _command(clients: Clients, server: MinioServer, tool: str, upload: bool, key: str,
             path: str) -> Tuple[List[str], Dict[str, str], bytes]:
    if tool != "curl":
        return clients.command(tool, upload, key, path)
    if upload:
        return ["curl", "-sSf", "-T", path, _presigned(server, "put_object", key)], clients.aws_env, b""
    return ["curl", "-sSf", "-o", path, _presigned(server, "get_object", key)], clients.aws_env, b""


def _timed(argv: List[str], env: Dict[str, str], stdin: bytes) -> Tuple[float, int]:
    started = time.monotonic()
    done = subprocess.run(argv, input=stdin, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.monotonic() - started, done.returncode


def run(params: Params, progress: Progress) -> Dict[str, object]:
    root = tempfile.mkdtemp(prefix="pegasus-cloudio-large-")
    size = params.mib << 20
    try:
        with MinioServer() as server:
            clients = Clients(root, server, server.endpoint)
            source = make_file(os.path.join(root, "source.dat"), size)
            digest = _sha(source)
            argv, env, stdin = clients.command("ours", True, "large", source)
            mkdir = subprocess.run(argv, input=_mkdir_spec(), env=env, capture_output=True)
            if mkdir.returncode != 0 or _timed(argv, env, stdin)[1] != 0:
                raise RuntimeError("could not create the bucket and the large object")
            times: Dict[Tuple[str, bool], List[float]] = {}
            ok: Dict[Tuple[str, bool], bool] = {}
            for r in range(params.repeats):
                for tool in (TOOLS if r % 2 == 0 else TOOLS[::-1]):
                    for upload in (True, False):
                        progress.phase(f"{params.mib} MiB {'up' if upload else 'down'}: {tool}, round {r + 1}",
                                       _moved(server, root, upload), size)
                        wall, good = _once(clients, server, tool, upload, root, source, digest, r)
                        times.setdefault((tool, upload), []).append(wall)
                        ok[(tool, upload)] = ok.get((tool, upload), True) and good
            runs = [{"tool": tool, "direction": "upload" if upload else "download",
                     "wall_s": round(min(walls), 3), "mb_per_s": round(size / min(walls) / 1e6, 1),
                     "rounds_wall_s": [round(w, 3) for w in walls], "ok": ok[(tool, upload)]}
                    for tool in TOOLS for upload in (True, False) for walls in [times[(tool, upload)]]]
            progress.phase(f"disk write of {params.mib} MiB")
            disk = _sample(os.path.join(root, "disk.dat"), DiskParams(transfer_mib=params.mib))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    progress.done()
    return report(params, runs, disk)


def _moved(server: MinioServer, root: str, upload: bool) -> Callable[[], int]:
    """Bytes of this transfer so far, for the progress line: what MinIO's data directory
    gained (an upload) or the destination file holds, under whatever temp name the tool writes
    (a download)."""
    if not upload:
        return lambda: tree_bytes(root, "down.dat")
    before = tree_bytes(str(server.data_dir))
    return lambda: max(0, tree_bytes(str(server.data_dir)) - before)


def _mkdir_spec() -> bytes:
    return json.dumps([{"type": "mkdir", "target": {"site_label": SITE, "url": f"s3://{IDENTITY}/{BUCKET}"}}]).encode()


def _once(clients: Clients, server: MinioServer, tool: str, upload: bool, root: str, source: str, digest: str,
          round_no: int) -> Tuple[float, bool]:
    """One timed transfer, after ``sync``: (wall seconds, exit 0 and, down, the right bytes)."""
    dest = os.path.join(root, "down.dat")
    argv, env, stdin = _command(clients, server, tool, upload, f"{tool}-up-{round_no}" if upload else "large",
                                source if upload else dest)
    os.sync()
    wall, code = _timed(argv, env, stdin)
    good = code == 0 and (upload or _sha(dest) == digest)
    if os.path.exists(dest):
        os.unlink(dest)
    return wall, good


def report(params: Params, runs: List[Dict[str, Any]], disk: Dict[str, float]) -> Dict[str, object]:
    fractions: Dict[str, Optional[float]] = {}
    limits: Dict[str, float] = {}
    for direction in ("download", "upload"):
        rates = {r["tool"]: r["mb_per_s"] for r in runs if r["direction"] == direction and r["ok"]}
        limits[direction] = max(rates.values()) if rates else 0.0
        ours = rates.get("ours")
        fractions[direction] = round(ours / limits[direction], 3) if ours and limits[direction] else None
    targets = {f"ours_{d}_at_least_90pct_of_limit": (f or 0) >= TARGET_FRACTION for d, f in fractions.items()}
    versus_go: Dict[str, Optional[float]] = {}
    for direction in ("download", "upload"):
        rates = {r["tool"]: r["mb_per_s"] for r in runs if r["direction"] == direction and r["ok"]}
        versus_go[direction] = round(rates["ours"] / rates["go"], 3) if rates.get("ours") and rates.get("go") else None
        targets[f"ours_{direction}_at_least_{GO_TARGET:g}x_go"] = (versus_go[direction] or 0) >= GO_TARGET
    targets["downloads_identical"] = all(r["ok"] for r in runs)
    return {"benchmark": "large", "params": params.__dict__, "runs": runs, "disk_write_mb_per_s": disk["write_mb_per_s"],
            "limit_mb_per_s": limits, "ours_fraction_of_limit": fractions, "ours_vs_go_throughput": versus_go, "targets": targets,
            "cores": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}


def format_table(result: Dict[str, Any]) -> str:
    rows = [f"{'tool':<6} {'direction':<9} {'wall s':>8} {'MB/s':>8} ok"]
    rows += [f"{r['tool']:<6} {r['direction']:<9} {r['wall_s']:>8.2f} {r['mb_per_s']:>8.1f} {r['ok']}"
             for r in result["runs"]]
    rows.append(f"disk write (fsync): {result['disk_write_mb_per_s']} MB/s; limit (best tool): "
                f"{result['limit_mb_per_s']}; ours as a fraction of it: {result['ours_fraction_of_limit']}")
    rows.append(f"ours / Go pegasus-transfer throughput: {result.get('ours_vs_go_throughput')}")
    rows.append(f"cores {result['cores']}, load {result['load_average']}")
    rows += [f"target {k}: {'met' if v else 'NOT MET'}" for k, v in result["targets"].items()]
    return "\n".join(rows)
