"""snakemake-interface-storage-plugins' own TestStorageBase, unmodified, subclassed as its docs
tell plugin authors. Not collected by the project's suite: tests/test_engines_snakemake.py copies it into
a venv where the wheel is installed with ``[snakemake]`` and runs it there, once per store:
``SUITE_ROOT`` is where it may write (``s3://BUCKET`` on MinIO, ``az://ACCOUNT/CONTAINER`` on
Azurite). For S3 the endpoint and keys come in ``SUITE_ENDPOINT``, ``SUITE_ACCESS_KEY`` and
``SUITE_SECRET_KEY`` (the plugin's settings); Azure's connection string comes in
``AZURE_STORAGE_CONNECTION_STRING``, as Azure's tools take it (no settings)."""

import os
import uuid

from snakemake_interface_storage_plugins.tests import TestStorageBase
from snakemake_storage_plugin_pegasus_cloudio import StorageProvider, StorageProviderSettings


class TestPegasusCloudioStorage(TestStorageBase):
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
        if "SUITE_ENDPOINT" not in os.environ:
            return StorageProviderSettings()
        return StorageProviderSettings(endpoint_url=os.environ["SUITE_ENDPOINT"],
                                       access_key=os.environ["SUITE_ACCESS_KEY"],
                                       secret_key=os.environ["SUITE_SECRET_KEY"])


class TestMissingBucket(TestPegasusCloudioStorage):
    """The same suite where the query's bucket (container) does not exist yet (created on store)."""

    def get_query(self, tmp_path) -> str:
        return f"{os.environ['SUITE_ROOT']}-{uuid.uuid4().hex[:8]}/deep/er/test-file.txt"

    def get_query_not_existing(self, tmp_path) -> str:
        return f"{os.environ['SUITE_ROOT']}-absent-{uuid.uuid4().hex[:8]}/absent.txt"
