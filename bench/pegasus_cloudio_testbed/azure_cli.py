"""The Azure CLI (``az``), pinned, in a venv of its own under the tools dir: the baseline of
issue 35's small-files target (one ``az storage blob download`` per file).

``pins/azure-cli/constraints.txt`` is ``pip freeze`` of an install of ``azure-cli==2.91.0``
(150 distributions), checked by sha256 before use; ``pip install -c`` of it installs that
tree or fails. A venv cannot be moved once made (its scripts name their interpreter), so it is
made in place, ``<tools_dir>/azure-cli-venv``, under the per-tool lock, and the stamp
(``stamps/azure-cli.json``) is written last: a half-made venv has no stamp and is made again.
About 2 minutes and 730 MB.

:func:`az_env` is the environment every run of ``az`` here gets: its own configuration
directory, telemetry off (the CLI would otherwise send it off the machine at exit), no colour,
errors only.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Mapping, Optional

from .tool_builds import Progress, build_lock, checked, stderr_progress, tools_dir, write_atomic

__all__ = ["PIN", "az_env", "ensure_azure_cli"]

PIN = "azure-cli==2.91.0"
NAME = "azure-cli"
CONSTRAINTS = Path(__file__).resolve().parent / "pins" / NAME / "constraints.txt"
CONSTRAINTS_SHA256 = "7a3aabadbc932e84788e3a532976c3623c1bef23b2e1478fc55d2805cbf208ec"


def _stamp_text() -> str:
    return json.dumps({"pin": PIN, "constraints_sha256": CONSTRAINTS_SHA256, "python": sys.version_info[:2]},
                      sort_keys=True) + "\n"


def ensure_azure_cli(*, directory: Optional[Path] = None, progress: Progress = stderr_progress) -> Path:
    """The pinned ``az`` program, installed first (a venv and ``pip install``) when missing or
    installed from another pin. RuntimeError naming the log when the install fails."""
    root = directory if directory is not None else tools_dir()
    venv = root / f"{NAME}-venv"
    program, stamp = venv / "bin" / "az", root / "stamps" / f"{NAME}.json"
    if _is_current(program, stamp):
        return program
    with build_lock(root, NAME, progress):
        if not _is_current(program, stamp):
            _install(root, venv, program, progress)
            write_atomic(stamp, _stamp_text())
    return program


def _is_current(program: Path, stamp: Path) -> bool:
    try:
        return program.is_file() and stamp.read_text() == _stamp_text()
    except OSError:
        return False


def _install(root: Path, venv: Path, program: Path, progress: Progress) -> None:
    constraints = checked(CONSTRAINTS, CONSTRAINTS_SHA256)
    (root / "logs").mkdir(parents=True, exist_ok=True)
    log_path = root / "logs" / f"{NAME}-build.log"
    progress(f"installing {PIN} into {venv} (about 2 minutes); log: {log_path}")
    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "-c", str(constraints), PIN]]
    with open(log_path, "w") as log:
        for cmd in steps:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                break
    if not program.is_file() or subprocess.run([str(program), "version"], env=az_env(root / "logs" / "az-config"),
                                               capture_output=True).returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
        raise RuntimeError(f"install of {PIN} failed; last lines of {log_path}:\n{tail}")
    progress(f"installed {PIN} in {time.monotonic() - started:.0f} s")


def az_env(config_dir: Path, extra: Mapping[str, str] = {}) -> Dict[str, str]:
    """What ``az`` runs with here (see the module docstring), plus ``extra``."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_")}
    env.update(AZURE_CONFIG_DIR=str(config_dir), AZURE_CORE_COLLECT_TELEMETRY="false", AZURE_CORE_NO_COLOR="true",
               AZURE_CORE_ONLY_SHOW_ERRORS="true", AZURE_CORE_SURVEY_MESSAGE="false")
    env.update(extra)
    return env


if __name__ == "__main__":
    print(ensure_azure_cli())
