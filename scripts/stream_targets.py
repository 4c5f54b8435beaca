"""Issue 33's stream targets on one MinIO: ``open(..., "rb")`` against ``read_bytes`` and
``open(..., "wb")`` against ``copy``'s upload, each a fresh child process, taking turns.

    .venv/bin/python scripts/stream_targets.py [--mib 1024] [--rounds 2] [--root DIR]

Every child reports its wall time, peak resident memory (``VmHWM`` of itself, the
interpreter included: see :func:`_peak_rss`) and the largest file seen in its private ``TMPDIR`` (polled every
10 ms: a part spooled through a temp file shows there). ``rb`` reads in 1 MiB ``read`` calls;
``wb`` writes one 1 MiB buffer repeatedly (so the writer's own memory stays flat). Figures are
medians over the rounds (``baseline``: the interpreter, imports and one HEAD, for the memory
every mode pays before it moves a byte); the targets: ``rb`` >= 0.9x ``read_bytes`` throughput with peak
memory < 64 MiB, ``wb`` >= 0.9x ``copy`` upload throughput with peak memory < 128 MiB and no
temp file. ``--root`` holds the 1 GiB source file (a tmpfs such as ``/dev/shm`` keeps the disk
out of ``copy``'s figure).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

CHUNK = 8 << 20
READ = 1 << 20  # a sequential reader's (or writer's) call size (shutil.copyfileobj: 64 KiB to 1 MiB)
BUCKET = "streams"
MODES = ("read_bytes", "open_rb", "copy_up", "open_wb", "baseline")


def _largest_temp(directory: str, seen: List[int], stop: threading.Event) -> None:
    """Keep ``seen[0]`` the largest size of any file in ``directory`` until ``stop``."""
    while not stop.wait(0.01):
        for entry in os.scandir(directory):
            try:
                seen[0] = max(seen[0], entry.stat().st_size)
            except FileNotFoundError:
                pass


def _run_mode(mode: str, endpoint: str, key: str, secret: str, source: str, mib: int) -> int:
    """Do ``mode`` once; returns the bytes moved."""
    import fsspec

    from transfer.client import Client

    url = f"s3://{BUCKET}/object"
    with Client(endpoint_url=endpoint, key=key, secret=secret) as client:
        if mode == "baseline":  # the interpreter, the imports and one small read: what every mode pays
            client.info(url)
            fsspec.filesystem("cloudio", endpoint_url=endpoint, key=key, secret=secret, skip_instance_cache=True)
            return mib << 20
        if mode == "read_bytes":
            return len(client.read_bytes(url))
        if mode == "copy_up":
            client.copy([(source, f"s3://{BUCKET}/copied")])
            return os.path.getsize(source)
    fs = fsspec.filesystem("cloudio", endpoint_url=endpoint, key=key, secret=secret, skip_instance_cache=True)
    moved = 0
    if mode == "open_rb":
        with fs.open(f"{BUCKET}/object", "rb", **json.loads(os.environ.get("STREAM_RB_OPTIONS", "{}"))) as fh:
            while True:
                block = fh.read(READ)
                if not block:
                    return moved
                moved += len(block)
    block = os.urandom(READ)
    with fs.open(f"{BUCKET}/written", "wb") as fh:
        for _ in range(mib * (1 << 20) // READ):
            moved += fh.write(block)
    return moved


def child(mode: str, endpoint: str, key: str, secret: str, source: str, mib: int) -> None:
    """One measured run, its figures as one JSON line on stdout."""
    seen = [0]
    stop = threading.Event()
    watcher = threading.Thread(target=_largest_temp, args=(tempfile.gettempdir(), seen, stop), daemon=True)
    watcher.start()
    started = time.monotonic()
    moved = _run_mode(mode, endpoint, key, secret, source, mib)
    wall = time.monotonic() - started
    stop.set()
    watcher.join()
    print(json.dumps({"mode": mode, "bytes": moved, "wall_s": wall, "mb_s": moved / wall / 1e6,
                      "peak_rss_mib": _peak_rss() / (1 << 20), "largest_temp_file": seen[0]}))


def _peak_rss() -> int:
    """This process's peak resident bytes: ``VmHWM``, which starts again at ``exec``;
    ``getrusage``'s ``ru_maxrss`` keeps the parent's peak at the fork (Linux keeps it across
    ``exec``), so a child started by a large parent would report the parent's size."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # no /proc: the best there is


def _one(mode: str, server: object, source: str, mib: int, root: str) -> Dict[str, float]:
    tmp = tempfile.mkdtemp(prefix=f"tmp-{mode}-", dir=root)
    env = dict(os.environ, TMPDIR=tmp, AWS_EC2_METADATA_DISABLED="true", PEGASUS_CLOUDIO_CACHE_DIR="off")
    argv = [sys.executable, __file__, "--child", mode, server.endpoint, server.access_key,  # type: ignore[attr-defined]
            server.secret_key, source, str(mib)]  # type: ignore[attr-defined]
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, check=True)
    shutil.rmtree(tmp, ignore_errors=True)
    result: Dict[str, float] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    if result["bytes"] != mib << 20:  # baseline reports the size it did not move
        raise SystemExit(f"{mode} moved {result['bytes']} bytes, not {mib << 20}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--root", default=None)
    parser.add_argument("--modes", default=",".join(MODES), help=f"a subset of {','.join(MODES)}")
    parser.add_argument("--child", nargs=6, metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, endpoint, key, secret, source, mib = args.child
        child(mode, endpoint, key, secret, source, int(mib))
        return
    from pegasus_cloudio_testbed.minio import MinioServer
    from transfer.client import Client

    root = tempfile.mkdtemp(prefix="stream-targets-", dir=args.root)
    try:
        source = os.path.join(root, "source")
        with open(source, "wb") as fh:
            for _ in range(args.mib * (1 << 20) // CHUNK):
                fh.write(os.urandom(CHUNK))
        with MinioServer() as server:
            with Client(endpoint_url=server.endpoint, key=server.access_key, secret=server.secret_key) as client:
                client.mkdir(f"s3://{BUCKET}")
                client.copy([(source, f"s3://{BUCKET}/object")])
            modes = tuple(m for m in args.modes.split(",") if m in MODES)
            runs: Dict[str, List[Dict[str, float]]] = {m: [] for m in modes}
            for number in range(args.rounds):
                for mode in modes[number % 2 * 2:] + modes[:number % 2 * 2]:
                    runs[mode].append(_one(mode, server, source, args.mib, root))
                    print(json.dumps(runs[mode][-1]), file=sys.stderr, flush=True)
        med = {m: {k: statistics.median(r[k] for r in rows) for k in ("mb_s", "peak_rss_mib", "largest_temp_file")}
               for m, rows in runs.items()}
        ratios = {f"{a}/{b}": med[a]["mb_s"] / med[b]["mb_s"] for a, b in (("open_rb", "read_bytes"), ("open_wb", "copy_up"))
                  if a in med and b in med}
        print(json.dumps({"mib": args.mib, "rounds": args.rounds, "load": os.getloadavg(), "median": med,
                          "throughput_ratios": ratios}, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
