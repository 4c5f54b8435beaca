"""``pegasus-cloudio``: the umbrella command (``bench ...``; later ``sites``, ``cache``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pegasus-cloudio", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("bench", help="benchmarks against the stock tools")
    scenarios = bench.add_subparsers(dest="scenario", required=True)
    small = scenarios.add_parser("small-files", help="N small files out to and back from S3 (MinIO)")
    small.add_argument("--count", type=_positive, default=6173, help="number of files (default 6173)")
    small.add_argument("--size", type=_positive, default=300, help="bytes per file (default 300)")
    small.add_argument("--threads", type=_positive, default=5, help="transfer threads (default 5)")
    small.add_argument("--stock-sample", type=_positive, default=200,
                       help="files the stock pegasus-transfer moves before extrapolating (default 200)")
    small.add_argument("--rtt-ms", type=float, default=0.0, help="emulated round trip added by the proxy")
    small.add_argument("--no-s5cmd", action="store_true", help="skip the s5cmd comparison")
    small.add_argument("--json", action="store_true", help="print machine-readable JSON")
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from pegasus_cloudio.bench import small_files
    from pegasus_cloudio.bench.harness import Progress

    params = small_files.Params(count=args.count, size=args.size, threads=args.threads,
                                stock_sample=args.stock_sample, s5cmd=not args.no_s5cmd, rtt_ms=args.rtt_ms)
    result = small_files.run(params, Progress())
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(small_files.format_table(result))
    return 0


def console_main() -> None:
    sys.exit(main())
