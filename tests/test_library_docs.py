"""The library as users install it: the wheel with ``[fsspec]`` in a fresh venv, run from
outside the checkout. Every Python example of README.md's library section and of
docs/library.md runs as written against a real MinIO (the GCS one runs in tests/test_gcs_presign.py) (its endpoint and keys put in place of the
documented ``http://127.0.0.1:9000``, ``minio``, ``minio123``); the installed package registers
the ``cloudio`` fsspec protocol and ``import transfer`` does not import the plain API."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from installed import REPO, build_sdist_and_wheel, clean_env, constraints_file, make_venv, run

Venv = Tuple[Path, Dict[str, str]]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def examples() -> List[Tuple[str, str]]:
    """(where, code) of every Python block of the README's library section and docs/library.md."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Using the library", 1)[1].split("\n## ", 1)[0]
    found = [(f"README.md #{n}", code) for n, code in enumerate(FENCE.findall(section), 1)]
    found += [(f"docs/library.md #{n}", code)
              for n, code in enumerate(FENCE.findall((REPO / "docs" / "library.md").read_text()), 1)]
    return [(where, code) for where, code in found if "gs://" not in code]  # GCS's: tests/test_gcs_presign.py


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    root = tmp_path_factory.mktemp("library")
    _, wheel = build_sdist_and_wheel(root / "dist")
    bin_dir = make_venv(root / "venv")
    env = clean_env(str(bin_dir), {"AWS_EC2_METADATA_DISABLED": "true"})
    done = run([str(bin_dir / "pip"), "install", "--quiet", "-c", str(constraints_file(root / "constraints.txt")),
                f"{wheel}[fsspec]"], env, root, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return bin_dir, env


def test_there_are_examples_to_run() -> None:
    assert len(examples()) >= 5


@pytest.mark.parametrize("where,code", examples(), ids=[w for w, _ in examples()])
def test_documented_example_runs(installed: Venv, minio, tmp_path: Path, where: str, code: str) -> None:
    bin_dir, env = installed
    code = (code.replace("http://127.0.0.1:9000", minio.endpoint)
            .replace('"minio123"', repr(minio.secret_key)).replace('"minio"', repr(minio.access_key)))
    script = tmp_path / "example.py"
    script.write_text(code)
    done = run([str(bin_dir / "python"), str(script)], env, tmp_path, timeout=300)
    assert done.returncode == 0, f"{where}:\n{code}\n{done.stderr[-3000:]}"


def test_installed_package_registers_cloudio_and_keeps_import_transfer_lean(installed: Venv, tmp_path: Path) -> None:
    bin_dir, env = installed
    code = ("import sys, transfer, fsspec\n"
            "assert 'transfer.client' not in sys.modules and 'transfer.fsspec_fs' not in sys.modules\n"
            "cls = fsspec.get_filesystem_class('cloudio')\n"
            "print(cls.__module__, cls.__name__, transfer.__file__)\n")
    done = run([str(bin_dir / "python"), "-c", code], env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    module, name, where = done.stdout.split()
    assert (module, name) == ("transfer.fsspec_fs", "CloudioFileSystem")
    assert str(REPO) not in where
