"""A Parsl staging provider for ``s3://BUCKET/KEY`` files on the transfer engine (``[parsl]``).

::

    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from transfer.integrations.parsl_staging import S3Staging

    config = Config(executors=[HighThroughputExecutor(
        storage_access=[S3Staging(endpoint_url="http://127.0.0.1:9000")])])

An app's ``File("s3://...")`` inputs are downloaded, and its ``outputs=[File("s3://...")]``
uploaded, inside the task, on the worker (no shared file system needed): every input of one
task in ONE engine batch before the app runs, every output in one batch after it (threads,
one warm connection pool, retries; with ``bundles=True`` a task's small outputs to one
directory travel as one bundle object). Parsl hands files to a provider one at a time; the
provider folds them into one wrapper per task instead of wrapping the app once per file.

Credentials are not sent with tasks: the worker finds them as the AWS chain does
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``~/.aws``, ...) in its own environment.
A task's files land under ``local_dir`` (default: the executor's working directory, else the
worker's current directory) as ``BUCKET/KEY``, so equal file names in two prefixes do not meet.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

try:
    from parsl.data_provider.files import File
    from parsl.data_provider.staging import Staging
    from parsl.utils import RepresentationMixin
except ImportError as missing:  # the extra is not installed
    raise ImportError(f"{missing}: pip install 'pegasus-cloudio[parsl]'") from missing

from transfer.client import Client, literal_url
from transfer.context import check_ca_bundle
from transfer.errors import InvalidInput

__all__ = ["S3Staging"]

Pair = Tuple[str, str]


class S3Staging(Staging, RepresentationMixin):
    """Stages ``s3://`` Files in and out of tasks, one engine batch per task and direction."""

    def __init__(self, endpoint_url: Optional[str] = None, region: Optional[str] = None, threads: int = 8,
                 bundles: bool = False, local_dir: Optional[str] = None, ca_bundle: Optional[str] = None) -> None:
        """``ca_bundle``: PEM file of the CAs that verify the endpoint's TLS certificate instead
        of the system's, at this path on every worker too; checked here (ConfigError naming it).
        Raises InvalidInput, naming the argument, for a ``threads`` that is not a whole number
        of at least 1: here, once, rather than in every task when its worker opens a Client."""
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InvalidInput(f"S3Staging threads must be a whole number of at least 1 (got {threads!r})",
                               operation="config")
        if ca_bundle is not None:
            check_ca_bundle(ca_bundle, "S3Staging(ca_bundle)")
        self.endpoint_url = endpoint_url
        self.region = region
        self.threads = threads
        self.bundles = bundles
        self.local_dir = local_dir
        self.ca_bundle = ca_bundle

    def _options(self) -> Dict[str, Any]:
        return {"endpoint": self.endpoint_url, "region": self.region, "threads": self.threads,  # Client's arguments;
                "bundles": self.bundles, "ca_bundle": self.ca_bundle}  # no keys: workers find their own

    def can_stage_in(self, file: File) -> bool:
        return bool(file.scheme == "s3")

    def can_stage_out(self, file: File) -> bool:
        return bool(file.scheme == "s3")

    def _place(self, dm: Any, executor: str, file: File) -> None:
        base = self.local_dir or getattr(dm.dfk.executors[executor], "working_dir", None) or ""
        url = literal_url(file.url)  # the key as it is downloaded: Parsl's parse drops "?..." and "#..."
        if any(part in (".", "..") for part in url.path.split("/")):  # would land outside ``base``
            raise InvalidInput("a key with '.' or '..' components has no local path under the staging directory",
                               url=file.url, operation="stage")
        file.local_path = os.path.join(base, url.host, url.path.lstrip("/"))

    def stage_in(self, dm: Any, executor: str, file: File, parent_fut: Any) -> None:
        self._place(dm, executor, file)
        return None

    def stage_out(self, dm: Any, executor: str, file: File, app_fu: Any) -> None:
        self._place(dm, executor, file)
        return None

    def replace_task(self, dm: Any, executor: str, file: File, func: Callable[..., Any]) -> Callable[..., Any]:
        return StagedTask.around(func, self._options()).adding((file.url, file.local_path), ())

    def replace_task_stage_out(self, dm: Any, executor: str, file: File,
                               func: Callable[..., Any]) -> Callable[..., Any]:
        return StagedTask.around(func, self._options()).adding((), (file.local_path, file.url))


class StagedTask:
    """An app function with its task's downloads before it and uploads after it, one batch
    each. Pickles by reference to this class (workers import it) with plain values only."""

    def __init__(self, func: Callable[..., Any], options: Dict[str, Any], inputs: Tuple[Pair, ...] = (),
                 outputs: Tuple[Pair, ...] = ()) -> None:
        self.func = func
        self.options = options
        self.inputs = inputs
        self.outputs = outputs
        functools.update_wrapper(self, func, updated=())

    @classmethod
    def around(cls, func: Callable[..., Any], options: Dict[str, Any]) -> "StagedTask":
        """``func`` itself when it is already staged with the same options, else a new wrapper."""
        if isinstance(func, StagedTask) and func.options == options:
            return func
        return cls(func, options)

    def adding(self, download: Any, upload: Any) -> "StagedTask":
        inputs = self.inputs + ((download,) if download else ())
        outputs = self.outputs + ((upload,) if upload else ())
        return StagedTask(self.func, self.options, inputs, outputs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs = [(url, os.path.abspath(local)) for url, local in self.inputs]
        outputs = [(os.path.abspath(local), url) for local, url in self.outputs]
        _make_parents([local for _, local in inputs] + [local for local, _ in outputs])
        with Client(**self.options) as client:
            if inputs:
                client.copy(inputs)
            result = self.func(*args, **kwargs)
            if outputs:
                client.copy(outputs)
            return result


def _make_parents(paths: List[str]) -> None:
    for parent in {os.path.dirname(p) for p in paths}:
        if parent:
            os.makedirs(parent, exist_ok=True)
