"""A timed disk benchmark in the style of seed 004: fixed block and transfer size, sampled.

Every ``--interval`` seconds, ``--samples`` times, one file of ``--transfer-mib`` MiB is
written in ``--block-kib`` KiB blocks and flushed to the device (``fsync``), then read back;
each sample's write and read rates are recorded with its time, so variability (burst credits
running out, neighbours) shows as a series. The read comes from the page cache unless the
file is larger than memory; it is reported but the write rate is the figure of merit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from pegasus_cloudio_bench.harness import Progress


@dataclass(frozen=True)
class Params:
    transfer_mib: int = 256
    block_kib: int = 2048
    samples: int = 10
    interval_s: float = 5.0
    directory: Optional[str] = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transfer-mib", type=int, default=256, help="MiB written per sample (default 256)")
    parser.add_argument("--block-kib", type=int, default=2048, help="write block size in KiB (default 2048, seed 004 transfer size 2M)")
    parser.add_argument("--samples", type=int, default=10, help="samples (default 10)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between sample starts (default 5)")
    parser.add_argument("--dir", help="directory on the disk to test (default: the temp dir)")


def run_from_args(args: argparse.Namespace) -> Dict[str, object]:
    return run(Params(args.transfer_mib, args.block_kib, args.samples, args.interval, args.dir), Progress())


def _sample(path: str, params: Params) -> Dict[str, float]:
    block = os.urandom(params.block_kib * 1024)
    count = params.transfer_mib * 1024 // params.block_kib
    started = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(count):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    wrote = time.monotonic() - started
    started = time.monotonic()
    with open(path, "rb", buffering=0) as fh:
        while fh.read(len(block)):
            pass
    read = time.monotonic() - started
    size = count * len(block)
    return {"write_mb_per_s": round(size / wrote / 1e6, 1), "read_mb_per_s": round(size / read / 1e6, 1)}


def run(params: Params, progress: Progress) -> Dict[str, object]:
    samples: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pegasus-cloudio-disk-", dir=params.directory) as folder:
        path = os.path.join(folder, "sample.dat")
        began = time.monotonic()
        for i in range(params.samples):
            progress.phase(f"disk sample {i + 1}/{params.samples}")
            at = time.monotonic() - began
            samples.append({"t_s": round(at, 2), **_sample(path, params)})
            os.unlink(path)
            pause = params.interval_s * (i + 1) - (time.monotonic() - began)
            if pause > 0 and i + 1 < params.samples:
                time.sleep(pause)
    progress.done()
    writes = [s["write_mb_per_s"] for s in samples]
    return {"benchmark": "disk", "params": params.__dict__, "samples": samples,
            "write_mb_per_s": {"min": min(writes), "median": statistics.median(writes), "max": max(writes)},
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def format_table(result: Dict[str, Any]) -> str:
    rows = [f"{'t s':>7} {'write MB/s':>11} {'read MB/s':>10}"]
    rows += [f"{s['t_s']:>7.1f} {s['write_mb_per_s']:>11.1f} {s['read_mb_per_s']:>10.1f}" for s in result["samples"]]
    w = result["write_mb_per_s"]
    rows.append(f"write MB/s: min {w['min']}, median {w['median']}, max {w['max']}; load {result['load_average']}")
    return "\n".join(rows)
