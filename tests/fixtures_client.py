"""The plain library API's fixtures (a conftest plugin): a ``Client`` on MinIO and a
fresh bucket, and local files to copy."""

from __future__ import annotations

import os
import uuid

import pytest

from transfer.client import Client


@pytest.fixture
def client(minio):
    with Client(endpoint=minio.endpoint, access_key=minio.access_key, secret_key=minio.secret_key,
                env={}) as made:
        yield made


@pytest.fixture
def where(client) -> str:
    name = f"c-{uuid.uuid4().hex[:12]}"
    client.mkdir(f"s3://{name}")
    return f"s3://{name}"


def files(directory, count: int, size: int = 300) -> list:
    """``count`` files of ``size`` random bytes in ``directory`` (made as needed); their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = directory / f"f{i:03d}.dat"
        path.write_bytes(os.urandom(size))
        paths.append(path)
    return paths
