"""Catalog sets and the Montage-like workflow for planned runs on the test pool.

`write_set` runs ``pegasus-cloudio sites`` (this installation's) for one mode with the given
flags, then `add_montage_like` runs ``examples/montage_like/workflow.py`` (copied beside the
set, as a user would) to merge its transformations and raw input into the set and write
``workflow.yml``; `expected_concat` computes, independently of the scripts, the bytes the
fan-in job must produce; `plan_argv` reads the plan command from the set's README, the
command users are told to run. Everything is then handed to the submitter (`chown_tree`).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Sequence

from .condor_pool import PoolError

__all__ = ["EXAMPLE", "add_montage_like", "chown_tree", "expected_concat", "plan_argv", "write_set"]

EXAMPLE = Path(__file__).resolve().parent.parent.parent / "examples" / "montage_like"
HEADER = "inputs/region.hdr"
OUTPUT = "fits.tbl"


def _bin() -> Path:
    return Path(sys.executable).parent


def write_set(out: Path, flags: Sequence[str]) -> None:
    """``pegasus-cloudio sites FLAGS --out OUT``; PoolError with its stderr when it fails."""
    done = subprocess.run([str(_bin() / "pegasus-cloudio"), "sites", *flags, "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise PoolError(f"pegasus-cloudio sites {shlex.join(flags)}: exit {done.returncode}: {done.stderr}")


def add_montage_like(set_dir: Path, producers: int, files: int, cluster_size: int) -> None:
    """Copy the example beside the set and run it on the set (Pegasus API of this Python)."""
    if not (EXAMPLE / "workflow.py").is_file():
        raise PoolError(f"{EXAMPLE}/workflow.py not found: planned runs need a source checkout")
    copy = set_dir / "montage_like"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, str(copy / "workflow.py"), "--catalogs", str(set_dir),
                           "--producers", str(producers), "--files", str(files),
                           "--cluster-size", str(cluster_size)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise PoolError(f"examples/montage_like/workflow.py failed: {done.stderr[-2000:]}")


def expected_concat(set_dir: Path, producers: int, files: int) -> bytes:
    """What ``concat.sh`` must write: every producer's files in name order, each the header's
    first 200 bytes then ``\\nPREFIX I\\n`` (project.sh's format, restated here)."""
    header = (set_dir / HEADER).read_bytes()[:200]
    return b"".join(header + f"\np{p:04d} {i}\n".encode() for p in range(producers) for i in range(files))


def plan_argv(set_dir: Path) -> List[str]:
    """The ``pegasus-plan`` command of the set's README."""
    text = (set_dir / "README.md").read_text()
    found = re.search(r"^(\S*pegasus-plan .*)$", text, re.M)
    if not found:
        raise PoolError(f"{set_dir}/README.md has no pegasus-plan command")
    return shlex.split(found.group(1))


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """Hand ``path`` and everything below it (links themselves, not their targets) to uid:gid."""
    os.lchown(path, uid, gid)
    for folder, dirs, names in os.walk(path):
        for name in dirs + names:
            os.lchown(os.path.join(folder, name), uid, gid)
