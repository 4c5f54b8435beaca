"""A real fake-gcs-server (pinned, see `tools.ensure_fake_gcs_server`) on loopback over plain HTTP.

Started as ``-scheme http -host 127.0.0.1 -port N -public-host 127.0.0.1:N -backend memory``;
ready once ``GET /storage/v1/b`` answers 200. Point clients at `FakeGcsServer.endpoint`
(``STORAGE_EMULATOR_HOST`` or ``PEGASUS_CLOUDIO_GCS_ENDPOINT``); it accepts any credentials.

What v1.56.1 does, checked against google-cloud-storage 3.17.1 and our backend:

* media downloads: one ``GET /download/storage/v1/b/B/o/K?alt=media``, with
  ``x-goog-hash: crc32c=…,md5=…``, ``x-goog-generation`` and ``x-goog-stored-content-length``;
  ranged reads answer 206 with ``Content-Range`` (``x-goog-hash`` there is the whole object's);
* multipart uploads: a ``crc32c`` in the metadata is verified (400 on mismatch) and the
  answer carries the stored object's ``crc32c``, ``size`` and ``generation``;
* resumable uploads (initiate, chunks, final answer with ``crc32c``), ``rewriteTo``,
  listing with prefixes and pagination, bucket create (409 when it exists).

What it lacks or does differently from GCS:

* **batch requests**: parts without a ``Content-ID`` header are skipped silently, and
  google-cloud-storage's ``client.batch()`` sends none, so that API gets an empty multipart
  answer ("Bad response: not multi-part"). Our backend sends Content-IDs (as Google's batch
  documentation does), which works with both;
* no authentication or authorization at all: any token, or none, is accepted, so 401/403
  paths are tested with the proxy's injected statuses and key handling with a token endpoint
  run by the tests;
* the ``Location`` of a resumable upload names the server's own address (or
  ``external_url``), so behind a proxy the chunks bypass it unless ``external_url`` is the
  proxy's address;
* no per-request-rate limits (429/503 only through the proxy), no object versioning
  semantics beyond generation numbers, no requester-pays or IAM.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from pegasus_cloudio_testbed.process import ServerProcess, answers_ok
from typing import Optional

from .ports import free_port
from .tools import ensure_fake_gcs_server

__all__ = ["FakeGcsServer"]

READY_PATH = "/storage/v1/b"
_PORT_IN_USE = "address already in use"
_PORT_ATTEMPTS = 3
_POLL_S = 0.05


class FakeGcsServer(ServerProcess):
    """A fake-gcs-server process with an in-memory store, deleted on `stop`.

    Use as a context manager or call `start` / `stop`. ``port`` fixes the port (default: a
    free one); ``external_url`` is what resumable uploads are told to send their chunks to
    (default: the server itself).

    Attributes (meaningful once started): ``host`` (``127.0.0.1``), ``port``, ``endpoint``
    (``http://127.0.0.1:PORT``).
    """

    LOG_NAME = "fake-gcs-server.log"

    def __init__(self, *, port: int = 0, external_url: Optional[str] = None,
                 start_timeout: float = 60.0) -> None:
        self.host = "127.0.0.1"
        self.port = port
        self.external_url = external_url
        self.start_timeout = start_timeout
        self._fixed_port = bool(port)
        super().__init__()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "FakeGcsServer":
        """Start the server and wait until it answers; RuntimeError (with the log tail) if not."""
        binary = ensure_fake_gcs_server()
        self._make_tmp("pegasus-cloudio-fakegcs-")
        try:
            self._launch(binary)
        except BaseException:
            self.stop()
            raise
        return self

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` through the JSON API (a test-setup helper, not the code under test)."""
        request = urllib.request.Request(f"{self.endpoint}/storage/v1/b?project=test", method="POST",
                                         data=json.dumps({"name": name}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            if response.status != 200:
                raise RuntimeError(f"creating bucket {name}: HTTP {response.status}")

    def _launch(self, binary: Path) -> None:
        deadline = time.monotonic() + self.start_timeout
        for _ in range(_PORT_ATTEMPTS):
            self._spawn(binary)
            if self._wait_ready(deadline):
                return
            if self._fixed_port or _PORT_IN_USE not in self.log_tail():
                break
            self._discard_process()
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"fake-gcs-server did not become ready at {self.endpoint}{READY_PATH} "
                           f"within {self.start_timeout:.0f} s; log tail:\n{tail}")

    def _spawn(self, binary: Path) -> None:
        if not self._fixed_port:
            self.port = free_port()
        cmd = [str(binary), "-scheme", "http", "-host", self.host, "-port", str(self.port),
               "-public-host", f"{self.host}:{self.port}", "-backend", "memory",
               "-log-level", "warn"]
        if self.external_url:
            cmd += ["-external-url", self.external_url]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "STORAGE_EMULATOR"))}
        self._spawn_logged(cmd, env)

    def _wait_ready(self, deadline: float) -> bool:
        return self._wait_until(deadline, lambda: answers_ok(self.endpoint + READY_PATH), _POLL_S)




