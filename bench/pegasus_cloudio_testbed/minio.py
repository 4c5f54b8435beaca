"""A real MinIO server on loopback, one per `MinioServer` instance.

Readiness: MinIO's ``/minio/health/live`` (and ``/ready``) answer 200 as soon
as the HTTP listener is up, before the object layer, bucket metadata and IAM
are initialised (requests then fail with 503 "Server not initialized", or
signature errors). `MinioServer.start` therefore waits for
``/minio/health/cluster``, which answers 503 until all three are ready.
"""

from __future__ import annotations

import os
import secrets
import shutil
import ssl
import time
from pathlib import Path
from pegasus_cloudio_testbed.process import ServerProcess, answers_ok
from typing import Dict, Optional, Union

from .certs import make_tls_files
from .ports import free_port
from .tools import ensure_minio

__all__ = ["MinioServer"]

READY_PATH = "/minio/health/cluster"
_PORT_IN_USE = "port is already in use"
_PORT_ATTEMPTS = 3
_POLL_S = 0.05

PathLike = Union[str, "os.PathLike[str]"]


class MinioServer(ServerProcess):
    """A single-drive MinIO server with random root credentials.

    Use as a context manager (``with MinioServer() as s3:``) or call
    `start` / `stop`. The server's data, certificates and log live in a
    private temp dir that `stop` deletes.

    Attributes (``port`` and ``endpoint`` are meaningful once started):
        host: always ``127.0.0.1``.
        port: the S3 API port.
        endpoint: ``http://127.0.0.1:PORT`` or ``https://127.0.0.1:PORT``.
        access_key, secret_key: root credentials (MINIO_ROOT_USER/PASSWORD).
        ca_file: CA certificate to verify the server with (None over http;
            the file lives in the temp dir, so it is gone after `stop`).
        tls: whether the server speaks https.
    """

    LOG_NAME = "minio.log"

    def __init__(
        self,
        *,
        tls: bool = False,
        binary: Optional[PathLike] = None,
        start_timeout: float = 60.0,
        base_dir: Optional[PathLike] = None,
        domain: Optional[str] = None,
    ) -> None:
        """Configure a server; nothing starts until `start`.

        ``domain`` (MINIO_DOMAIN) makes MinIO route virtual-hosted requests
        (``Host: BUCKET.domain``); with ``tls`` the certificate then also
        covers ``domain`` and ``*.domain``.

        ``binary`` defaults to the pinned build from `ensure_minio`;
        ``base_dir`` is where the temp dir is made (default: system temp).
        """
        self.tls = tls
        self.host = "127.0.0.1"
        self.port = 0
        self.console_port = 0
        self.access_key = f"minio-{secrets.token_hex(6)}"
        self.secret_key = secrets.token_hex(20)
        self.ca_file: Optional[Path] = None
        self.start_timeout = start_timeout
        self._binary = Path(binary) if binary is not None else None
        self._base_dir = base_dir
        self.domain = domain
        super().__init__()

    @property
    def data_dir(self) -> Path:
        """The drive MinIO keeps its objects on (a benchmark's progress line watches it grow);
        the server must have been started."""
        assert self._tmp is not None, "MinIO was not started"
        return self._tmp / "data"

    @property
    def endpoint(self) -> str:
        """Base URL of the S3 API."""
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def start(self) -> "MinioServer":
        """Start the server and wait until it serves S3 requests.

        Builds MinIO first if needed (see `ensure_minio`). Raises RuntimeError
        with the tail of the server log if it exits or is not ready within
        ``start_timeout`` seconds; the server is stopped in that case.
        """
        binary = self._binary or ensure_minio()
        self._make_tmp("pegasus-cloudio-minio-", self._base_dir)
        try:
            certs_dir = self._prepare_certs()
            self._launch(binary, certs_dir)
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self) -> "MinioServer":
        """Kill the server process and start it again on the same data, as after a crash or a
        reboot of the store (new ports: read :attr:`endpoint` again)."""
        binary = self._binary or ensure_minio()
        self._discard_process()
        assert self._tmp is not None
        self._launch(binary, self._tmp / "certs")  # the certificates made by start()
        return self

    def write_pegasus_credentials(
        self,
        path: PathLike,
        *,
        site: str = "minio",
        user: str = "test",
        endpoint: Optional[str] = None,
    ) -> Path:
        """Write a Pegasus credentials file (INI, mode 0600) for this server.

        URLs ``s3://USER@SITE/bucket/key`` then resolve to this server. ``site``
        must be lower case (pegasus-s3 lowercases it). ``endpoint`` overrides
        the server's own, e.g. to go through a `TcpProxy`. Returns the path.
        """
        text = (
            f"[{site}]\n"
            f"endpoint = {endpoint or self.endpoint}\n"
            f"[{user}@{site}]\n"
            f"access_key = {self.access_key}\n"
            f"secret_key = {self.secret_key}\n"
        )
        target = Path(path)
        _write_private(target, text.encode())
        return target

    def _prepare_certs(self) -> Path:
        """Always pass --certs-dir, so ~/.minio/certs is never read."""
        assert self._tmp is not None
        certs_dir = self._tmp / "certs"
        (certs_dir / "CAs").mkdir(parents=True)
        if self.tls:
            names = [self.domain, f"*.{self.domain}"] if self.domain else []
            files = make_tls_files(self._tmp / "tls", names)
            shutil.copyfile(files.cert, certs_dir / "public.crt")
            _write_private(certs_dir / "private.key", files.key.read_bytes())
            shutil.copyfile(files.ca_cert, certs_dir / "CAs" / "ca.crt")
            self.ca_file = files.ca_cert
        return certs_dir

    def _launch(self, binary: Path, certs_dir: Path) -> None:
        """Spawn MinIO, retrying with new ports if a probed port was taken."""
        deadline = time.monotonic() + self.start_timeout
        for _ in range(_PORT_ATTEMPTS):
            self._spawn(binary, certs_dir)
            if self._wait_ready(deadline):
                return
            if _PORT_IN_USE not in self.log_tail():
                break
            self._discard_process()
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(
            f"MinIO did not become ready at {self.endpoint}{READY_PATH} "
            f"within {self.start_timeout:.0f} s; log tail:\n{tail}"
        )

    def _spawn(self, binary: Path, certs_dir: Path) -> None:
        assert self._tmp is not None
        self.port = free_port()
        self.console_port = free_port()
        cmd = [
            str(binary), "server", str(self._tmp / "data"),
            "--address", f"{self.host}:{self.port}",
            "--console-address", f"{self.host}:{self.console_port}",
            "--certs-dir", str(certs_dir),
        ]
        self._spawn_logged(cmd, self._environment())

    def _environment(self) -> Dict[str, str]:
        """The parent environment without MINIO_* settings, plus ours."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("MINIO_")}
        env.update(
            MINIO_ROOT_USER=self.access_key,
            MINIO_ROOT_PASSWORD=self.secret_key,
            MINIO_BROWSER="off",
            MINIO_UPDATE="off",
            MINIO_PROMETHEUS_AUTH_TYPE="public",
        )
        if self.domain:
            env["MINIO_DOMAIN"] = self.domain
        return env

    def _wait_ready(self, deadline: float) -> bool:
        """Poll the readiness path; False if the process exits or time runs out."""
        context = ssl.create_default_context(cafile=str(self.ca_file)) if self.tls else None
        url = self.endpoint + READY_PATH
        return self._wait_until(deadline, lambda: answers_ok(url, context), _POLL_S)





def _write_private(path: Path, data: bytes) -> None:
    """Atomically write ``data`` to ``path`` with mode 0600."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode is filtered by the umask
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
