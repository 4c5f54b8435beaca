"""The Azure CLI baseline: one ``az storage blob download`` (or ``upload``) process per file.

What a per-file staging script on Azure does (issue 35's baseline):
``python -m pegasus_cloudio_bench.naive_azcli --threads T --az PATH --config-dir DIR get|put
< items.json`` reads ``[[container, blob, path], ...]`` and runs, T at a time, ``az storage blob
download --container-name C --name B --file P`` (``upload ... --overwrite`` for ``put``), each
with the credentials the CLI takes from ``AZURE_STORAGE_CONNECTION_STRING`` and the environment
of :func:`pegasus_cloudio_testbed.azure_cli.az_env` with configuration directory ``DIR``
(telemetry off): a caller warms ``DIR`` with one untimed run first, as a user's own ``~/.azure``
is (the CLI builds its command index there on its first command). Exit status 1 if any file
failed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from pegasus_cloudio_bench import per_file

MODULE = "pegasus_cloudio_bench.naive_azcli"  # not __name__, which is "__main__" when run with -m


def az_argv(az: str, direction: str, container: str, blob: str, path: str) -> List[str]:
    """One file's ``az`` command."""
    verb = ["download"] if direction == "get" else ["upload", "--overwrite"]
    return [az, "storage", "blob", *verb, "--container-name", container, "--name", blob, "--file", path,
            "--no-progress", "--output", "none"]


def drive(az: str, config_dir: str, direction: str, threads: int, items: Sequence[Sequence[str]]) -> int:
    """One ``az`` process per item, ``threads`` at a time; 1 if any failed."""
    from pegasus_cloudio_testbed.azure_cli import az_env

    env = az_env(Path(config_dir), {"AZURE_STORAGE_CONNECTION_STRING": os.environ["AZURE_STORAGE_CONNECTION_STRING"]})

    def child(item: Sequence[str]) -> int:
        done = subprocess.run(az_argv(az, direction, *item), stdin=subprocess.DEVNULL, env=env,
                              capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{item[1]}: az exited {done.returncode}: {done.stderr.strip()[-300:]}", file=sys.stderr)
        return done.returncode

    return per_file.each(child, threads, items)


def main(argv: Optional[List[str]] = None) -> int:
    parser = per_file.parser(MODULE)
    parser.add_argument("--az", required=True, help="the az program")
    parser.add_argument("--config-dir", required=True, help="the CLI's configuration directory (AZURE_CONFIG_DIR)")
    per_file.add_direction(parser)
    args = parser.parse_args(argv)
    return drive(args.az, args.config_dir, args.direction, args.threads, per_file.items_on_stdin())


if __name__ == "__main__":
    sys.exit(main())
