"""The drop-in's commands as a wheel installs them, built once per session from this checkout
(:func:`pegasus_cloudio_testbed.wheel.installed_bin`): ``pegasus-cloudio-transfer``, the
native front end (``native/pegasus_cloudio_transfer.c``), and the Python drop-in it execs,
``pegasus-cloudio-transfer-py``."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

from pegasus_cloudio_testbed.wheel import installed_bin


@pytest.fixture(scope="session")
def dropin_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(installed_bin(str(tmp_path_factory.mktemp("dropin-wheel"))))


@pytest.fixture(scope="session")
def native_dropin(dropin_bin: Path) -> List[str]:
    """The command jobs run: the native front end."""
    return [str(dropin_bin / "pegasus-cloudio-transfer")]


@pytest.fixture(scope="session")
def python_dropin(dropin_bin: Path) -> List[str]:
    """The Python drop-in (what the command was before the native front end)."""
    return [str(dropin_bin / "pegasus-cloudio-transfer-py")]
