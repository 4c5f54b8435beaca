"""What a node-cache miss costs a job: a small-file stage-in, node cache on (empty: every file a
miss) and off, this tree against another checkout of the project, alternated in one run.

    python3 scripts/cache_miss_cost.py BASE_TREE [--count 2000] [--rounds 4]

Starts MinIO (the test bed's pinned build) on loopback, uploads ``--count`` files of 300 B
without bundles, then each round runs the drop-in (``python -m pegasus_cloudio.dropin``,
defaults, no bundles) for each tree (``BASE_TREE``, then this one), cache on then off, every
run into a new directory and, cache on, a new cache directory. Prints each run's wall time and
the job's CPU (user + system, from ``wait4``: a child the job forks to fill the cache after its
answer is not the job's), and the range and median of each. With the cache on, the next run
waits until the cache holds every file, so no run overlaps the last one's fill. Each tree is
imported from its own directory (``PYTHONPATH``, run from ``/tmp``: ``-m`` puts the working
directory first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Sequence, Tuple

from pegasus_cloudio_bench.harness import wait_filled
from pegasus_cloudio_bench.small_files import transfer_spec
from pegasus_cloudio_testbed.minio import MinioServer

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "s3://bench@minio/cachemiss"


def _run(tree: str, env: Dict[str, str], stdin: bytes) -> Tuple[float, float]:
    """(wall seconds, the job's CPU seconds) of one drop-in run of ``tree``."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "pegasus_cloudio.dropin"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(env, PYTHONPATH=tree),
                            cwd="/tmp")
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(stdin)
    proc.stdin.close()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"the drop-in of {tree} failed: {proc.stderr.read()[-2000:].decode(errors='replace')}")
    return wall, usage.ru_utime + usage.ru_stime


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="another checkout of the project (the A of the A/B)")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    trees = {"base": os.path.abspath(args.base), "this": HERE}
    root = tempfile.mkdtemp(prefix="cache-miss-")
    results: Dict[Tuple[str, str], List[Tuple[float, float]]] = {}
    try:
        with MinioServer() as s3:
            creds = s3.write_pegasus_credentials(os.path.join(root, "creds.conf"), site="minio", user="bench")
            env = {k: v for k, v in os.environ.items() if not k.startswith("PEGASUS_CLOUDIO")}
            env.update(PEGASUS_CREDENTIALS=str(creds), PEGASUS_CLOUDIO_CONFIG=os.devnull,
                       AWS_EC2_METADATA_DISABLED="true", PEGASUS_CLOUDIO_BUNDLE="0")
            names = [f"f{i:05d}" for i in range(args.count)]
            src = os.path.join(root, "src")
            os.makedirs(src)
            for name in names:
                with open(os.path.join(src, name), "wb") as fh:
                    fh.write(os.urandom(300))
            off = dict(env, PEGASUS_CLOUDIO_CACHE_DIR="off")
            _run(HERE, off, json.dumps([{"type": "mkdir", "target": {"site_label": "minio", "url": BUCKET}}]).encode())
            _run(HERE, off, transfer_spec([(f"file://{src}/{n}", f"{BUCKET}/{n}") for n in names], "local", "minio"))
            for round_ in range(args.rounds):
                for label, tree in trees.items():
                    for cache in ("on", "off"):
                        dest = tempfile.mkdtemp(dir=root)
                        directory = os.path.join(tempfile.mkdtemp(dir=root), "c") if cache == "on" else "off"
                        pairs = [(f"{BUCKET}/{n}", f"file://{dest}/{n}") for n in names]
                        wall, cpu = _run(tree, dict(env, PEGASUS_CLOUDIO_CACHE_DIR=directory),
                                         transfer_spec(pairs, "minio", "local"))
                        if cache == "on":
                            wait_filled(directory, args.count)
                        results.setdefault((label, cache), []).append((wall, cpu))
                        print(f"round {round_} {label:4s} cache {cache:3s} wall {wall:6.2f} s  job CPU {cpu:5.2f} s  "
                              f"load {os.getloadavg()[0]:.1f}", flush=True)
                        shutil.rmtree(dest)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for (label, cache), runs in sorted(results.items()):
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(f"{label:4s} cache {cache:3s} wall {min(walls):.2f}-{max(walls):.2f} s (median "
              f"{statistics.median(walls):.2f})  job CPU {min(cpus):.2f}-{max(cpus):.2f} s (median "
              f"{statistics.median(cpus):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
