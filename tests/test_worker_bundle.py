"""`pegasus-cloudio worker-bundle`: one executable file that runs the drop-in under a worker's
plain system python3 (the oldest >= 3.9 on this machine, isolated mode, outside any venv),
against MinIO: bundled stage-out and stage-in, a node-cache hit, and one line for what is missing."""

from __future__ import annotations

import ast
import glob
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from installed import REPO, clean_env, run, spec, transfer
from pegasus_cloudio.version import __version__

MIN = (3, 9)


def interpreters() -> List[Tuple[Tuple[int, int], str]]:
    """(version, path) of every CPython 3 on this machine outside any venv, oldest first."""
    found = {}
    for path in sorted(glob.glob("/usr/bin/python3.*") + glob.glob("/root/.pyenv/versions/*/bin/python3.*")):
        if not re.fullmatch(r"python3\.\d+", os.path.basename(path)):
            continue
        done = subprocess.run([path, "-I", "-c", "import sys; print(*sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=30)
        if done.returncode == 0:
            major, minor = map(int, done.stdout.split())
            found.setdefault((major, minor), path)
    return sorted(found.items())


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "pegasus-cloudio-transfer.pyz"
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "worker-bundle", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def oldest() -> str:
    supported = [path for version, path in interpreters() if version >= MIN]
    assert supported, "no python3 >= 3.9 outside a venv on this machine"
    return supported[0]


def worker(oldest: str, pyz: Path, env: Dict[str, str], cwd: Path, stdin: str = "[]") -> Tuple[int, str]:
    done = run([oldest, "-I", str(pyz)], clean_env("/usr/bin", env), cwd, stdin=stdin, timeout=120)
    return done.returncode, done.stderr


def test_bundle_is_one_small_executable_file(pyz: Path, oldest: str, tmp_path: Path) -> None:
    assert pyz.stat().st_mode & 0o111 and pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    # a tripwire, so growth is decided: 400,000 until the 45th stop's Buckets.names_bucket and read-ahead linger
    assert pyz.stat().st_size < 410_000
    done = run([oldest, "-I", str(pyz), "--version"], clean_env("/usr/bin"), tmp_path)
    assert done.stdout.startswith(f"pegasus-cloudio-transfer {__version__} (Python {oldest.rsplit('python', 1)[1]}")


def test_every_transfer_module_a_bundled_module_imports_is_bundled(pyz: Path) -> None:
    """What the bundle leaves out of ``transfer`` (worker_bundle.LEFT_OUT) no bundled module imports,
    at its top or inside a function: a path the end-to-end runs below do not take would fail on a
    worker with ModuleNotFoundError."""
    with zipfile.ZipFile(pyz) as archive:
        sources = {name: archive.read(name) for name in archive.namelist() if name.endswith(".py")}
    bundled = {name[:-3].replace("/", ".").removesuffix(".__init__") for name in sources}
    assert "transfer.engine" in bundled and "transfer.client" not in bundled
    wanted = set()
    for source in sources.values():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                wanted |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                wanted |= {alias.name for alias in node.names}
    modules = {str(path.relative_to(REPO).with_suffix("")).replace(os.sep, ".").removesuffix(".__init__")
               for path in (REPO / "transfer").rglob("*.py")}
    assert "transfer.client" in modules
    assert wanted & modules - bundled == set()


def test_the_bundle_ends_as_the_installed_drop_in_does(pyz: Path, oldest: str, tmp_path: Path) -> None:
    """As the installed command: the cyclic collector's threshold raised before the imports
    (launch.GC_THRESHOLD), and an exit without the interpreter's teardown (pegasus_cloudio.ending):
    an object that only the teardown frees says whether it ran."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import atexit, gc, os\n"
        "class Torn:\n"
        "    def __del__(self):\n"
        "        os.write(2, b'torn down\\n')\n"
        "torn = Torn()\n"
        "atexit.register(lambda: os.write(2, b'threshold %d\\n' % gc.get_threshold()[0]))\n")
    done = run([oldest, str(pyz)], clean_env("/usr/bin", {"PYTHONPATH": str(hook)}), tmp_path, stdin="[]")
    assert done.returncode == 0, done.stderr
    assert "threshold 10000" in done.stderr
    assert "torn down" not in done.stderr


def test_bundled_stage_in_and_cache_hit_under_the_oldest_python(pyz: Path, oldest: str, proxied: tuple,
                                                                bucket: str, tmp_path: Path) -> None:
    proxy, env = proxied
    env = dict(env, PEGASUS_CLOUDIO_BUNDLE="1", PEGASUS_CLOUDIO_CACHE_DIR=str(tmp_path / "cache"))
    (tmp_path / "src").mkdir()
    names = [f"f{i:02d}" for i in range(20)]
    for name in names:
        (tmp_path / "src" / name).write_bytes(name.encode() * 50)
    url = f"s3://test@minio/{bucket}/run"
    out = [transfer(f"file://{tmp_path}/src/{n}", f"{url}/{n}", n) for n in names]
    proxy.reset_counters()
    rc, err = worker(oldest, pyz, dict(env, PEGASUS_CLOUDIO_CACHE_DIR="off"), tmp_path, spec(*out))  # another node
    assert rc == 0, err
    assert proxy.snapshot()["requests"] == 1  # one bundle PUT for 20 files
    for round_, dest in enumerate(("in1", "in2")):
        proxy.reset_counters()
        rc, err = worker(oldest, pyz, env, tmp_path,
                         spec(*[transfer(f"{url}/{n}", f"file://{tmp_path}/{dest}/{n}", n) for n in names]))
        assert rc == 0, err
        assert all((tmp_path / dest / n).read_bytes() == n.encode() * 50 for n in names)
        requests = proxy.snapshot()["requests"]
        # LIST + bundle GET; then the directory's index only (member-keyed cache entries are used
        # only for reads that resolve to that member, docs/bundles.md), bytes from the cache.
        assert (requests == 2) if round_ == 0 else (requests <= 2), (dest, requests)
    stats = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "cache", "stats", "--json", "--dir",
                            str(tmp_path / "cache")], capture_output=True, text=True, timeout=60)
    assert json.loads(stats.stdout)["hits"] == len(names), stats.stdout


def test_schemes_needing_compiled_sdks_say_what_is_missing(pyz: Path, oldest: str, tmp_path: Path) -> None:
    (tmp_path / "in").write_bytes(b"x")
    for url, module in (("gs://bucket/key", "google"), ("scp://user@127.0.0.1/tmp/key", "paramiko")):
        rc, err = worker(oldest, pyz, {"HOME": str(tmp_path)}, tmp_path,
                         spec(transfer(f"file://{tmp_path}/in", url, "in")))
        assert rc == 1
        [line] = [line for line in err.splitlines() if "URLs need" in line]
        assert f"the Python module '{module}', which is not installed" in line, line


def test_too_old_python_is_one_line(pyz: Path, tmp_path: Path) -> None:
    old = [path for version, path in interpreters() if (3, 6) <= version < MIN]
    for path in old:
        done = run([path, "-I", str(pyz)], clean_env("/usr/bin"), tmp_path)
        assert done.returncode == 2 and done.stderr.startswith("pegasus-cloudio-transfer needs Python 3.9"), path
