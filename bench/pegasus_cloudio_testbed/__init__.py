"""Test bed: real servers and tools (MinIO, s5cmd, a fault-injecting TCP proxy,
the stock Pegasus worker tools) started on loopback for tests and benchmarks.

Nothing here is imported by the library; each module is imported explicitly.
"""
