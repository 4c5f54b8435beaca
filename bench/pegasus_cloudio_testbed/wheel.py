"""Our commands as ``pip install`` of the wheel gives them to users, for benchmarks.

`installed_bin(root)` is the ``bin`` directory of an installation made from a wheel, never an
editable one: an editable install's import hook costs every process about 8 ms of CPU that
users of the wheel never pay, and benchmarks that start our drop-in on every job step would
charge it to us. When this package is itself installed from a wheel, that is the directory of
the running interpreter; from a source checkout, a wheel is built from the checkout and
installed, without dependencies (the core has none), into a fresh venv under ``root``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from typing import Optional

__all__ = ["build_wheel", "installed_bin", "source_checkout"]

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TIMEOUT_S = 300
_NOT_BUILT = shutil.ignore_patterns(".git", ".venv", ".tools", "build", "dist", "*.egg-info", "__pycache__",
                                    ".mypy_cache", ".pytest_cache", "bench-results", "tests", "docs")


def source_checkout() -> bool:
    """True when this package runs from a source tree (editable install or PYTHONPATH)."""
    purelib = os.path.realpath(sysconfig.get_paths()["purelib"])
    return os.path.exists(os.path.join(PACKAGE_ROOT, "setup.cfg")) and os.path.realpath(PACKAGE_ROOT) != purelib


def installed_bin(root: str, checkout: Optional[str] = None) -> str:
    """A ``bin`` directory whose ``pegasus-cloudio-transfer`` and ``pegasus-cloudio`` come from a
    wheel (see the module docstring), or from a wheel of another source ``checkout`` (a
    benchmark's "before"); raises RuntimeError naming the step that failed."""
    if checkout is None and not source_checkout():
        return os.path.dirname(sys.executable)
    wheel, venv = build_wheel(root, checkout), os.path.join(root, "venv")
    _run([sys.executable, "-m", "venv", "--without-pip", venv], "creating a venv")
    python = os.path.join(venv, "bin", "python")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index",
          wheel], "installing the wheel")
    return os.path.join(venv, "bin")


def build_wheel(root: str, checkout: Optional[str] = None) -> str:
    """Build this source checkout's wheel (or another source ``checkout``'s) into ``root/dist``
    (from a copy in ``root/src``); its path."""
    src, dist = os.path.join(root, "src"), os.path.join(root, "dist")
    shutil.copytree(checkout or PACKAGE_ROOT, src, ignore=_NOT_BUILT)  # the build leaves build/ where it runs
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", dist, src], "building the wheel")
    [wheel] = [os.path.join(dist, n) for n in os.listdir(dist) if n.endswith(".whl")]
    return wheel


def _run(argv: list[str], step: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, env=env, cwd=os.path.dirname(argv[-1]))
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"{step} for the benchmark failed (exit {done.returncode}): {tail}")
