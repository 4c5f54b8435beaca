"""Files lost to connection resets: runs of the drop-in reading many objects through a proxy
that resets 1 GET in N part-way through its answer (issue 39, item 11).

    .venv/bin/python scripts/resets.py [--files 300] [--size 65536] [--every 7] [--runs 10]
                                       [--procs 1] [--slowdown-every 0] [--tree DIR ...]

One MinIO on loopback, the test bed's fault proxy in front of it resetting every ``--every``-th
GET after the head and half the body (``Fault.reset`` with ``every``). Each run is the Python
drop-in (``python -m pegasus_cloudio.dropin``) with default settings (its thread count, retries
and node cache, the cache in a fresh directory per run) staging all the objects into a fresh
directory (``--procs`` such drop-ins at once, each into its own directory; ``--slowdown-every
M`` makes the proxy also answer 1 GET in M with 503 SlowDown, a store that throttles). A file
is lost when it is not there, whole, after the run. Prints, per tree (the
source tree the drop-in is imported from: this checkout by default; give another checkout, e.g.
a worktree of main, for an A/B in the same run, runs alternating), the files lost per run, the
runs that lost any, and the GETs the proxy saw. A development measurement, with
``pegasus-cloudio bench`` for speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pegasus_cloudio_bench.harness import make_inputs, tool_env  # noqa: E402
from pegasus_cloudio_testbed.minio import MinioServer  # noqa: E402
from pegasus_cloudio_testbed.proxy import Fault, TcpProxy  # noqa: E402

BUCKET = "resets"
HEAD = 400  # about the answer's head: the reset falls inside the body


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--size", type=int, default=64 << 10)
    parser.add_argument("--every", type=int, default=7)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--procs", type=int, default=1, help="drop-ins at once per run")
    parser.add_argument("--slowdown-every", type=int, default=0, help="also answer 1 GET in M with 503 SlowDown")
    parser.add_argument("--tree", action="append", default=[], help="source tree to run the drop-in from")
    args = parser.parse_args(argv)
    trees = args.tree or [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    with tempfile.TemporaryDirectory(prefix="resets-") as root, MinioServer() as store, \
            TcpProxy((store.host, store.port)) as proxy:
        creds = store.write_pegasus_credentials(os.path.join(root, "creds.conf"), site="minio", user="test",
                                                endpoint=proxy.url())
        src, names = make_inputs(root, args.files, args.size)
        env = tool_env({"PEGASUS_CREDENTIALS": str(creds), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
                        "AWS_EC2_METADATA_DISABLED": "true"})
        _upload(env, src, names, trees[0])
        faults = [dataclasses.replace(Fault.reset(HEAD + args.size // 2, method="GET", times=1 << 30),
                                      every=args.every)]
        if args.slowdown_every:
            faults.append(dataclasses.replace(Fault.status(503, method="GET", times=1 << 30), every=args.slowdown_every))
        lost: Dict[str, List[int]] = {tree: [] for tree in trees}
        gets: Dict[str, List[int]] = {tree: [] for tree in trees}
        for run in range(args.runs):
            for tree in trees:
                proxy.reset_counters()
                proxy.set_faults(faults)
                lost[tree].append(_run(env, src, names, tree, os.path.join(root, f"run{run}-{trees.index(tree)}"),
                                       args.procs))
                gets[tree].append(proxy.requests_by_method.get("GET", 0))
                proxy.clear_faults()
        report = {tree: {"lost_per_run": lost[tree], "runs_losing": sum(1 for n in lost[tree] if n),
                         "gets_per_run": gets[tree]} for tree in trees}
        print(json.dumps(report, indent=1))
    return 0


def _spec(names: List[str], linkage: str, source: str, dest: str) -> bytes:
    return json.dumps([{"type": "transfer", "linkage": linkage, "lfn": n, "id": i,
                        "src_urls": [{"site_label": "local" if linkage == "output" else "minio",
                                      "url": source.format(n)}],
                        "dest_urls": [{"site_label": "minio" if linkage == "output" else "local",
                                       "url": dest.format(n)}]} for i, n in enumerate(names)]).encode()


def _upload(env: Dict[str, str], src: str, names: List[str], tree: str) -> None:
    spec = _spec(names, "output", f"file://{src}/{{}}", f"s3://test@minio/{BUCKET}/in/{{}}")
    subprocess.run([sys.executable, "-m", "pegasus_cloudio.s3cli.main", "mkdir", f"s3://test@minio/{BUCKET}"],
                   env={**env, "PYTHONPATH": tree}, cwd=tree, check=True)
    subprocess.run([sys.executable, "-m", "pegasus_cloudio.dropin"], input=spec, env={**env, "PYTHONPATH": tree},
                   cwd=tree, check=True, stderr=subprocess.DEVNULL)


def _run(env: Dict[str, str], src: str, names: List[str], tree: str, dest: str, procs: int) -> int:
    """``procs`` drop-ins at once, each into its own directory under ``dest``, with default
    settings; the number of files not there whole, over all of them."""
    running = []
    for proc in range(procs):
        where = os.path.join(dest, str(proc))
        os.makedirs(where)
        spec = _spec(names, "input", f"s3://test@minio/{BUCKET}/in/{{}}", f"file://{where}/{{}}")
        run_env = {**env, "PYTHONPATH": tree, "PEGASUS_CLOUDIO_CACHE_DIR": where + ".cache"}
        child = subprocess.Popen([sys.executable, "-m", "pegasus_cloudio.dropin"], stdin=subprocess.PIPE, env=run_env,
                                 cwd=tree, stderr=subprocess.DEVNULL)
        running.append((child, spec, where))
    for child, spec, _ in running:  # every spec in before any is waited for: all run at once
        assert child.stdin is not None
        child.stdin.write(spec)
        child.stdin.close()
    for child, _, _ in running:
        child.wait()
    return sum(1 for _, _, where in running for n in names
               if not _same(os.path.join(src, n), os.path.join(where, n)))


def _same(a: str, b: str) -> bool:
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            return fa.read() == fb.read()
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
