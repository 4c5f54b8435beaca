"""pegasus-cloudio: the Pegasus and HTCondor face of the ``transfer`` library.

``pegasus_cloudio.dropin``: ``pegasus-cloudio-transfer``, a drop-in for ``pegasus-transfer``.
``pegasus-cloudio bench ...`` runs ``pegasus_cloudio_bench`` (measurements against the stock tools)
and ``pegasus_cloudio_testbed`` (real servers on loopback for tests and benchmarks): a distribution
of their own, ``bench/`` of the checkout, so the wheel every worker installs does not carry them.
"""
