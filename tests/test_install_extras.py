"""Every extra installs as a user installs it: the wheel with ``[EXTRA]`` into a fresh venv from
the package index, with no constraints file (pip's own cache may serve what it downloaded
before), and what the extra is for then imports from that venv; likewise the benchmarks'
distribution (``bench/``) beside the wheel.

Before (issue 33, issue 39 item 10): ``[bench]`` and ``[all]`` left boto3/botocore open below 2
while s3fs's newest aiobotocore accepts only botocore < 1.43.118, so pip tried every newer boto3
against it, backtracked for 10-35 minutes and failed. pip reports such a search as "pip is
looking at multiple versions of NAME"; for the AWS packages it must not happen.
"""

from __future__ import annotations

import configparser
import os
import shutil
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from installed import REPO, build_sdist_and_wheel, clean_env, make_venv, run

# extra -> Python code that must run in its venv (imports of what it brings)
USES: Dict[str, str] = {
    "aws": "import botocore.session, awscrt.checksums",
    "gcs": "import google.cloud.storage, google_crc32c, transfer.backends.gcs",
    "azure": "import azure.identity, transfer.backends._azure_identity as i; "
             "assert i.token_fetch('workload-identity', {'AZURE_FEDERATED_TOKEN_FILE': '/t', 'AZURE_CLIENT_ID': 'c', "
             "'AZURE_TENANT_ID': 't'}, None, 'a')",
    "sftp": "import paramiko, transfer.backends.sftp",
    "condor": "import classad2, htcondor2",
    "sites": "import Pegasus.api, pegasus_cloudio.sites.check",
    "fsspec": "import fsspec; assert fsspec.get_filesystem_class('cloudio').__name__ == 'CloudioFileSystem'",
    "p2p": "import redis",
    "snakemake": "import snakemake_storage_plugin_pegasus_cloudio",
    "parsl": "import transfer.integrations.parsl_staging",
}
USES["all"] = "; ".join(code for extra, code in USES.items() if extra != "snakemake")  # all but [snakemake]
# The benchmarks are a distribution of their own (bench/): installed beside the wheel, they bring
# the stock tools and the library race's peers, s3fs among them.
BENCH_USES = "import boto3, s3fs, obstore, matplotlib, cryptography, Pegasus.tools, pegasus_cloudio_bench.small_files"
BACKTRACKED = ("boto3", "botocore", "aiobotocore", "s3fs", "s3transfer")


def declared_extras() -> set:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    return set(config["options.extras_require"])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sdist_and_wheel(tmp_path_factory.mktemp("dist"))[1]


def test_every_declared_extra_is_installed_here() -> None:
    assert declared_extras() == set(USES)


@pytest.mark.parametrize("extra", sorted(USES))
def test_the_extra_installs_from_the_wheel_without_backtracking_and_works(wheel: Path, extra: str,
                                                                          tmp_path: Path) -> None:
    _installs_and_works(tmp_path, [f"{wheel}[{extra}]"], USES[extra])


def test_the_benchmarks_install_beside_the_wheel_without_backtracking(wheel: Path, tmp_path: Path) -> None:
    src = tmp_path / "bench-src"  # a copy: building in place leaves build/ in the checkout
    shutil.copytree(REPO / "bench", src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    done = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                "-w", str(tmp_path / "dist"), str(src)], os.environ, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    [bench] = (tmp_path / "dist").glob("pegasus_cloudio_bench-*.whl")
    _installs_and_works(tmp_path, [str(wheel), str(bench)], BENCH_USES)


def _installs_and_works(tmp_path: Path, requirements: List[str], code: str) -> None:
    bin_dir = make_venv(tmp_path / "venv")
    env = clean_env(str(bin_dir), {"AWS_EC2_METADATA_DISABLED": "true"})
    done = run([str(bin_dir / "pip"), "install", "--progress-bar", "off", *requirements], env, tmp_path,
               timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    searched = [name for name in BACKTRACKED if f"looking at multiple versions of {name} " in done.stdout]
    assert searched == [], searched
    used = run([str(bin_dir / "python"), "-c", code], env, tmp_path)
    assert used.returncode == 0, used.stderr[-3000:]

