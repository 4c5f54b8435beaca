"""Fixtures for the ssh tests: one real OpenSSH sshd per session, a fresh remote dir per test.

``ssh_env`` and ``ssh_base`` are also used by other test modules (site catalogs) by name.
"""

from __future__ import annotations

import os
import uuid
from typing import Dict, Iterator, Tuple

import pytest

from pegasus_cloudio_testbed.relay import RawRelay
from pegasus_cloudio_testbed.sshd import SshServer


@pytest.fixture(scope="session")
def ssh_server() -> Iterator[SshServer]:
    """A started sshd on 127.0.0.1 with per-run keys; ``client_key`` logs in as ``user``."""
    with SshServer() as server:
        yield server


@pytest.fixture
def ssh_env(ssh_server: SshServer, tmp_path) -> Dict[str, str]:
    """Environment for our tools: the client key as SSH_PRIVATE_KEY, no config file."""
    return {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
            "SSH_PRIVATE_KEY": str(ssh_server.client_key)}


@pytest.fixture
def ssh_remote_dir(ssh_server: SshServer) -> str:
    """A new, empty directory on the server (an absolute path) for this test."""
    path = ssh_server.root / f"t-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    return str(path)


@pytest.fixture
def ssh_base(ssh_server: SshServer, ssh_remote_dir: str) -> str:
    """``scp://USER@127.0.0.1:PORT/abs/dir``: base URL of this test's remote directory."""
    return f"scp://{ssh_server.user}@{ssh_server.host}:{ssh_server.port}{ssh_remote_dir}"


@pytest.fixture
def store_sftp(ssh_env: Dict[str, str], ssh_base: str) -> Tuple[Dict[str, str], str]:
    """(env, base URL) for tests/test_backend_contract.py."""
    return ssh_env, ssh_base


@pytest.fixture
def ssh_relay(ssh_server: SshServer) -> Iterator[RawRelay]:
    """A counting byte relay in front of sshd (connections = SSH handshakes); can drop them."""
    with RawRelay((ssh_server.host, ssh_server.port)) as relay:
        yield relay


@pytest.fixture
def ssh_relay_base(ssh_server: SshServer, ssh_relay: RawRelay, ssh_remote_dir: str) -> str:
    """This test's remote directory as a URL that goes through ``ssh_relay``."""
    return f"scp://{ssh_server.user}@{ssh_relay.host}:{ssh_relay.port}{ssh_remote_dir}"
