"""The plain library API's fixtures (a conftest plugin): a ``Client`` on MinIO and a
fresh bucket."""

from __future__ import annotations

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
