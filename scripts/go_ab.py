"""Ours against the Go pegasus-transfer on many small files, alternating, on one MinIO.

    .venv/bin/python scripts/go_ab.py [--count 6173] [--size 300] [--rtt-ms 20] [--rounds 3]
                                      [--threads 5] [--modes in,out,cache,bundled] [--before TREE]

``bench small-files`` runs each tool once and spends most of its time on the Python tool's
sample; this script runs only ours and the Go tool (issue 38's targets), round after round in
alternating order, through the test bed's counting proxy (``--rtt-ms`` added). Modes:
``in``: stage-in, node cache off; ``out``: stage-out to a fresh prefix; ``cache``: stage-in
with users' defaults (a fresh node cache, every file a miss; the next run starts once the child
that fills the cache behind the job's answer is done); ``bundled``:
``PEGASUS_CLOUDIO_BUNDLE=1`` out, then in. Each run records the client's wall and CPU
(``RUSAGE_CHILDREN``), requests and connections at the proxy, and the CPU that MinIO and the
proxy (this process) spent meanwhile: when those approach the wall on a loaded machine, the
server side is the limit, not the client. Medians over the rounds, and ours over Go's.
``--before TREE`` adds a third contestant in the same rounds: ours from another source checkout
(``git archive REV transfer pegasus_cloudio | tar -x -C TREE``, put first on ``PYTHONPATH`` and run
from it), for a change's before and after beside the Go tool. Each of ours runs from its own tree
(``python -m`` puts the working directory first on ``sys.path``): this script's checkout, or TREE.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout: "ours"
sys.path.insert(0, HERE)

from pegasus_cloudio_bench.go_tool import go_argv, go_env  # noqa: E402
from pegasus_cloudio_bench.harness import files_identical, measure, wait_filled  # noqa: E402
from pegasus_cloudio_bench.small_files import (  # noqa: E402
    IDENTITY, SITE, Params, Workspace, ours_argv, transfer_spec,
)
from pegasus_cloudio_testbed.minio import MinioServer  # noqa: E402
from pegasus_cloudio_testbed.proxy import TcpProxy  # noqa: E402


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _run(ws: Workspace, server: MinioServer, proxy: TcpProxy, tool: str, argv: List[str], env: Dict[str, str],
         spec: bytes, cwd: str = HERE) -> Dict[str, float]:
    """One run; ``cwd``: the tree ``python -m`` imports ours from (it puts the working directory
    first on ``sys.path``, before ``PYTHONPATH``)."""
    minio0, proxy0 = server.cpu_s(), _self_cpu()
    m = measure(tool, "", ws.params.count, argv, env, proxy, stdin=spec, cwd=cwd)
    if m.exit_code != 0:
        raise SystemExit(f"{tool} exited {m.exit_code}")
    return {"wall_s": m.wall_s, "cpu_s": m.cpu_s, "requests": m.requests, "connections": m.connections,
            "minio_cpu_s": server.cpu_s() - minio0, "proxy_cpu_s": _self_cpu() - proxy0}


def _round(ws: Workspace, server: MinioServer, proxy: TcpProxy, modes: List[str], r: int,
           threads: int, before: str = "") -> Dict[str, Dict[str, float]]:
    contestants = [("ours", ours_argv(threads), ws.env, HERE), ("go", go_argv(threads), go_env(ws.env), HERE)]
    if before:
        contestants.insert(1, ("before", ours_argv(threads), dict(ws.env, PYTHONPATH=before), before))
    if r % 2:
        contestants.reverse()
    out: Dict[str, Dict[str, float]] = {}
    for name, argv, env, tree in contestants:
        if "in" in modes:
            dest = ws.fresh_dir(f"in-{name}-{r}")
            out[f"{name}_in"] = _run(ws, server, proxy, name, argv, env,
                                     transfer_spec(ws.in_pairs("data", ws.names, dest), SITE, "local"), tree)
            if not files_identical(ws.src, dest, ws.names):
                raise SystemExit(f"{name} stage-in: files differ")
        if "out" in modes:
            out[f"{name}_out"] = _run(ws, server, proxy, name, argv, env,
                                      transfer_spec(ws.out_pairs(f"{name}-out-{r}", ws.names), "local", SITE), tree)
        if name != "go" and "cache" in modes:
            cache, dest = ws.fresh_dir(f"cache-{name}-{r}"), ws.fresh_dir(f"in-cache-{name}-{r}")
            os.chmod(cache, 0o700)
            out[f"{name}_cache_in"] = _run(ws, server, proxy, name, argv, dict(env, PEGASUS_CLOUDIO_CACHE_DIR=cache),
                                        transfer_spec(ws.in_pairs("data", ws.names, dest), SITE, "local"), tree)
            wait_filled(cache, len(ws.names))  # the child filling it behind the answer overlaps no other run
        if name != "go" and "bundled" in modes:
            bundled = dict(env, PEGASUS_CLOUDIO_BUNDLE="1")
            spec = transfer_spec(ws.out_pairs(f"b-{name}-{r}", ws.names), "local", SITE)
            out[f"{name}_bundled_out"] = _run(ws, server, proxy, name, argv, bundled, spec, tree)
            dest = ws.fresh_dir(f"in-bundled-{name}-{r}")
            spec = transfer_spec(ws.in_pairs(f"b-{name}-{r}", ws.names, dest), SITE, "local")
            out[f"{name}_bundled_in"] = _run(ws, server, proxy, name, argv, bundled, spec, tree)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=6173)
    parser.add_argument("--size", type=int, default=300)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=5)
    parser.add_argument("--modes", default="in,out,cache,bundled")
    parser.add_argument("--before", default="", help="another checkout's tree, run as a third contestant")
    args = parser.parse_args()
    modes = args.modes.split(",")
    params = Params(count=args.count, size=args.size, threads=args.threads, rtt_ms=args.rtt_ms, s5cmd=False)
    root = tempfile.mkdtemp(prefix="go-ab-")
    load = [os.getloadavg()[0]]
    runs: Dict[str, List[Dict[str, float]]] = {}
    try:
        with MinioServer() as server, TcpProxy((server.host, server.port), delay_ms=args.rtt_ms / 2) as proxy:
            ws = Workspace(root, params, server, proxy)
            mkdir = json.dumps([{"type": "mkdir", "target": {"site_label": SITE, "url": f"s3://{IDENTITY}/bench"}}])
            _run(ws, server, proxy, "ours", ours_argv(args.threads), ws.env, mkdir.encode())
            _run(ws, server, proxy, "ours", ours_argv(args.threads), ws.env,
                 transfer_spec(ws.out_pairs("data", ws.names), "local", SITE))
            for r in range(args.rounds):
                before = os.path.abspath(args.before) if args.before else ""
                for key, value in _round(ws, server, proxy, modes, r, args.threads, before).items():
                    runs.setdefault(key, []).append(value)
                load.append(os.getloadavg()[0])
                print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]['wall_s']:.2f} s" for k, v in runs.items()),
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {k: {f: round(statistics.median(run[f] for run in v), 3) for f in v[0]} for k, v in runs.items()}
    ratios = {f"{k}_vs_go_{f}": round(medians[k][f] / medians[g][f], 3)
              for k in medians if not k.startswith("go") for g in (("go_out" if k.endswith("_out") else "go_in"),)
              if g in medians for f in ("wall_s", "cpu_s")}
    print(json.dumps({"params": vars(args), "load_1min": [round(x, 1) for x in load], "medians": medians,
                      "ratios": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
