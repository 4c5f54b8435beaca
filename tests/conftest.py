"""Shared pytest fixtures.

Servers are real processes on loopback, started once per session from
`pegasus_cloudio_testbed`; a server that cannot start fails the tests that
need it (no silent skipping). Session-scoped servers are shared, so tests
must use their own bucket names.
"""

from __future__ import annotations

import os
import uuid
from typing import Iterator

import boto3
import pytest

from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.moto import MotoServer
from pegasus_cloudio_testbed.proxy import TcpProxy

# Fixtures of other server kinds live in their own plugin modules beside this file.
pytest_plugins = ["fixtures_gcs", "fixtures_azure", "fixtures_ssh", "fixtures_condor", "fixtures_pool", "fixtures_native", "fixtures_client"]

# --------------------------------------------------------------------------- environment


@pytest.fixture(scope="session", autouse=True)
def no_inherited_proxies() -> Iterator[None]:
    """The test servers listen on loopback: proxy settings of the shell that runs the tests
    would send their S3 requests (botocore's rules, which ours follow) and HTTP requests to a
    proxy that cannot reach them. A test that wants a proxy names it in the environment it passes."""
    saved = {name: os.environ.pop(name) for name in list(os.environ)
             if name.lower().endswith("_proxy") or name == "OSG_SQUID_LOCATION"}
    yield
    os.environ.update(saved)


# --------------------------------------------------------------------------- servers


@pytest.fixture(scope="session")
def minio() -> Iterator[MinioServer]:
    """A started MinIO server over http (built on first use, ~4 min)."""
    with MinioServer() as server:
        yield server


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    """moto's S3 in server mode (signatures checked): the second, independent S3 server."""
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="session")
def minio_tls() -> Iterator[MinioServer]:
    """A started MinIO server over https; verify it against ``minio_tls.ca_file``."""
    with MinioServer(tls=True) as server:
        yield server


# --------------------------------------------------------------------------- S3 clients


@pytest.fixture
def s3_env(minio: MinioServer, tmp_path) -> dict:
    """An environment whose Pegasus credentials name MinIO as site ``minio``, user ``test``."""
    creds = minio.write_pegasus_credentials(tmp_path / "credentials.conf", site="minio", user="test")
    return {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture
def bucket(minio: MinioServer) -> str:
    """A new, empty bucket for this test."""
    name = f"t-{uuid.uuid4().hex[:16]}"
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def proxied(minio: MinioServer, tmp_path) -> Iterator[tuple]:
    """(proxy, env): a fault-injecting proxy in front of MinIO and credentials pointing at it."""
    with TcpProxy((minio.host, minio.port)) as proxy:
        creds = minio.write_pegasus_credentials(tmp_path / "proxied.conf", site="minio", user="test",
                                                endpoint=proxy.url())
        yield proxy, {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path),
                      "PEGASUS_CLOUDIO_CONFIG": os.devnull}


# --------------------------------------------------------------------------- contract stores
# Every backend kind provides ``store_<kind>`` -> (env, base URL) for tests/test_backend_contract.py.


@pytest.fixture
def store_local(tmp_path) -> tuple:
    return {"HOME": str(tmp_path)}, f"file://{tmp_path}/store"


@pytest.fixture
def store_s3(s3_env: dict, bucket: str) -> tuple:
    return s3_env, f"s3://test@minio/{bucket}"


@pytest.fixture
def store_s3moto(moto: MotoServer, tmp_path) -> tuple:
    creds = tmp_path / "moto-credentials.conf"
    moto.write_pegasus_credentials(creds, site="moto", user="test")
    name = f"t-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=moto.endpoint, aws_access_key_id=moto.access_key,
                 aws_secret_access_key=moto.secret_key, region_name="us-east-1").create_bucket(Bucket=name)
    env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
           "AWS_EC2_METADATA_DISABLED": "true"}
    return env, f"s3://test@moto/{name}"
