"""Pinned Go tools for the test bed, built once into a git-ignored tools dir.

Every tool is described by one `ToolPin` in `PINS`. `ensure_tool(name)` returns
`<tools_dir>/bin/<name>`, building it first when the binary is missing or was
built from a different pin (each build writes `<tools_dir>/stamps/<name>.json`
recording the pin it came from). Builds go to a temporary directory inside the
tools dir and are renamed into place, so a crashed build never leaves a
half-written binary behind, and a per-tool file lock keeps two processes (for
example parallel test workers) from building the same tool at once (the lock, the stamp
writes and the progress watch are :mod:`.tool_builds`, shared with :mod:`.node_tools`).

Command line (used by the Makefile and CI); it installs the Node programs of
:mod:`.node_tools` (``azurite``) too::

    python -m pegasus_cloudio_testbed.tools minio s5cmd pegasus-transfer-go azurite

Most pins are modules the Go module proxy serves. `pegasus-transfer-go` (Pegasus's Go
pegasus-transfer, the next stock tool) is not: its pinned source archive ships beside the
checkout in ``shared/pegasus-transfer-go/`` (see `shared_dir`), checked by sha256 before it is
built; only its dependencies come from the proxy. A build has no time limit: a slow machine
makes it slow, not failed (the Makefile's heartbeat says it is still going).
"""


from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

from . import node_tools
from .tool_builds import (PROGRESS_EVERY_S, BuildWatch, Progress, build_lock, checked, stderr_progress,
                          tools_dir, write_atomic)

__all__ = [
    "PINS",
    "ToolPin",
    "SourcePin",
    "ensure_fake_gcs_server",
    "ensure_go_transfer",
    "ensure_minio",
    "ensure_s5cmd",
    "ensure_tool",
    "main",
    "shared_dir",
    "tools_dir",
]

ENV_SHARED_DIR = "PEGASUS_CLOUDIO_SHARED_DIR"
LOG_TAIL_LINES = 25


@dataclass(frozen=True)
class SourcePin:
    """A Go program built from a source archive kept beside the checkout.

    Fields:
        directory: directory under `shared_dir` holding the files below.
        archive: the ``.tar.gz`` of the source tree; ``archive_sha256`` its digest.
        gomod: a ``go.mod`` pinning the dependencies' versions (copied into
            ``subdir`` before the build); ``gomod_sha256`` its digest.
        subdir: the module's directory inside the unpacked archive.
    """

    directory: str
    archive: str
    archive_sha256: str
    gomod: str
    gomod_sha256: str
    subdir: str


@dataclass(frozen=True)
class ToolPin:
    """How to build one Go tool reproducibly.

    Fields:
        name: binary name under ``<tools_dir>/bin``.
        module: Go module path.
        version: exact module version (tag or pseudo-version).
        method: ``"install"`` runs ``go install MODULE/PACKAGE@VERSION``;
            ``"module-build"`` downloads the module with ``go mod download``
            and runs ``go build`` inside its (read-only) module-cache directory,
            for modules the proxy serves but ``go install`` refuses;
            ``"source-build"`` runs ``go build`` in the unpacked ``source``.
        package: package path inside the module ("" for the module root).
        ldflags: extra ``-X`` style linker flags for ``"module-build"``;
            ``{version}`` and ``{commit}`` are substituted.
        source: the archive of a ``"source-build"`` (None otherwise).
    """

    name: str
    module: str
    version: str
    method: str = "install"
    package: str = ""
    ldflags: Tuple[str, ...] = ()
    source: Optional[SourcePin] = None

    @property
    def spec(self) -> str:
        """``module[/package]@version``, as printed in progress messages."""
        path = f"{self.module}/{self.package}" if self.package else self.module
        return f"{path}@{self.version}"

    def stamp_text(self) -> str:
        """Canonical text written to the stamp file; any pin change changes it.

        A pin without a ``source`` leaves the key out, so its stamp is the text written before
        that field existed: adding it must not make every tools dir rebuild MinIO and s5cmd
        (or two checkouts sharing one tools dir rebuild them in turn).
        """
        fields = dataclasses.asdict(self)
        if self.source is None:
            del fields["source"]
        return json.dumps(fields, sort_keys=True) + "\n"


PINS: Mapping[str, ToolPin] = MappingProxyType(
    {
        "minio": ToolPin(
            name="minio",
            module="github.com/minio/minio",
            version="v0.0.0-20260212201848-7aac2a2c5b7c",
        ),
        # The proxy's version list for s5cmd/v2 answers 403, which `go install
        # pkg@version` needs (deprecation lookup); `go mod download` does not.
        "s5cmd": ToolPin(
            name="s5cmd",
            module="github.com/peak/s5cmd/v2",
            version="v2.3.0",
            method="module-build",
            ldflags=(
                "-X=github.com/peak/s5cmd/v2/version.Version={version}",
                "-X=github.com/peak/s5cmd/v2/version.GitCommit={commit}",
            ),
        ),
        "fake-gcs-server": ToolPin(
            name="fake-gcs-server",
            module="github.com/fsouza/fake-gcs-server",
            version="v1.56.1",
        ),
        # Pegasus's Go pegasus-transfer (pegasus-isi/pegasus b261f8c80, 2026-08-21), the stock
        # tool of Pegasus 6; the commit has no go.mod, so the pinned one is shipped beside it.
        "pegasus-transfer-go": ToolPin(
            name="pegasus-transfer-go",
            module="github.com/pegasus-isi/pegasus/packages/pegasus-transfer",
            version="b261f8c80",
            method="source-build",
            package="cmd/pegasus-transfer",
            source=SourcePin(
                directory="pegasus-transfer-go",
                archive="pegasus-transfer-go-b261f8c80.tar.gz",
                archive_sha256="a9bfc735e1c808c8c86f396ae577dc7bfb186d80cebd0e17c6a32214fd035b29",
                gomod="go.mod.pinned",
                gomod_sha256="3e24f4fd90cb07b4897ad0c50a9bbb6ae17a6699fd5e77bd60f3873b42a80200",
                subdir="packages/pegasus-transfer",
            ),
        ),
    }
)

# (substring of build output, one-line hint); first match wins.
_HINTS: Tuple[Tuple[str, str], ...] = (
    ("requires go >=", "the Go toolchain is too old for this pin; install a newer Go"),
    ("dial tcp", "module download failed; check network access to the Go module proxy (GOPROXY)"),
    ("403 Forbidden", "the Go module proxy refused a request; check GOPROXY"),
    ("no space left", "the disk is full (Go build cache or tools dir)"),
)
_DEFAULT_HINT = "see the full build log"


def shared_dir(directory: str) -> Path:
    """``shared/<directory>`` beside the checkout: ``$PEGASUS_CLOUDIO_SHARED_DIR/<directory>``
    if set, else the nearest ``shared/<directory>`` in the package's parent directories (a
    clone with ``../shared`` beside it, or a git worktree nested one level deeper).

    Raises RuntimeError naming where it looked when there is none.
    """
    override = os.environ.get(ENV_SHARED_DIR)
    if override:
        found = Path(override).expanduser().resolve() / directory
        if not found.is_dir():
            raise RuntimeError(f"{found}: no such directory (from ${ENV_SHARED_DIR})")
        return found
    repo = Path(__file__).resolve().parent.parent.parent
    for parent in [repo, *repo.parents]:
        if (parent / "shared" / directory).is_dir():
            return parent / "shared" / directory
    raise RuntimeError(f"shared/{directory} not found beside {repo} or above it (set ${ENV_SHARED_DIR})")


def ensure_tool(
    name: str,
    *,
    directory: Optional[Path] = None,
    progress: Progress = stderr_progress,
    progress_every: float = PROGRESS_EVERY_S,
) -> Path:
    """Return the path of the pinned binary ``name``, building it if needed; a build runs as long
    as it takes, calling ``progress`` every ``progress_every`` seconds.

    Raises KeyError for an unknown name, RuntimeError when the build fails
    (message: exit status, last lines of the build log, one-line hint).
    """
    pin = PINS[name]
    root = directory if directory is not None else tools_dir()
    binary = root / "bin" / pin.name
    stamp = root / "stamps" / f"{pin.name}.json"
    if _is_current(pin, binary, stamp):
        return binary
    with build_lock(root, pin.name, progress):
        if _is_current(pin, binary, stamp):
            return binary  # built by another process while we waited
        if _adopt_prebuilt(pin, binary, stamp):
            return binary
        _build(pin, root, progress, progress_every)
    return binary


def ensure_minio(*, directory: Optional[Path] = None) -> Path:
    """Return the pinned MinIO server binary, building it (~4 min) if needed."""
    return ensure_tool("minio", directory=directory)


def ensure_s5cmd(*, directory: Optional[Path] = None) -> Path:
    """Return the pinned s5cmd binary, building it (~1 min) if needed."""
    return ensure_tool("s5cmd", directory=directory)


def ensure_fake_gcs_server(*, directory: Optional[Path] = None) -> Path:
    """Return the pinned fake-gcs-server binary, building it if needed."""
    return ensure_tool("fake-gcs-server", directory=directory)


def ensure_go_transfer(*, directory: Optional[Path] = None) -> Path:
    """Return Pegasus's Go pegasus-transfer (the pinned commit), building it if needed."""
    return ensure_tool("pegasus-transfer-go", directory=directory)


def _is_current(pin: ToolPin, binary: Path, stamp: Path) -> bool:
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return False
    try:
        return stamp.read_text() == pin.stamp_text()
    except OSError:
        return False


def _adopt_prebuilt(pin: ToolPin, binary: Path, stamp: Path) -> bool:
    """Accept an unstamped binary whose embedded Go build info matches the pin.

    Only ``go install`` builds record the module version (a ``module-build``
    binary reports ``(devel)``), so only those can be adopted. Writes the stamp
    on success.
    """
    go = _find_go()
    if pin.method != "install" or go is None or stamp.exists() or not binary.is_file():
        return False
    result = subprocess.run(
        [go, "version", "-m", str(binary)], capture_output=True, text=True, check=False
    )
    wanted = ["mod", pin.module, pin.version]
    matches = any(line.split()[:3] == wanted for line in result.stdout.splitlines())
    if result.returncode == 0 and matches:
        write_atomic(stamp, pin.stamp_text())
    return result.returncode == 0 and matches


def _find_go() -> Optional[str]:
    """The ``go`` command on PATH, else the standard /usr/local/go install."""
    found = shutil.which("go")
    if found:
        return found
    fallback = Path("/usr/local/go/bin/go")
    return str(fallback) if os.access(fallback, os.X_OK) else None


def _build(pin: ToolPin, root: Path, progress: Progress, progress_every: float) -> None:
    """Build ``pin`` into a temp dir under ``root``, then move it into ``bin/``."""
    go = _find_go()
    if go is None:
        raise RuntimeError(
            f"cannot build {pin.name} ({pin.spec}).\n"
            "hint: Go toolchain not found on PATH; install Go (https://go.dev/dl/)"
        )
    for sub in ("bin", "stamps", "logs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    log_path = root / "logs" / f"{pin.name}-build.log"
    progress(f"building {pin.name} (pinned {pin.spec}), this takes a few minutes; log: {log_path}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=root, prefix=f".build-{pin.name}-") as tmp:
        with open(log_path, "w") as log:
            built = _run_build(go, pin, Path(tmp), log, BuildWatch(pin.name, log_path, progress, started, progress_every))
        if built is None:
            raise RuntimeError(_failure_message(pin, log_path))
        os.replace(built, root / "bin" / pin.name)
    write_atomic(root / "stamps" / f"{pin.name}.json", pin.stamp_text())
    progress(f"built {pin.name} in {time.monotonic() - started:.0f} s")


def _run_build(go: str, pin: ToolPin, out_dir: Path, log: TextIO, watch: BuildWatch) -> Optional[Path]:
    """Run the go commands for ``pin``; return the built binary or None on failure."""
    output = out_dir / pin.name
    if pin.method == "install":
        env = _go_env(GOBIN=str(out_dir))
        ok = _run_logged([go, "install", pin.spec], cwd=out_dir, env=env, log=log, watch=watch)
        return output if ok and output.is_file() else None
    if pin.method == "module-build":
        return _module_build(go, pin, output, log, watch)
    if pin.method == "source-build" and pin.source is not None:
        return _source_build(go, pin, pin.source, out_dir, log, watch)
    raise ValueError(f"unknown build method {pin.method!r} for {pin.name}")


def _module_build(go: str, pin: ToolPin, output: Path, log: TextIO, watch: BuildWatch) -> Optional[Path]:
    """``go mod download`` the module, then ``go build`` inside its cache dir.

    The module zip carries ``vendor/modules.txt`` but no vendored sources, so
    ``-mod=mod`` is needed (the default would be ``-mod=vendor``); the cache
    dir is read-only, which is fine because the module's go.sum is complete.
    """
    env = _go_env(GOWORK="off")
    info = _download_module(go, pin, env, log, watch)
    if info is None:
        return None
    origin = info.get("Origin") or {}
    commit = str(origin.get("Hash", "unknown"))[:7]
    flags = " ".join(f.format(version=pin.version, commit=commit) for f in pin.ldflags)
    target = f"./{pin.package}" if pin.package else "."
    cmd = [go, "build", "-mod=mod", "-trimpath", "-ldflags", flags, "-o", str(output), target]
    ok = _run_logged(cmd, cwd=Path(info["Dir"]), env=env, log=log, watch=watch)
    return output if ok and output.is_file() else None


def _source_build(go: str, pin: ToolPin, source: SourcePin, out_dir: Path, log: TextIO,
                  watch: BuildWatch) -> Optional[Path]:
    """Unpack ``source`` (digests checked first) into ``out_dir`` and ``go build`` it there.

    The archive's own go.sum stays, so every dependency the proxy sends is checked against
    the commit's digests.
    """
    home = shared_dir(source.directory)
    archive = checked(home / source.archive, source.archive_sha256)
    gomod = checked(home / source.gomod, source.gomod_sha256)
    tree = out_dir / "src"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    module = tree / source.subdir
    shutil.copyfile(gomod, module / "go.mod")
    output = out_dir / pin.name
    env = _go_env(GOWORK="off", GOFLAGS="-mod=mod")
    cmd = [go, "build", "-trimpath", "-o", str(output), f"./{pin.package}"]
    ok = _run_logged(cmd, cwd=module, env=env, log=log, watch=watch)
    return output if ok and output.is_file() else None


def _download_module(go: str, pin: ToolPin, env: Mapping[str, str], log: TextIO,
                     watch: BuildWatch) -> Optional[Dict[str, Any]]:
    """Return ``go mod download -json`` output for the pin, or None on failure."""
    cmd = [go, "mod", "download", "-json", f"{pin.module}@{pin.version}"]
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    with subprocess.Popen(cmd, cwd=tempfile.gettempdir(), env=dict(env), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        out, err = watch.wait(proc)
    log.write(out + err)
    try:
        info = json.loads(out)
    except ValueError:
        return None
    if proc.returncode != 0 or info.get("Error") or not info.get("Dir"):
        return None
    return dict(info)


def _go_env(**overrides: str) -> Dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    env.update(overrides)
    return env


def _run_logged(cmd: Sequence[str], *, cwd: Path, env: Mapping[str, str], log: TextIO, watch: BuildWatch) -> bool:
    """Run ``cmd`` with stdout and stderr appended to ``log``; True on exit 0."""
    log.write(f"$ (cd {cwd} && {' '.join(cmd)})\n")
    log.flush()
    with subprocess.Popen(list(cmd), cwd=str(cwd), env=dict(env), stdout=log, stderr=subprocess.STDOUT,
                          text=True) as proc:
        watch.wait(proc)
    log.write(f"\nexit status {proc.returncode}\n")
    return proc.returncode == 0


def _failure_message(pin: ToolPin, log_path: Path) -> str:
    text = log_path.read_text(errors="replace")
    tail = "\n".join(text.splitlines()[-LOG_TAIL_LINES:])
    hint = next((h for needle, h in _HINTS if needle in text), _DEFAULT_HINT)
    return (
        f"building {pin.name} ({pin.spec}) failed; last lines of {log_path}:\n"
        f"{tail}\nhint: {hint}"
    )


def main(argv: Optional[List[str]] = None) -> int:
    """Build the named tools; print ``name: path`` for each. Exit 1 on failure."""
    parser = argparse.ArgumentParser(
        prog="python -m pegasus_cloudio_testbed.tools",
        description=f"Build pinned test-bed tools into {tools_dir()} (reused when present).",
    )
    names = sorted([*PINS, *node_tools.NODE_PINS])
    parser.add_argument("names", nargs="+", choices=names, metavar="TOOL",
                        help=f"one or more of: {', '.join(names)}")
    args = parser.parse_args(argv)
    for name in args.names:
        try:
            path = ensure_tool(name) if name in PINS else node_tools.ensure_node_tool(name)
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # one line, not a traceback: the user knows they pressed Ctrl-C
            print(f"interrupted while building {name}; nothing half-built is kept, run the same command "
                  "again to build it", file=sys.stderr)
            return 130
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
