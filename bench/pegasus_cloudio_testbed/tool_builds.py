"""What the Go tools (:mod:`.tools`) and the Node programs (:mod:`.node_tools`) build with alike.

Both install into one tools dir (`tools_dir`) and mark each install with a stamp written
atomically (`write_atomic`); a per-tool lock file (`build_lock`) keeps two processes (parallel
test workers) from building the same tool at once; a long build says it still runs through a
`Progress` callback (`BuildWatch`) and is never killed for being slow; a pinned file is used
only after its sha256 is the recorded one (`checked`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Tuple

__all__ = ["ENV_TOOLS_DIR", "PROGRESS_EVERY_S", "BuildWatch", "Progress", "build_lock", "checked",
           "stderr_progress", "tools_dir", "write_atomic"]

Progress = Callable[[str], None]

ENV_TOOLS_DIR = "PEGASUS_CLOUDIO_TOOLS_DIR"
PROGRESS_EVERY_S = 60.0  # a build says it still runs this often; it is never killed for being slow


def tools_dir() -> Path:
    """Directory holding ``bin/``, ``stamps/``, ``logs/`` and ``locks/``.

    ``$PEGASUS_CLOUDIO_TOOLS_DIR`` if set; else ``<repo>/.tools`` when the
    package runs from a source checkout (``pyproject.toml`` beside the
    package's parent directory); else ``~/.cache/pegasus-cloudio/tools``.
    The directory is not created here.
    """
    override = os.environ.get(ENV_TOOLS_DIR)
    if override:
        return Path(override).expanduser().resolve()
    repo = Path(__file__).resolve().parent.parent.parent
    if (repo / "pyproject.toml").is_file():
        return repo / ".tools"
    return Path.home() / ".cache" / "pegasus-cloudio" / "tools"


def stderr_progress(message: str) -> None:
    """The default `Progress`: one line on stderr."""
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def build_lock(root: Path, name: str, progress: Progress) -> Iterator[None]:
    """Hold an exclusive per-tool lock file (``<root>/locks/<name>.lock``) for the block,
    saying so through ``progress`` when another process holds it first."""
    lock_dir = root / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{name}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another build of {name} to finish")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class BuildWatch:
    """Who hears that a build still runs: on a busy machine a Go build can take far longer than
    usual, and a newcomer's first command must go on (and say so), not give up after a fixed time."""

    name: str
    log_path: Path
    progress: Progress
    started: float
    every: float

    def wait(self, proc: "subprocess.Popen[str]") -> "Tuple[str, str]":
        """``proc.communicate()``, saying every ``every`` seconds that the build goes on."""
        while True:
            try:
                out, err = proc.communicate(timeout=self.every)
                return out or "", err or ""
            except subprocess.TimeoutExpired:
                self.progress(f"... still building {self.name} ({time.monotonic() - self.started:.0f} s so far; "
                              f"a busy machine is slower, nothing is wrong; log: {self.log_path})")


def checked(path: Path, sha256: str) -> Path:
    """``path``, after its sha256 is found to be ``sha256`` (RuntimeError naming it otherwise)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise RuntimeError(f"{path}: cannot read the pinned file ({exc.strerror})") from exc
    if digest.hexdigest() != sha256:
        raise RuntimeError(f"{path}: sha256 {digest.hexdigest()}, expected {sha256} (not the pinned file)")
    return path


def write_atomic(path: Path, text: str) -> None:
    """``text`` at ``path`` by a temp name beside it and a rename: a reader sees the old or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
