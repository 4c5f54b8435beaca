"""``pegasus-cloudio``: the umbrella command.

``bench <scenario>``: benchmarks against the stock tools in the same run (``--json`` for
machine-readable output). Other subcommands (``sites``, ``cache``) come from their modules.
Each bench module provides ``add_arguments(parser)``, ``run_from_args(args) -> dict`` and
``format_table(result) -> str``; each command module ``add_arguments(parser)`` and
``main(args) -> int``. Modules are imported only to build the parser.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from types import ModuleType
from typing import Dict, Optional, Sequence

BENCHES: Dict[str, str] = {
    "small-files": "pegasus_cloudio.bench.small_files",
    "mconcatfit": "pegasus_cloudio.bench.mconcatfit",
    "cache": "pegasus_cloudio.bench.cache",
    "condor-plugin": "pegasus_cloudio.bench.condor_plugin",
    "workflow": "pegasus_cloudio.bench.workflow",
    "sizes": "pegasus_cloudio.bench.sizes",
    "large": "pegasus_cloudio.bench.large",
    "disk": "pegasus_cloudio.bench.disk",
}
COMMANDS: Dict[str, str] = {
    "sites": "pegasus_cloudio.sites.cli",
    "cache": "pegasus_cloudio.cache.cli",
    "cost": "pegasus_cloudio.cost.cli",
}


def _load(name: str) -> Optional[ModuleType]:
    """The module, or None when it does not exist (yet) in this installation."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and name.startswith(err.name):
            return None
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pegasus-cloudio", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("bench", help="benchmarks against the stock tools")
    scenarios = bench.add_subparsers(dest="scenario", required=True)
    for name, module_name in BENCHES.items():
        module = _load(module_name)
        if module is not None:
            sub = scenarios.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
            module.add_arguments(sub)
            sub.add_argument("--json", action="store_true", help="print machine-readable JSON")
            sub.set_defaults(module=module, kind="bench")
    for name, module_name in COMMANDS.items():
        module = _load(module_name)
        if module is not None:
            sub = commands.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
            module.add_arguments(sub)
            sub.set_defaults(module=module, kind="command")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.kind == "command":
        return int(args.module.main(args))
    result = args.module.run_from_args(args)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(args.module.format_table(result))
    return 0


def console_main() -> None:
    sys.exit(main())


if __name__ == "__main__":
    console_main()
