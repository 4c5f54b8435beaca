"""The real Pegasus 5.1.2 (planner included), unpacked once per machine from its tarball.

No package registry serves the Java planner, so the binary distribution ships beside the
checkout (``../shared/pegasus/pegasus-nodocs-5.1.2-x86_64_deb_12.tar.gz``, or the file
``$PEGASUS_CLOUDIO_PEGASUS_TARBALL`` names). `ensure_pegasus` checks the tarball's sha256,
extracts it into a temporary directory beside the target and renames it into place, under a
file lock, so parallel callers and a crash mid-way never leave a half-unpacked tree. The
result is world-readable: the pool's jobs run ``pegasus-kickstart`` and PegasusLite from it as
the pool user.

Where: ``$PEGASUS_CLOUDIO_PEGASUS_DIR``, else ``/var/cache/pegasus-cloudio`` for root (CI runs
as root; ``/root`` is private), else ``~/.cache/pegasus-cloudio``. Never under ``/tmp``:
DAGMan refuses node logs there and the planner puts logs beside its tools' paths.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Iterator, Optional

__all__ = ["PEGASUS_VERSION", "PegasusNotFound", "cache_dir", "ensure_pegasus", "tarball"]

PEGASUS_VERSION = "5.1.2"
TARBALL_NAME = f"pegasus-nodocs-{PEGASUS_VERSION}-x86_64_deb_12.tar.gz"
TARBALL_SHA256 = "eff0c92e6358b9cfb51cc5a4723295bd5b531062a5b5a27b7962a6887c80b06f"
ENV_TARBALL = "PEGASUS_CLOUDIO_PEGASUS_TARBALL"
ENV_DIR = "PEGASUS_CLOUDIO_PEGASUS_DIR"
_REPO = Path(__file__).resolve().parent.parent.parent


class PegasusNotFound(RuntimeError):
    """The tarball is missing or is not the pinned one (the message names the file)."""


def tarball() -> Path:
    """The pinned tarball: ``$PEGASUS_CLOUDIO_PEGASUS_TARBALL``, else ``../shared/pegasus/`` of the checkout."""
    override = os.environ.get(ENV_TARBALL)
    path = Path(override) if override else _REPO.parent / "shared" / "pegasus" / TARBALL_NAME
    if not path.is_file():
        raise PegasusNotFound(f"Pegasus {PEGASUS_VERSION} tarball not found: {path} (set {ENV_TARBALL})")
    return path


def cache_dir() -> Path:
    """Where unpacked trees live (see the module docstring); not created here."""
    override = os.environ.get(ENV_DIR)
    if override:
        return Path(override).expanduser().resolve()
    if os.geteuid() == 0:
        return Path("/var/cache/pegasus-cloudio")
    return Path.home() / ".cache" / "pegasus-cloudio"


def ensure_pegasus(source: Optional[Path] = None) -> Path:
    """``.../pegasus-5.1.2`` (its ``bin/pegasus-plan`` runnable), unpacking it first if needed."""
    root = cache_dir()
    home = root / f"pegasus-{PEGASUS_VERSION}"
    stamp = home / ".unpacked-sha256"
    if _stamped(stamp):
        return home
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".pegasus-{PEGASUS_VERSION}.lock"):
        if _stamped(stamp):
            return home
        path = source or tarball()
        digest = _sha256(path)
        if digest != TARBALL_SHA256:
            raise PegasusNotFound(f"{path}: sha256 {digest}, expected {TARBALL_SHA256}")
        _unpack(path, home)
        stamp.write_text(digest + "\n")
    return home


def _stamped(stamp: Path) -> bool:
    try:
        return stamp.read_text().strip() == TARBALL_SHA256
    except OSError:
        return False


def _unpack(path: Path, home: Path) -> None:
    """Extract into a sibling temp dir, make it world-readable, rename over any stale tree."""
    temp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=home.parent))
    try:
        with tarfile.open(path) as archive:
            archive.extractall(temp, filter="tar")
        tree = temp / home.name
        if not (tree / "bin" / "pegasus-plan").is_file():
            raise PegasusNotFound(f"{path}: no {home.name}/bin/pegasus-plan inside")
        os.chmod(temp, 0o755)
        for folder, dirs, files in os.walk(tree):
            for name in dirs + files:
                entry = os.path.join(folder, name)
                if not os.path.islink(entry):
                    mode = os.stat(entry).st_mode
                    os.chmod(entry, mode | 0o444 | (0o111 if mode & 0o100 else 0))
        if home.exists():
            shutil.rmtree(home)
        os.replace(tree, home)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
