"""Helpers of the workflow-engine tests (tests/test_engines.py: Parsl, tests/test_engines_snakemake.py):
the wheel, fresh venvs it is installed into, MinIO clients and buckets, the examples of
docs/engines.md. The fixtures are imported by name into each test module (so ``wheel`` is built
once per module, as each module's venvs need it)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import boto3
import pytest

from installed import REPO, build_sdist_and_wheel, clean_env, make_venv, run
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import TcpProxy

ENGINES = REPO / "tests" / "engines"
Venv = Tuple[Path, Dict[str, str]]
FILES = 24


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sdist_and_wheel(tmp_path_factory.mktemp("dist"))[1]


def make_engine_venv(root: Path, *requirements: str) -> Venv:
    """A fresh venv under ``root`` with ``requirements`` pip-installed; its bin dir and a clean
    environment (no credential chain may leave the machine) to run it in."""
    bin_dir = make_venv(root / "venv")
    env = clean_env(str(bin_dir), {"AWS_EC2_METADATA_DISABLED": "true", "HOME": str(root)})
    done = run([str(bin_dir / "pip"), "install", "--quiet", *requirements], env, root, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return bin_dir, env


@pytest.fixture
def counted(minio: MinioServer) -> Iterator[TcpProxy]:
    with TcpProxy((minio.host, minio.port)) as proxy:
        yield proxy


def boto(minio: MinioServer):  # type: ignore[no-untyped-def]
    return boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                        aws_secret_access_key=minio.secret_key, region_name="us-east-1",
                        verify=str(minio.ca_file) if minio.tls else None)


@pytest.fixture
def tls_bucket(minio_tls: MinioServer) -> str:
    """A new bucket on the MinIO whose certificate only its private CA (``ca_file``) verifies."""
    name = f"t-{uuid.uuid4().hex[:16]}"
    boto(minio_tls).create_bucket(Bucket=name)
    return name


def blocks(lang: str) -> List[str]:
    """The ```LANG blocks of docs/engines.md, in order."""
    found, current = [], None
    for line in (REPO / "docs" / "engines.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if current is None and line[3:].strip() == lang:
                current = []
            elif current is not None:
                found.append("\n".join(current) + "\n")
                current = None
            continue
        if current is not None:
            current.append(line)
    return found


def as_tested(text: str, minio: MinioServer, bucket: str) -> str:
    return text.replace("http://127.0.0.1:9000", minio.endpoint).replace("mybucket", bucket)


def content(i: int) -> bytes:
    return f"file {i}: {'abc' * (i % 7)}\n".encode() + bytes(range(i % 5))
