"""Azure fixtures: a real Azurite blob service, environments for our tools, containers.

* ``azurite`` (session): the pinned Azurite over http on a free loopback port, one account
  with a key of its own.
* ``azure_env``: an environment reaching it with the connection string (Azure's own way to
  name an endpoint, ``BlobEndpoint``), as the Azure CLI takes it.
* ``azure_container``: a new, empty container for this test, made with azure-storage-blob
  (the reference client: setup and independent checks, never the code under test).
* ``azure_sdk``: that client's ``ContainerClient`` for ``azure_container``.
* ``store_azure``: (env, ``az://ACCOUNT/CONTAINER``), the shape the contract suites take.
* ``azure_proxied``: (the fault proxy in front of Azurite, an environment reaching Azurite
  through it with the account key).
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Iterator

import pytest
from azure.storage.blob import BlobServiceClient

from pegasus_cloudio_testbed.azurite import Azurite
from pegasus_cloudio_testbed.proxy import TcpProxy


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    with Azurite() as server:
        yield server


@pytest.fixture
def azure_env(azurite: Azurite, tmp_path) -> dict:
    return {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull, "AWS_EC2_METADATA_DISABLED": "true",
            "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}


@pytest.fixture
def azure_container(azurite: Azurite) -> str:
    name = f"t-{uuid.uuid4().hex[:16]}"
    BlobServiceClient.from_connection_string(azurite.connection_string).create_container(name)
    return name


@pytest.fixture
def azure_sdk(azurite: Azurite, azure_container: str) -> Iterator[Any]:
    service = BlobServiceClient.from_connection_string(azurite.connection_string)
    with service.get_container_client(azure_container) as client:
        yield client


@pytest.fixture
def store_azure(azure_env: dict, azurite: Azurite, azure_container: str) -> tuple:
    return azure_env, f"az://{azurite.account}/{azure_container}"


@pytest.fixture
def azure_proxied(azurite: Azurite, tmp_path) -> Iterator[tuple]:
    with TcpProxy((azurite.host, azurite.port)) as proxy:
        through = azurite.connection_string.replace(azurite.endpoint, f"{proxy.url()}/{azurite.account}")
        yield proxy, {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
                      "AZURE_STORAGE_CONNECTION_STRING": through}
