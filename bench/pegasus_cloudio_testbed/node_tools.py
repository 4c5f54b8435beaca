"""Pinned Node programs for the test bed (Azurite), installed once into the tools dir.

The Go tools of :mod:`.tools` are one binary each (both build with :mod:`.tool_builds`); a Node program is a ``node_modules`` tree.
Each is described by one `NodePin`: a ``package.json`` naming the exact version and the
``package-lock.json`` npm wrote for it, both kept in ``pins/<name>/`` beside this module and
checked by sha256 before use. ``npm ci`` installs exactly the lock's tree and checks every
package against the lock's ``integrity`` digest, so the install is the one recorded here or
none. It goes to a temporary directory inside the tools dir and is renamed to
``<tools_dir>/<name>`` when complete, and a stamp (``stamps/<name>.json``) records the pin,
as for the Go tools; the same per-tool lock keeps two processes from installing at once. An
install has no time limit (``npm ci`` of Azurite fetches about 450 packages; a busy machine
is slower, not failed).

To move a pin: ``npm install --prefix DIR azurite@VERSION`` in an empty directory with the
``package.json`` here (new version), copy both files back and update the digests below.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Optional

from .tool_builds import (PROGRESS_EVERY_S, BuildWatch, Progress, build_lock, checked, stderr_progress,
                          tools_dir, write_atomic)

__all__ = ["NODE_PINS", "NodePin", "ensure_azurite", "ensure_node_tool"]

PINS_DIR = Path(__file__).resolve().parent / "pins"


@dataclass(frozen=True)
class NodePin:
    """One npm package installed from a recorded lock.

    Fields:
        name: directory under the tools dir, and under ``pins/`` where its two files are.
        package: the npm package; ``version`` its exact version (as ``package.json`` names it).
        command: the program under ``node_modules/.bin`` that `ensure_node_tool` returns.
        manifest_sha256, lock_sha256: digests of ``package.json`` and ``package-lock.json``.
    """

    name: str
    package: str
    version: str
    command: str
    manifest_sha256: str
    lock_sha256: str

    def stamp_text(self) -> str:
        """Canonical text of the stamp file; any pin change changes it."""
        return json.dumps(asdict(self), sort_keys=True) + "\n"


NODE_PINS: Mapping[str, NodePin] = MappingProxyType({
    # Azurite 3.37.0 declares node >= 22 but runs the blob service on this machine's node 20
    # (npm prints EBADENGINE warnings, which are not errors).
    "azurite": NodePin(
        name="azurite",
        package="azurite",
        version="3.37.0",
        command="azurite-blob",
        manifest_sha256="f116db0a4170cfd1c4370f7a22566936e3a5e84007ec2f4cec513401700c3eb5",
        lock_sha256="65cc0a637fa0b26485be2fdbb3c6eb2f017729de3f00827689670b46f68cdd73",
    ),
})


def ensure_node_tool(name: str, *, directory: Optional[Path] = None, progress: Progress = stderr_progress,
                     progress_every: float = PROGRESS_EVERY_S) -> Path:
    """The pinned program of ``name`` (``<tools_dir>/<name>/node_modules/.bin/<command>``),
    installed first when missing or installed from another pin.

    Raises KeyError for an unknown name, RuntimeError when npm is missing, a pinned file's
    digest is not the recorded one, or ``npm ci`` fails (its exit status and log named).
    """
    pin = NODE_PINS[name]
    root = directory if directory is not None else tools_dir()
    home = root / pin.name
    program = home / "node_modules" / ".bin" / pin.command
    stamp = root / "stamps" / f"{pin.name}.json"
    if _is_current(pin, program, stamp):
        return program
    with build_lock(root, pin.name, progress):
        if not _is_current(pin, program, stamp):
            _install(pin, root, progress, progress_every)
    return program


def ensure_azurite(*, directory: Optional[Path] = None) -> Path:
    """The pinned ``azurite-blob`` program, installed (``npm ci``, a few minutes) if needed."""
    return ensure_node_tool("azurite", directory=directory)


def _is_current(pin: NodePin, program: Path, stamp: Path) -> bool:
    try:
        return program.is_file() and stamp.read_text() == pin.stamp_text()
    except OSError:
        return False


def _install(pin: NodePin, root: Path, progress: Progress, progress_every: float) -> None:
    """``npm ci`` of the pinned lock into a temp dir under ``root``, renamed into place."""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(f"cannot install {pin.name} ({pin.package}@{pin.version}).\n"
                           "hint: npm not found on PATH; install Node.js and npm")
    for sub in ("stamps", "logs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    log_path = root / "logs" / f"{pin.name}-build.log"
    progress(f"installing {pin.name} (pinned {pin.package}@{pin.version}) with npm ci; log: {log_path}")
    started = time.monotonic()
    # npm takes a tree reached through a symbolic link (a worktree's .tools) for a linked
    # package and refuses the lock: it is given the real path
    with tempfile.TemporaryDirectory(dir=root.resolve(), prefix=f".build-{pin.name}-") as tmp:
        tree = Path(tmp) / pin.name
        tree.mkdir()
        for file_name, digest in (("package.json", pin.manifest_sha256), ("package-lock.json", pin.lock_sha256)):
            shutil.copyfile(checked(PINS_DIR / pin.name / file_name, digest), tree / file_name)
        cmd = [npm, "ci", "--prefix", str(tree), "--no-audit", "--no-fund", "--ignore-scripts"]
        with open(log_path, "w") as log:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            with subprocess.Popen(cmd, cwd=str(tree), stdout=log, stderr=subprocess.STDOUT, text=True) as proc:
                BuildWatch(pin.name, log_path, progress, started, progress_every).wait(proc)
        if proc.returncode != 0 or not (tree / "node_modules" / ".bin" / pin.command).is_file():
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
            raise RuntimeError(f"npm ci of {pin.name} ({pin.package}@{pin.version}) failed with exit status "
                               f"{proc.returncode}; last lines of {log_path}:\n{tail}")
        _swap_in(tree, root.resolve() / pin.name)
    write_atomic(root / "stamps" / f"{pin.name}.json", pin.stamp_text())
    progress(f"installed {pin.name} in {time.monotonic() - started:.0f} s")


def _swap_in(tree: Path, home: Path) -> None:
    """Put ``tree`` at ``home``: an older install is renamed away first and removed after,
    so a reader never finds half a tree at ``home``."""
    old = home.with_name(f".{home.name}.old{os.getpid()}")
    if home.exists():
        os.replace(home, old)
    os.replace(tree, home)
    shutil.rmtree(old, ignore_errors=True)
