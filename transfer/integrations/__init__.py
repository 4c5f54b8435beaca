"""Where other workflow engines meet the library: a Snakemake storage plugin
(:mod:`transfer.integrations.snakemake_storage`, discovered through the top-level package
``snakemake_storage_plugin_pegasus_cloudio``) and a Parsl staging provider
(:mod:`transfer.integrations.parsl_staging`). Each needs its extra (``[snakemake]``,
``[parsl]``); nothing here is imported by ``import transfer``. See ``docs/engines.md``.
"""
