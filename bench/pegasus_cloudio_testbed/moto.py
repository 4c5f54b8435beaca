"""moto's S3 in server mode on loopback: a second, independent S3 implementation.

MinIO is a real store written in Go; moto is Amazon's API re-implemented in Python from the
service models, with Amazon's key rules (``//``, ``..``, 1,024-byte keys are all legal there)
and SigV4 checking. Together they keep our client from fitting one server's quirks.
"""

from __future__ import annotations

import json
import os
import sys
import time

from .ports import free_port
from .process import ServerProcess, answers_ok

__all__ = ["MotoServer"]

_READY = "/moto-api/"


class MotoServer(ServerProcess):
    """``with MotoServer() as s3:``; ``endpoint`` is ``http://127.0.0.1:PORT``.

    Requests are authenticated: moto starts with IAM enforcement after its first three
    (unauthenticated) calls, which create an IAM user, an allow-all policy and the access key
    ``access_key``/``secret_key``. A wrong signature then fails with SignatureDoesNotMatch.
    """

    LOG_NAME = "moto.log"

    def __init__(self, *, start_timeout: float = 60.0) -> None:
        self.host = "127.0.0.1"
        self.port = 0
        self.access_key = ""
        self.secret_key = ""
        self.start_timeout = start_timeout
        super().__init__()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "MotoServer":
        self._make_tmp("pegasus-cloudio-moto-")
        self.port = free_port()
        env = dict(os.environ, MOTO_S3_CUSTOM_ENDPOINTS=self.endpoint, INITIAL_NO_AUTH_ACTION_COUNT="3")
        self._spawn_logged([sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)], env)
        deadline = time.monotonic() + self.start_timeout
        if not self._wait_until(deadline, lambda: answers_ok(self.endpoint + _READY), 0.1):
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"moto did not answer at {self.endpoint}{_READY}; log tail:\n{tail}")
        try:
            self._make_identity()
        except BaseException:
            self.stop()
            raise
        return self

    def _make_identity(self) -> None:
        import boto3  # type: ignore[import-untyped]  # test bed only; never imported by the library

        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name="us-east-1",
                           aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        iam.create_user(UserName="tester")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="tester", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="tester")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]

    def write_pegasus_credentials(self, path: "os.PathLike[str]", *, site: str = "moto",
                                  user: str = "test") -> None:
        """A Pegasus credentials file (mode 0600) naming this server as ``SITE``."""
        text = (f"[{site}]\nendpoint = {self.endpoint}\nregion = us-east-1\n"
                f"[{user}@{site}]\naccess_key = {self.access_key}\nsecret_key = {self.secret_key}\n")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
