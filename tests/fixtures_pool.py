"""Fixtures for tests on a real HTCondor pool (see bench/pegasus_cloudio_testbed/condor_pool.py).

``condor_pool`` is one pool for the session: two startds ``node1`` and ``node2`` with two
slots each, on loopback, jobs running as the non-root submitter ``cloudio``. Tests bind their
own directories into it (`CondorPool.bind`, same path inside and out) and add configuration
(`CondorPool.add_config`, then a reconfig); they must leave no job behind. A test that needs
a pool of its own (other startds, settings that cannot change by reconfig) calls
``make_condor_pool(...)`` with `CondorPool`'s arguments; the fixture stops it afterwards.
A pool that cannot start fails the test with HTCondor's log tails, never skips it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, List

import pytest

from installed import build_sdist_and_wheel
from pegasus_cloudio_testbed.condor_pool import CondorPool


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


@pytest.fixture(scope="session")
def our_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Our wheel, built from the sdist as pip builds it (tests/installed.py)."""
    return build_sdist_and_wheel(tmp_path_factory.mktemp("pool-dist"))[1]


def install_in_root(pool: CondorPool, wheel: Path, venv: Path) -> Path:
    """A venv made by the root's ``python3`` at ``venv`` (under ``pool.shared``, readable by
    every user of the pool) with ``wheel`` installed by its own pip (no dependencies: the
    core has none), the way a site installs us on workers; returns its ``bin``."""
    pool.bind(wheel.parent)
    pool.run(["python3", "-m", "venv", str(venv)], user="root")
    pool.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", "--no-deps",
              "--disable-pip-version-check", "--no-cache-dir", str(wheel)], user="root")
    return venv / "bin"


@pytest.fixture(scope="session")
def pool_bin(condor_pool: CondorPool, our_wheel: Path) -> Path:
    """``bin`` of our wheel installed in a venv of the session pool's root (same path inside)."""
    return install_in_root(condor_pool, our_wheel, condor_pool.shared / "venv")
