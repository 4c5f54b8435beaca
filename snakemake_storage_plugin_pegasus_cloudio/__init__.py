"""Snakemake's name for the ``pegasus-cloudio`` storage plugin: Snakemake's plugin registry
imports every top-level package named ``snakemake_storage_plugin_*``. The plugin lives in
:mod:`transfer.integrations.snakemake_storage` (install ``pegasus-cloudio[snakemake]``)."""

from transfer.integrations.snakemake_storage import StorageObject, StorageProvider, StorageProviderSettings

__all__ = ["StorageObject", "StorageProvider", "StorageProviderSettings"]
