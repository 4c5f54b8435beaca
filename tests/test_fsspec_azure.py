"""fsspec's own abstract test suite, unmodified, on Azure: the ``cloudio`` filesystem with
``scheme="az"`` against a real Azurite, the same fixture classes tests/test_fsspec.py runs on
MinIO (paths are ``ACCOUNT/CONTAINER/...``; the container is made with azure-storage-blob)."""

from __future__ import annotations

import os
import uuid

import fsspec
import pytest
from azure.core.exceptions import ResourceExistsError
from azure.storage.blob import BlobServiceClient
from fsspec.tests.abstract import AbstractFixtures
from fsspec.tests.abstract.copy import AbstractCopyTests
from fsspec.tests.abstract.get import AbstractGetTests
from fsspec.tests.abstract.put import AbstractPutTests

try:  # newer fsspec releases add these suites; run every one the pinned release ships
    from fsspec.tests.abstract.open import AbstractOpenTests
except ImportError:  # pragma: no cover - depends on the pinned fsspec
    AbstractOpenTests = None
try:
    from fsspec.tests.abstract.pipe import AbstractPipeTests
except ImportError:  # pragma: no cover
    AbstractPipeTests = None


class AzureFixtures(AbstractFixtures):
    container = f"fsspec-{uuid.uuid4().hex[:12]}"

    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, azurite, tmp_path_factory):
        try:  # one container for all the classes, as the MinIO classes share one bucket
            BlobServiceClient.from_connection_string(azurite.connection_string).create_container(cls.container)
        except ResourceExistsError:
            pass
        env = {"HOME": str(tmp_path_factory.mktemp("home")), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
               "AWS_EC2_METADATA_DISABLED": "true", "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
        return fsspec.filesystem("cloudio", scheme="az", env=env, skip_instance_cache=True)

    @pytest.fixture
    def fs_join(self):
        return lambda *parts: "/".join(parts)

    @pytest.fixture
    def fs_path(self, azurite):
        return f"{azurite.account}/{self.container}"

    @pytest.fixture
    def supports_empty_directories(self):
        return False


class TestAzureCopy(AbstractCopyTests, AzureFixtures):
    pass


class TestAzureGet(AbstractGetTests, AzureFixtures):
    pass


class TestAzurePut(AbstractPutTests, AzureFixtures):
    pass


if AbstractOpenTests is not None:
    class TestAzureOpen(AbstractOpenTests, AzureFixtures):
        pass

if AbstractPipeTests is not None:
    class TestAzurePipe(AbstractPipeTests, AzureFixtures):
        pass
