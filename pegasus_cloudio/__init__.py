"""pegasus-cloudio: the Pegasus and HTCondor face of the ``transfer`` library.

``pegasus_cloudio.dropin``: ``pegasus-cloudio-transfer``, a drop-in for ``pegasus-transfer``.
``pegasus_cloudio.bench``: ``pegasus-cloudio bench ...``, measurements against the stock tools.
``pegasus_cloudio.testbed``: real servers (MinIO, proxies) started on loopback for tests and benchmarks.
"""
