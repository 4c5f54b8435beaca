"""The stock Pegasus worker tools (from the installed ``pegasus-wms.worker`` wheel)
as runnable commands, for comparison runs and compatibility tests.

The wheel ships ``Pegasus/cli/pegasus-transfer.py``, ``pegasus-s3.py`` and
``pegasus-integrity.py`` but no console scripts. `make_stock_home` writes small
shell shims for them into ``<home>/bin``; stock pegasus-transfer finds its
``pegasus-*`` helpers in ``$PEGASUS_HOME/bin`` (before PATH), so pointing
``PEGASUS_HOME`` at ``<home>`` makes it use these shims.

Timing note: stock pegasus-transfer sleeps ``2*k`` seconds before starting
worker thread ``k`` (k >= 1), so even a one-file run takes over 2 seconds.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Union

__all__ = ["STOCK_TOOLS", "StockPegasus", "make_stock_home", "stock_cli_dir"]

STOCK_TOOLS = ("pegasus-transfer", "pegasus-s3", "pegasus-integrity")

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class StockPegasus:
    """A directory usable as ``PEGASUS_HOME`` for the stock worker tools.

    Fields:
        home: the directory (set ``PEGASUS_HOME`` to it; see `env`).
        bin_dir: ``home/bin``, holding the executable shims.
        transfer: the ``pegasus-transfer`` shim.
        s3: the ``pegasus-s3`` shim.
        integrity: the ``pegasus-integrity`` shim.
    """

    home: Path
    bin_dir: Path
    transfer: Path
    s3: Path
    integrity: Path

    def env(self, base: Mapping[str, str]) -> Dict[str, str]:
        """A copy of ``base`` with ``PEGASUS_HOME`` set and ``bin_dir`` first on PATH."""
        env = dict(base)
        env["PEGASUS_HOME"] = str(self.home)
        path = env.get("PATH")
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{path}" if path else str(self.bin_dir)
        return env


def stock_cli_dir() -> Path:
    """``Pegasus/cli`` of the installed worker wheel (the package is not imported).

    Raises RuntimeError if ``pegasus-wms.worker`` is not installed.
    """
    spec = importlib.util.find_spec("Pegasus")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        cli = Path(location) / "cli"
        if (cli / "pegasus-transfer.py").is_file():
            return cli
    raise RuntimeError(
        "stock Pegasus tools not found: install the 'pegasus-wms.worker' wheel "
        "(it provides Pegasus/cli/pegasus-transfer.py)"
    )


def make_stock_home(directory: PathLike, *, python: Optional[str] = None) -> StockPegasus:
    """Create ``directory/bin`` with shims for `STOCK_TOOLS`; return the layout.

    Each shim is ``exec <python> <Pegasus/cli/NAME.py> "$@"``; ``python``
    defaults to the running interpreter (whose environment must provide
    boto3 for pegasus-s3). Existing shims are overwritten.
    """
    home = Path(directory).resolve()
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    cli = stock_cli_dir()
    interpreter = python or sys.executable
    for name in STOCK_TOOLS:
        _write_shim(bin_dir / name, interpreter, cli / f"{name}.py")
    return StockPegasus(
        home=home,
        bin_dir=bin_dir,
        transfer=bin_dir / "pegasus-transfer",
        s3=bin_dir / "pegasus-s3",
        integrity=bin_dir / "pegasus-integrity",
    )


def _write_shim(path: Path, interpreter: str, script: Path) -> None:
    text = (
        "#!/bin/sh\n"
        f"exec {shlex.quote(interpreter)} {shlex.quote(str(script))} \"$@\"\n"
    )
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(tmp, path)
