"""Python calls per function of one stage-in, wheels of two source trees, on one MinIO.

    .venv/bin/python scripts/calls_ab.py BEFORE_TREE [--count 1000] [--size 300] [--top 25]

``BEFORE_TREE`` is a source checkout; the other contestant is this checkout. Each wheel's
drop-in stages ``--count`` objects in, with the node cache off and then on (empty), with a
profile hook on every thread (:func:`threading.setprofile`) that counts each Python function's
calls; prints the calls per file of each and the functions whose counts differ most. Calls are
counted, not timed: load does not move them. Beside ``scripts/ab_stage.py --instructions``,
which says how much a difference costs, this says where it is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout: the "this" contestant
sys.path.insert(0, HERE)

from pegasus_cloudio_bench.harness import ab_wheels, make_inputs  # noqa: E402
from pegasus_cloudio_bench.small_files import BUCKET, IDENTITY, SITE, transfer_spec  # noqa: E402
from pegasus_cloudio_testbed.minio import MinioServer  # noqa: E402

# Run by the wheel's own Python: count every thread's calls per function, write them at exit.
COUNTER = """
import atexit, json, os, runpy, sys, threading
counts = {}
def hook(frame, event, arg):
    if event == "call":
        code = frame.f_code
        key = (code.co_filename.rsplit("site-packages/", 1)[-1], code.co_name)
        counts[key] = counts.get(key, 0) + 1
def dump():
    sys.setprofile(None)
    threading.setprofile(None)
    with open(os.environ["CALLS_OUT"], "w") as fh:
        json.dump([[f, n, c] for (f, n), c in counts.items()], fh)
atexit.register(dump)
script, sys.argv = sys.argv[1], sys.argv[1:]
threading.setprofile(hook)
sys.setprofile(hook)
runpy.run_path(script, run_name="__main__")
"""


def _counted(bin_dir: str, spec: bytes, env: Dict[str, str], cwd: str, out: str) -> Dict[Tuple[str, str], int]:
    """Calls per (file, function) of one drop-in run of ``spec``; exits naming the run when it fails."""
    counter = os.path.join(os.path.dirname(out), "counter.py")
    with open(counter, "w") as fh:
        fh.write(COUNTER)
    done = subprocess.run([os.path.join(bin_dir, "python"), counter, os.path.join(bin_dir, "pegasus-cloudio-transfer-py"),
                           "--threads", "5"], input=spec, env=dict(env, CALLS_OUT=out), cwd=cwd, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"{bin_dir}: a run failed: {done.stderr.decode()[-2000:]}")
    with open(out) as fh:
        return {(f, n): c for f, n, c in json.load(fh)}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="source checkout to compare with this one")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--size", type=int, default=300)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="calls-ab-")
    trees = {"before": os.path.abspath(args.before), "this": HERE}
    try:
        with MinioServer() as server:
            env, bins = ab_wheels(server, root, trees, SITE)
            src, names = make_inputs(root, args.count, args.size)
            remote = f"s3://{IDENTITY}/{BUCKET}/in"
            mkdir = json.dumps([{"type": "mkdir", "target": {"site_label": SITE, "url": f"s3://{IDENTITY}/{BUCKET}"}}])
            for spec in (mkdir.encode(), transfer_spec([(f"file://{src}/{n}", f"{remote}/{n}") for n in names], "local", SITE)):
                subprocess.run([os.path.join(bins["this"], "pegasus-cloudio-transfer")], input=spec, check=True,
                               env=dict(env, PEGASUS_CLOUDIO_CACHE_DIR="off"), cwd=src, capture_output=True)
            for cache in ("off", "on"):
                counted = {}
                for name, bin_dir in bins.items():
                    job = os.path.join(root, f"{name}-{cache}")
                    spec = transfer_spec([(f"{remote}/{n}", f"file://{job}/{n}") for n in names], SITE, "local")
                    cache_dir = "off" if cache == "off" else os.path.join(root, f"cache-{name}")
                    counted[name] = _counted(bin_dir, spec, dict(env, PEGASUS_CLOUDIO_CACHE_DIR=cache_dir), src,
                                             os.path.join(root, f"calls-{name}-{cache}.json"))
                before, this = counted["before"], counted["this"]
                print(f"cache {cache}: calls per file: before {sum(before.values()) / args.count:.1f}, "
                      f"this {sum(this.values()) / args.count:.1f}")
                moved = sorted(((this.get(k, 0) - before.get(k, 0), k) for k in set(before) | set(this)),
                               key=lambda item: -abs(item[0]))
                for difference, (path, function) in moved[:args.top]:
                    print(f"  {difference / args.count:+7.2f} a file  {path}:{function}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
