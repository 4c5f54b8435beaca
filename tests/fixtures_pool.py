"""Fixtures for tests on a real HTCondor pool (see pegasus_cloudio/testbed/condor_pool.py).

``condor_pool`` is one pool for the session: two startds ``node1`` and ``node2`` with two
slots each, on loopback, jobs running as the non-root submitter ``cloudio``. Tests bind their
own directories into it (`CondorPool.bind`, same path inside and out) and add configuration
(`CondorPool.add_config`, then a reconfig); they must leave no job behind. A test that needs
a pool of its own (other startds, settings that cannot change by reconfig) calls
``make_condor_pool(...)`` with `CondorPool`'s arguments; the fixture stops it afterwards.
A pool that cannot start fails the test with HTCondor's log tails, never skips it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List

import pytest

from pegasus_cloudio.testbed.condor_pool import CondorPool


@pytest.fixture(scope="session")
def condor_pool() -> Iterator[CondorPool]:
    with CondorPool() as pool:
        yield pool


@pytest.fixture
def make_condor_pool() -> Iterator[Callable[..., CondorPool]]:
    pools: List[CondorPool] = []

    def make(**kwargs: Any) -> CondorPool:
        pool = CondorPool(**kwargs)
        pools.append(pool)
        return pool.start()

    yield make
    for pool in pools:
        pool.stop()
