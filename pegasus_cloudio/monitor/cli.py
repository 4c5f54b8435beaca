"""Probe a store's latency on a schedule and keep a bounded time series (seed 002, Fig. 11).

``pegasus-cloudio monitor URL --file SERIES [--every S --rounds N] [--max-bytes B]``: each round
PUTs and GETs an empty object and a 1 KB object under ``URL`` (a directory URL such as
``s3://user@site/bucket/monitor``), each on a fresh connection as a new job would, and appends
the latencies to ``SERIES``. One round by default, for a cron job or systemd timer; ``--every``
repeats in-process. Exit 1 when any probe failed (its error is recorded in the series too).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Mapping, Optional

from pegasus_cloudio.monitor.series import DEFAULT_MAX_BYTES, append

SMALL = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="directory URL the probe objects go under")
    parser.add_argument("--file", required=True, help="time-series file (JSON lines) to append to")
    parser.add_argument("--every", type=float, default=0.0, help="seconds between rounds (default: one round)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds when --every is given (default 1)")
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="size bound of the file")


def probe_round(url: str, env: Optional[Mapping[str, str]] = None) -> List[Dict[str, Any]]:
    """One round of probes; never raises (a failure is a point with ``ok`` false)."""
    from transfer import Session, parse_url  # lazily: the CLI table imports this module
    from transfer.backends.base import uploads

    points: List[Dict[str, Any]] = []
    base = url.rstrip("/")
    with tempfile.TemporaryDirectory(prefix="pegasus-cloudio-monitor-") as tmp:
        for label, size in (("empty", 0), ("small", SMALL)):
            path = os.path.join(tmp, label)
            with open(path, "wb") as fh:
                fh.write(b"m" * size)
            target = parse_url(f"{base}/probe-{label}", env=env)
            for op in ("put", "get"):
                started, error = time.time(), None
                clock = time.monotonic()
                try:
                    with Session(env=dict(env) if env is not None else None) as session:
                        backend = session.backend(target)
                        if op == "put":
                            uploads(backend, target, "put").put(path, target)
                        else:
                            with open(os.path.join(tmp, "got"), "wb") as sink:
                                backend.get(target, sink)
                except Exception as err:  # noqa: BLE001 - recorded, the series goes on
                    error = f"{type(err).__name__}: {err}"
                points.append({"t": round(started, 3), "probe": f"{op} {label}", "ok": error is None,
                               "seconds": round(time.monotonic() - clock, 6), "error": error})
    return points


def main(args: argparse.Namespace) -> int:
    failed = False
    rounds = max(1, args.rounds) if args.every > 0 else 1
    for i in range(rounds):
        began = time.monotonic()
        points = probe_round(args.url)
        append(args.file, points, args.max_bytes)
        for p in points:
            if not p["ok"]:
                failed = True
                print(f"pegasus-cloudio monitor: {p['probe']} {args.url}: {p['error']}", file=sys.stderr)
        if i + 1 < rounds:
            time.sleep(max(0.0, args.every - (time.monotonic() - began)))
    return 1 if failed else 0
