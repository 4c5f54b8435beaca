"""snakemake-interface-storage-plugins' own TestStorageBase, unmodified, subclassed as its docs
tell plugin authors. Not collected by the project's suite: tests/test_engines_snakemake.py copies it into
a venv where the wheel is installed with ``[snakemake]`` and runs it there against MinIO
(``SUITE_ENDPOINT``, ``SUITE_BUCKET``, keys in ``SUITE_ACCESS_KEY``/``SUITE_SECRET_KEY``)."""

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
        return f"s3://{os.environ['SUITE_BUCKET']}/suite/{tmp_path.name}/test-file.txt"

    def get_query_not_existing(self, tmp_path) -> str:
        return f"s3://{os.environ['SUITE_BUCKET']}/suite/{uuid.uuid4().hex}/absent.txt"

    def get_storage_provider_cls(self):
        return StorageProvider

    def get_storage_provider_settings(self):
        return StorageProviderSettings(endpoint_url=os.environ["SUITE_ENDPOINT"],
                                       access_key=os.environ["SUITE_ACCESS_KEY"],
                                       secret_key=os.environ["SUITE_SECRET_KEY"])


class TestMissingBucket(TestPegasusCloudioStorage):
    """The same suite where the query's bucket does not exist yet (created on store)."""

    def get_query(self, tmp_path) -> str:
        return f"s3://{os.environ['SUITE_BUCKET']}-{uuid.uuid4().hex[:8]}/deep/er/test-file.txt"

    def get_query_not_existing(self, tmp_path) -> str:
        return f"s3://absent-{uuid.uuid4().hex}/absent.txt"
