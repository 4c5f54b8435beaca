"""GCS fixtures: a real fake-gcs-server, environments for our tools, buckets, and a token endpoint.

* ``gcs_server`` (session): the pinned fake-gcs-server over http on a free loopback port.
* ``gcs_env``: an environment for our library and tools reaching it anonymously through the
  standard ``STORAGE_EMULATOR_HOST`` (merge it with ``s3_env`` for two-hop tests).
* ``gcs_bucket``: a new, empty bucket for this test (created through the emulator's API).
* ``store_gcs``: (env, ``gs://<bucket>``) for tests/test_backend_contract.py.
* ``gcs_proxied``: (proxy, env) with a counting, fault-injecting ``TcpProxy`` in between.
* ``gcs_key``: a JSON service-account key (mode 0600) whose ``token_uri`` is a token
  endpoint run here; ``gcs_key.grants`` lists the verified JWT claims it received.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import urllib.parse
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, List

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from pegasus_cloudio_testbed.fakegcs import FakeGcsServer
from pegasus_cloudio_testbed.proxy import TcpProxy

ACCESS_TOKEN = "pegasus-cloudio-test-token"


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[FakeGcsServer]:
    with FakeGcsServer() as server:
        yield server


@pytest.fixture
def gcs_env(gcs_server: FakeGcsServer, tmp_path) -> dict:
    return {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
            "STORAGE_EMULATOR_HOST": gcs_server.endpoint}


@pytest.fixture
def gcs_bucket(gcs_server: FakeGcsServer) -> str:
    name = f"t-{uuid.uuid4().hex[:16]}"
    gcs_server.create_bucket(name)
    return name


@pytest.fixture
def store_gcs(gcs_env: dict, gcs_bucket: str) -> tuple:
    return gcs_env, f"gs://{gcs_bucket}"


@pytest.fixture
def gcs_proxied(gcs_server: FakeGcsServer, tmp_path) -> Iterator[tuple]:
    with TcpProxy((gcs_server.host, gcs_server.port)) as proxy:
        yield proxy, {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
                      "STORAGE_EMULATOR_HOST": proxy.url()}


# --------------------------------------------------------------------------- service-account key


@dataclass
class ServiceAccountKey:
    path: Path
    client_email: str
    token_uri: str
    grants: List[Dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def gcs_key(tmp_path) -> Iterator[ServiceAccountKey]:
    with service_account_key(tmp_path / "sa-key.json") as key:
        yield key


@contextlib.contextmanager
def service_account_key(path: Path) -> Iterator[ServiceAccountKey]:
    """A key written to ``path`` (mode 0600) and its token endpoint, served until the block ends."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = private.public_key()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _TokenHandler)
    key = ServiceAccountKey(path, "stager@test-project.iam.gserviceaccount.com",
                            f"http://127.0.0.1:{server.server_address[1]}/token")
    # google-auth addresses the grant to Google's token endpoint whatever token_uri says.
    server.verify = lambda assertion: jwt.decode(  # type: ignore[attr-defined]
        assertion, public, algorithms=["RS256"], audience="https://oauth2.googleapis.com/token")
    server.grants = key.grants  # type: ignore[attr-defined]
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    fd = os.open(key.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"type": "service_account", "project_id": "test-project", "private_key_id": "k1",
                   "private_key": pem, "client_email": key.client_email, "client_id": "1",
                   "token_uri": key.token_uri}, fh)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield key
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class _TokenHandler(BaseHTTPRequestHandler):
    """OAuth2 JWT-bearer grant: verify the assertion's signature, answer with a fixed token."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers.get("Content-Length", "0"))
        form = urllib.parse.parse_qs(self.rfile.read(length).decode())
        try:
            claims = self.server.verify(form["assertion"][0])  # type: ignore[attr-defined]
        except (KeyError, jwt.InvalidTokenError):
            self._answer(400, {"error": "invalid_grant"})
            return
        self.server.grants.append(claims)  # type: ignore[attr-defined]
        self._answer(200, {"access_token": ACCESS_TOKEN, "expires_in": 3600, "token_type": "Bearer"})

    def _answer(self, status: int, payload: Dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
        pass
