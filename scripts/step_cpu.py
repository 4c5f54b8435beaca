"""CPU of one job step, four kinds of step: wheels of two source trees, alternating, on one MinIO.

    .venv/bin/python scripts/step_cpu.py BEFORE_TREE [--rounds 11]

``BEFORE_TREE`` is a source checkout (``git archive be5c9bb | tar -x -C DIR``); the other
contestant is this checkout. Each round runs, with each wheel's ``pegasus-cloudio-transfer``:
an empty input; one 300 B object in with the node cache off; the same object in with bundles
and the cache on (a cache hit after the first round: a producer's header); and 20 files of
300 B out with bundles and the cache on (a producer's stage-out). The figure is the process's
user and system CPU (``wait4``), medians over the rounds. A development measurement beside
``pegasus-cloudio bench startup``, which compares with the stock tool.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout: the "this" contestant
sys.path.insert(0, HERE)

from pegasus_cloudio_bench.harness import tool_env  # noqa: E402
from pegasus_cloudio_bench.small_files import BUCKET, IDENTITY, SITE, transfer_spec  # noqa: E402
from pegasus_cloudio_testbed.minio import MinioServer  # noqa: E402
from pegasus_cloudio_testbed.wheel import installed_bin  # noqa: E402

STEPS = ("empty", "one object, cache off", "one object, bundles + cache", "20 out, bundles + cache")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="source checkout to compare with this one")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="step-cpu-")
    trees = {"before": os.path.abspath(args.before), "this": HERE}
    with MinioServer() as server:
        creds = server.write_pegasus_credentials(os.path.join(root, "credentials.conf"), site=SITE, user="bench",
                                                 endpoint=server.endpoint)
        env = tool_env({"PEGASUS_CREDENTIALS": str(creds), "PEGASUS_CLOUDIO_CONFIG": os.devnull})
        env.pop("PYTHONPATH", None)
        bins = {name: installed_bin(os.path.join(root, f"wheel-{name}"), tree) for name, tree in trees.items()}

        def cpu_ms(name: str, spec: object, extra: Dict[str, str], cwd: str) -> float:
            text = spec if isinstance(spec, bytes) else json.dumps(spec).encode()
            proc = subprocess.Popen([os.path.join(bins[name], "pegasus-cloudio-transfer")], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(env, **extra), cwd=cwd)
            assert proc.stdin is not None and proc.stderr is not None
            proc.stdin.write(text)
            proc.stdin.close()
            err = proc.stderr.read()
            _, status, usage = os.wait4(proc.pid, 0)
            if status != 0:
                raise SystemExit(f"{name}: a step failed: {err.decode()[-2000:]}")
            return (usage.ru_utime + usage.ru_stime) * 1000

        def url(name: str) -> str:
            return f"s3://{IDENTITY}/{BUCKET}/{name}"

        cpu_ms("this", [{"type": "mkdir", "target": {"site_label": SITE, "url": f"s3://{IDENTITY}/{BUCKET}"}}], {}, root)
        src = os.path.join(root, "src")
        os.makedirs(src)
        for i in range(20):
            with open(os.path.join(src, f"f{i:02d}"), "wb") as fh:
                fh.write(os.urandom(300))
        cpu_ms("this", transfer_spec([(f"file://{src}/f00", url("h.hdr"))], "local", SITE), {}, src)
        off = {"PEGASUS_CLOUDIO_CACHE_DIR": "off"}
        found: Dict[Tuple[str, str], List[float]] = {}
        for r in range(args.rounds):
            for name in trees:
                bundled = {"PEGASUS_CLOUDIO_BUNDLE": "1", "PEGASUS_CLOUDIO_CACHE_DIR": os.path.join(root, f"cache-{name}")}
                job = os.path.join(root, f"{name}-{r}")
                os.makedirs(job)
                figures = (
                    cpu_ms(name, [], off, job),
                    cpu_ms(name, transfer_spec([(url("h.hdr"), f"file://{job}/h")], SITE, "local"), off, job),
                    cpu_ms(name, transfer_spec([(url("h.hdr"), f"file://{job}/h2")], SITE, "local"), bundled, job),
                    cpu_ms(name, transfer_spec([(f"file://{src}/f{i:02d}", url(f"{name}{r}/f{i:02d}")) for i in range(20)],
                                               "local", SITE), bundled, src),
                )
                for step, figure in zip(STEPS, figures):
                    found.setdefault((name, step), []).append(figure)
    for step in STEPS:
        before, this = statistics.median(found[("before", step)]), statistics.median(found[("this", step)])
        print(f"{step:28s} before {before:6.1f} ms  this {this:6.1f} ms  ({this / before:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
