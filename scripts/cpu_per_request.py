"""Client CPU per small GET and PUT: wheels of two source trees, alternating, on one MinIO.

    .venv/bin/python scripts/cpu_per_request.py BEFORE_TREE [--count 2000] [--rounds 3]
        [--threads 5] [--root DIR]

``BEFORE_TREE`` is a source checkout (``git worktree add /tmp/before be5c9bb``, or ``git archive
be5c9bb | tar -x -C DIR``); the other contestant is this checkout. Each round stages out
``--count`` files of 300 B with each wheel's ``pegasus-cloudio-transfer``, then stages them back
in, node cache off; the figure is the process's user and system CPU divided by the files
(start-up included), medians over the rounds. ``--root`` holds the destinations (a tmpfs such as
``/dev/shm`` takes the file system's noise out of the system time). ``--cache`` turns the node
cache on (its default for users), a new empty cache directory for every run: GETs are misses
that fill it. A development measurement
beside ``pegasus-cloudio bench small-files``, which compares with s5cmd and the stock tool.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout: the "after" contestant
sys.path.insert(0, HERE)

from pegasus_cloudio_bench.harness import tool_env  # noqa: E402
from pegasus_cloudio_bench.small_files import BUCKET, IDENTITY, SITE, transfer_spec  # noqa: E402
from pegasus_cloudio_testbed.minio import MinioServer  # noqa: E402
from pegasus_cloudio_testbed.wheel import installed_bin  # noqa: E402


def _cpu_ms(argv: list, spec: bytes, env: dict, count: int, cwd: str) -> tuple:  # type: ignore[type-arg]
    """(user, system) ms per file of one run of ``argv`` reading ``spec`` on stdin."""
    with tempfile.TemporaryFile() as stdin:
        stdin.write(spec)
        stdin.seek(0)
        proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
        assert proc.stderr is not None
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"{argv[0]} failed: {err.decode(errors='replace')[-2000:]}")
    return usage.ru_utime / count * 1e3, usage.ru_stime / count * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=5)
    parser.add_argument("--root", default=None)
    parser.add_argument("--cache", action="store_true", help="node cache on, empty at every run")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="cpu-per-request-", dir=args.root)
    with MinioServer() as server:
        creds = server.write_pegasus_credentials(os.path.join(root, "credentials.conf"), site=SITE, user="bench",
                                                 endpoint=server.endpoint)
        env = tool_env({"PEGASUS_CREDENTIALS": str(creds), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
                        "PEGASUS_CLOUDIO_CACHE_DIR": "off"})
        env.pop("PYTHONPATH", None)
        bins = {"before": installed_bin(os.path.join(root, "wheel-before"), args.before),
                "after": installed_bin(os.path.join(root, "wheel-after"), HERE)}
        tool = {k: [os.path.join(b, "pegasus-cloudio-transfer"), "--threads", str(args.threads)] for k, b in bins.items()}
        mkdir = json.dumps([{"type": "mkdir", "target": {"site_label": SITE, "url": f"s3://{IDENTITY}/{BUCKET}"}}])
        _cpu_ms(tool["after"], mkdir.encode(), env, 1, root)
        src = os.path.join(root, "src")
        os.makedirs(src)
        names = [f"f{i:05d}" for i in range(args.count)]
        for name in names:
            with open(os.path.join(src, name), "wb") as fh:
                fh.write(os.urandom(300))
        found: dict = {}  # type: ignore[type-arg]
        for _ in range(args.rounds):
            for key in bins:
                urls = [f"s3://{IDENTITY}/{BUCKET}/{key}/{name}" for name in names]
                put = transfer_spec([(f"file://{src}/{n}", u) for n, u in zip(names, urls)], "local", SITE)
                found.setdefault((key, "PUT"), []).append(_cpu_ms(tool[key], put, env, args.count, root))
                dest = tempfile.mkdtemp(dir=root)
                get = transfer_spec([(u, f"file://{dest}/{n}") for n, u in zip(names, urls)], SITE, "local")
                cached = dict(env, PEGASUS_CLOUDIO_CACHE_DIR=os.path.join(dest, ".cache")) if args.cache else env
                found.setdefault((key, "GET"), []).append(_cpu_ms(tool[key], get, cached, args.count, dest))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    for (key, op), runs in sorted(found.items()):
        user = statistics.median(u for u, _ in runs)
        system = statistics.median(s for _, s in runs)
        total = statistics.median(u + s for u, s in runs)
        print(f"{key:6} {op}: user {user:.3f} + system {system:.3f} = {total:.3f} ms per file "
              f"(median of {len(runs)}, {args.threads} threads)")


if __name__ == "__main__":
    main()
