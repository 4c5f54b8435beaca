"""``pegasus-cloudio``: the umbrella command.

``bench <scenario>``: benchmarks against the stock tools in the same run (``--json`` for
machine-readable output); ``sites``, ``cache``, ``worker-bundle``: commands.

The tables below name each subcommand's module and one-line help, so ``pegasus-cloudio
--help`` imports nothing and a run imports only the chosen module: ``sites`` and ``cache``
work with the core and their extra. The bench scenarios are modules of ``pegasus_cloudio_bench``, a
distribution of its own (``bench/``, with the test bed), loaded only when a benchmark runs.
Each bench module provides ``add_arguments(parser)``, ``run_from_args(args) -> dict`` and
``format_table(result) -> str`` and may provide ``usage_problems(args) -> list`` (one
message per bad flag: exit 2 before anything runs); each command module
``add_arguments(parser)`` and ``main(args) -> int``. A module whose third-party import is missing gives one line naming
the extra to install, or how to install the benchmarks (exit 2).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from types import ModuleType
from typing import Dict, List, Optional, Sequence, Tuple

from pegasus_cloudio.version import plain, version_line

PROG = "pegasus-cloudio"

# name -> (module, one-line help)
BENCHES: Dict[str, Tuple[str, str]] = {
    "small-files": ("pegasus_cloudio_bench.small_files",
                    "many small files staged out and in, against the stock tools (Python and Go)"),
    "mconcatfit": ("pegasus_cloudio_bench.mconcatfit",
                   "Montage mConcatFit staging: many producers' small files, one consumer"),
    "cache": ("pegasus_cloudio_bench.cache",
              "node cache: input reuse by many jobs on one node, with and without the cache"),
    "condor-plugin": ("pegasus_cloudio_bench.condor_plugin",
                      "one HTCondor plugin process per job vs one per file"),
    "p2p": ("pegasus_cloudio_bench.p2p",
            "peer-to-peer sharing: store requests per file, index lookups/s, peer vs store fetch"),
    "workflow": ("pegasus_cloudio_bench.workflow",
                 "workflow makespan: the Montage-shaped DAG staged four ways, against VM-local storage"),
    "sizes": ("pegasus_cloudio_bench.sizes", "time vs file size per tool and round-trip time"),
    "large": ("pegasus_cloudio_bench.large", "one large object down and up against the run's limit"),
    "disk": ("pegasus_cloudio_bench.disk", "a timed disk benchmark: fixed block and transfer size, sampled"),
    "threads": ("pegasus_cloudio_bench.threads", "small-file stage-in rate against 1 to 32 threads"),
    "library": ("pegasus_cloudio_bench.library",
                "the plain library and fsspec against boto3, s3fs and obstore: many small files up and down"),
    "pool": ("pegasus_cloudio_bench.pool",
             "a workflow planned by pegasus-plan and run by DAGMan on a real HTCondor pool, stock vs ours"),
    "startup": ("pegasus_cloudio_bench.startup",
                "CPU of one job step (empty, a few small objects) against the stock tool's start"),
    "throttle": ("pegasus_cloudio_bench.throttle",
                 "N jobs at once on one prefix of a store that throttles (--model: to 10,000 jobs)"),
    "report": ("pegasus_cloudio_bench.report", "every scenario as one report with plots (--out DIR [--quick])"),
}
COMMANDS: Dict[str, Tuple[str, str]] = {
    "sites": ("pegasus_cloudio.sites.cli", "write a ready Pegasus catalog set for one staging mode"),
    "cache": ("pegasus_cloudio.cache.cli", "inspect and maintain the node cache"),
    "worker-bundle": ("pegasus_cloudio.worker_bundle",
                      "write the drop-in as one executable file for workers (no pip install)"),
    "serve": ("pegasus_cloudio.p2p.serve", "serve this node's cache to peers (the P2P cache daemon)"),
    "cache-summary": ("pegasus_cloudio.p2p.summary",
                      "print what this node's caches hold as a ClassAd (HTCondor startd cron)"),
    "stager": ("pegasus_cloudio.stager.cli",
               "run jobs' pegasus-transfer in one long-lived process per node (no start-up per job)"),
    "cost": ("pegasus_cloudio.cost.cli", "request cost of a workflow's staging, per site and job type"),
    "monitor": ("pegasus_cloudio.monitor.cli", "probe a store's latency on a schedule into a bounded time series"),
}

# top-level module of a third-party import -> the extra that installs it
EXTRAS: Dict[str, str] = {
    "Pegasus": "sites", "botocore": "aws", "google": "gcs", "google_crc32c": "gcs", "paramiko": "sftp",
    "htcondor": "condor", "classad2": "condor", "redis": "p2p",
}
# The benchmarks and the test bed are a distribution of their own (bench/ of the checkout), so the
# wheel a worker installs carries only runtime code; it brings its own third-party packages.
BENCH_INSTALL = "pip install ./bench (pegasus-cloudio-bench, from a pegasus-cloudio checkout)"


class MissingExtra(Exception):
    """A subcommand's module needs a package this installation lacks; the message names the extra."""


def load(module_name: str, command: str) -> ModuleType:
    """Import one subcommand's module; MissingExtra when a third-party package is missing."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        if top in ("", "pegasus_cloudio", "transfer"):
            raise
        if module_name.startswith("pegasus_cloudio_bench."):
            raise MissingExtra(f"{PROG} {command} needs the benchmarks, which are not installed: "
                               f"{BENCH_INSTALL}") from None
        extra = EXTRAS.get(top, "all")
        raise MissingExtra(f"{PROG} {command} needs the Python package {top!r}, which is not installed: "
                           f"pip install 'pegasus-cloudio[{extra}]'") from None


def _chosen(argv: Sequence[str]) -> List[str]:
    """The first two words that are not options: the command (and scenario) being run."""
    return [word for word in argv if not word.startswith("-")][:2]


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser; only the module of the subcommand named in ``argv`` is imported."""
    chosen = _chosen(argv)
    parser = argparse.ArgumentParser(prog=PROG, description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--version", action="version", version=version_line(PROG))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = commands.add_parser("bench", help="benchmarks against the stock tools in the same run")
    scenarios = bench.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    for name, (module_name, text) in BENCHES.items():
        sub = scenarios.add_parser(name, help=text, description=text)
        if chosen == ["bench", name]:
            load(module_name, f"bench {name}").add_arguments(sub)
            sub.add_argument("--json", action="store_true", help="print machine-readable JSON")
            sub.set_defaults(module_name=module_name, kind="bench", subparser=sub)
    for name, (module_name, text) in COMMANDS.items():
        sub = commands.add_parser(name, help=text, description=text)
        if chosen[:1] == [name]:
            load(module_name, name).add_arguments(sub)
            sub.set_defaults(module_name=module_name, kind="command", subparser=sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(argv)
    except MissingExtra as err:
        sys.stderr.write(f"{err}\n")
        return 2
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's own usage, not the top level's list of commands
        getattr(args, "subparser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    module = sys.modules[args.module_name]
    problems = module.usage_problems(args) if hasattr(module, "usage_problems") else []
    where = " ".join(filter(None, (PROG, args.command, getattr(args, "scenario", None))))
    for problem in problems:
        sys.stderr.write(f"{where}: {problem}\n")
    if problems:
        return 2
    if args.kind == "command":
        return int(module.main(args))
    result = module.run_from_args(args)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(module.format_table(result))
    return 0


def console_main() -> None:
    sys.exit(main())


if __name__ == "__main__":
    console_main()
