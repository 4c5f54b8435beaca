"""Helpers for tests of what users install: a wheel built from the sdist, fresh venvs, clean
environments (nothing from this checkout on ``sys.path``) and transfer specifications."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, List, Mapping, Sequence, Set, Tuple

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("transfer", "pegasus_cloudio", "snakemake_storage_plugin_pegasus_cloudio")
SKIP = shutil.ignore_patterns(".git", ".venv", ".tools", "build", "dist", "*.egg-info", "__pycache__",
                               ".mypy_cache", ".pytest_cache", "bench-results")


def run(argv: Sequence[str], env: Mapping[str, str], cwd: Path, stdin: str = "",
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), input=stdin, env=dict(env), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def clean_env(bin_dir: str, extra: Mapping[str, str] = {}) -> Dict[str, str]:
    """This process's environment without anything that points Python at the checkout."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PEGASUS_CLOUDIO_", "VIRTUAL_ENV", "PIP_REQUIRE"))}
    env["PATH"] = os.pathsep.join([bin_dir, "/usr/local/bin", "/usr/bin", "/bin"])
    env.update(extra)
    return env


def build_sdist_and_wheel(out: Path) -> Tuple[Path, Path]:
    """sdist from a copy of the source tree, then the wheel from that sdist (as pip does)."""
    src = out / "src"
    shutil.copytree(REPO, src, ignore=SKIP)
    code = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    done = run([sys.executable, "-c", code, str(out)], os.environ, src)
    assert done.returncode == 0, done.stderr[-3000:]
    sdist = out / done.stdout.strip().splitlines()[-1]
    done = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                "--no-index", "-w", str(out), str(sdist)], os.environ, out)
    assert done.returncode == 0, done.stderr[-3000:]
    [wheel] = out.glob("pegasus_cloudio-*.whl")
    return sdist, wheel


def source_packages() -> Set[str]:
    """Dotted names of every directory of the source packages that holds Python files."""
    found = set()
    for top in PACKAGES:
        for folder, _, files in os.walk(REPO / top):
            if "__pycache__" not in folder and any(f.endswith(".py") for f in files):
                found.add(os.path.relpath(folder, REPO).replace(os.sep, "."))
    return found


def archive_packages(names: List[str], prefix: str = "") -> Set[str]:
    """Dotted package names of the ``.py`` files among archive member ``names``."""
    return {os.path.dirname(n[len(prefix):]).replace("/", ".") for n in names
            if n.startswith(prefix) and n.endswith(".py") and n[len(prefix):].split("/")[0] in PACKAGES}


def wheel_packages(wheel: Path) -> Set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return archive_packages(zf.namelist())


def constraints_file(path: Path) -> Path:
    """The development lock (requirements/*.txt) as one pip constraints file at ``path``.

    pip refuses extras in constraints (``moto[server]``), so they are dropped: the extra's own
    packages are pinned by their own lines."""
    lines = [re.sub(r"^([A-Za-z0-9_.-]+)\[[^\]]*\]", r"\1", line.strip())
             for req in sorted((REPO / "requirements").glob("*.txt"))
             for line in req.read_text().splitlines() if line.strip() and not line.lstrip().startswith(("#", "-"))]
    path.write_text("\n".join(lines) + "\n")
    return path


def make_venv(path: Path) -> Path:
    """A fresh venv (no system site-packages); returns its bin directory."""
    done = run([sys.executable, "-m", "venv", str(path)], os.environ, path.parent)
    assert done.returncode == 0, done.stderr
    return path / "bin"


def transfer(src: str, dst: str, lfn: str) -> Dict[str, object]:
    """One entry of a pegasus-transfer JSON specification."""
    return {"type": "transfer", "lfn": lfn, "id": 1, "src_urls": [{"site_label": "a", "url": src}],
            "dest_urls": [{"site_label": "b", "url": dst}]}


def spec(*entries: Dict[str, object]) -> str:
    return json.dumps(list(entries))
