"""One job's stage-in of many small objects, wheels of two source trees alternating on one MinIO.

    .venv/bin/python scripts/stagein_ab.py BEFORE_TREE [--count 6173] [--size 300] [--rounds 5]

``BEFORE_TREE`` is a source checkout (``git worktree add DIR main``); the other contestant is
this checkout. Each round stages the same ``--count`` objects of one prefix in with each
wheel's ``pegasus-cloudio-transfer`` (node cache off, nothing throttles), in alternating
order. The figures are the process's wall time and user+system CPU (``wait4``), medians over
the rounds, and this tree's over the other's: what pacing costs when the store never says
"slow down" (issue 37: within 5%).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout: the "this" contestant
sys.path.insert(0, HERE)

from pegasus_cloudio_bench.harness import tool_env  # noqa: E402
from pegasus_cloudio_bench.small_files import BUCKET, IDENTITY, SITE, transfer_spec  # noqa: E402
from pegasus_cloudio_testbed.minio import MinioServer  # noqa: E402
from pegasus_cloudio_testbed.wheel import installed_bin  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="source checkout to compare with this one")
    parser.add_argument("--count", type=int, default=6173)
    parser.add_argument("--size", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="stagein-ab-")
    trees = {"before": os.path.abspath(args.before), "this": HERE}
    with MinioServer() as server:
        creds = server.write_pegasus_credentials(os.path.join(root, "credentials.conf"), site=SITE, user="bench",
                                                 endpoint=server.endpoint)
        env = tool_env({"PEGASUS_CREDENTIALS": str(creds), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
                        "PEGASUS_CLOUDIO_CACHE_DIR": "off", "XDG_RUNTIME_DIR": root})
        env.pop("PYTHONPATH", None)
        bins = {name: installed_bin(os.path.join(root, f"wheel-{name}"), tree) for name, tree in trees.items()}

        def step(name: str, spec: object, cwd: str) -> Tuple[float, float]:
            start = time.monotonic()
            proc = subprocess.Popen([os.path.join(bins[name], "pegasus-cloudio-transfer")], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
            assert proc.stdin is not None and proc.stderr is not None
            proc.stdin.write(spec if isinstance(spec, bytes) else json.dumps(spec).encode())
            proc.stdin.close()
            err = proc.stderr.read()
            _, status, usage = os.wait4(proc.pid, 0)
            if status != 0:
                raise SystemExit(f"{name}: a step failed: {err.decode()[-2000:]}")
            return time.monotonic() - start, usage.ru_utime + usage.ru_stime

        src = os.path.join(root, "src")
        os.makedirs(src)
        names = [f"f{i:05d}.dat" for i in range(args.count)]
        for name in names:
            with open(os.path.join(src, name), "wb") as fh:
                fh.write(os.urandom(args.size))
        step("this", [{"type": "mkdir", "target": {"site_label": SITE, "url": f"s3://{IDENTITY}/{BUCKET}"}}], root)
        step("this", transfer_spec([(f"file://{src}/{n}", f"s3://{IDENTITY}/{BUCKET}/in/{n}") for n in names],
                                   "local", SITE), src)
        found: Dict[str, List[Tuple[float, float]]] = {name: [] for name in trees}
        for r in range(args.rounds):
            for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                job = os.path.join(root, f"{name}-{r}")
                os.makedirs(job)
                spec = transfer_spec([(f"s3://{IDENTITY}/{BUCKET}/in/{n}", f"file://{job}/{n}") for n in names],
                                     SITE, "local")
                found[name].append(step(name, spec, job))
                if len(os.listdir(job)) != args.count:
                    raise SystemExit(f"{name}: {len(os.listdir(job))} of {args.count} files")
    figures = {name: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
               for name, runs in found.items()}
    (wb, cb), (wt, ct) = figures["before"], figures["this"]
    print(f"{args.count} x {args.size} B stage-in, {args.rounds} rounds, load {os.getloadavg()[0]:.1f}")
    print(f"wall  before {wb:6.2f} s  this {wt:6.2f} s  ({wt / wb:.3f}x)")
    print(f"CPU   before {cb:6.2f} s  this {ct:6.2f} s  ({ct / cb:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
