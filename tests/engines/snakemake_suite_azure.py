"""snakemake-interface-storage-plugins' own TestStorageBase, unmodified, on Azure: as
snakemake_suite.py, with ``az://`` queries; tests/test_engines_snakemake.py runs it against
Azurite (``SUITE_ROOT`` is ``az://ACCOUNT/CONTAINER``, the connection string in
``AZURE_STORAGE_CONNECTION_STRING``, as Azure's tools take it)."""

import os
import uuid

from snakemake_interface_storage_plugins.tests import TestStorageBase
from snakemake_storage_plugin_pegasus_cloudio import StorageProvider, StorageProviderSettings


class TestPegasusCloudioAzure(TestStorageBase):
    __test__ = True
    retrieve_only = False
    store_only = False
    files_only = False  # directories too
    touch = True

    def get_query(self, tmp_path) -> str:
        return f"{os.environ['SUITE_ROOT']}/suite/{tmp_path.name}/test-file.txt"

    def get_query_not_existing(self, tmp_path) -> str:
        return f"{os.environ['SUITE_ROOT']}/suite/{uuid.uuid4().hex}/absent.txt"

    def get_storage_provider_cls(self):
        return StorageProvider

    def get_storage_provider_settings(self):
        return StorageProviderSettings()


class TestMissingContainer(TestPegasusCloudioAzure):
    """The same suite where the query's container does not exist yet (created on store)."""

    def get_query(self, tmp_path) -> str:
        return f"{os.environ['SUITE_ROOT']}-{uuid.uuid4().hex[:8]}/deep/er/test-file.txt"

    def get_query_not_existing(self, tmp_path) -> str:
        return f"{os.environ['SUITE_ROOT']}-absent-{uuid.uuid4().hex[:8]}/absent.txt"
