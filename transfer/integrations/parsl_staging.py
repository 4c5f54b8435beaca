"""Parsl staging providers for ``s3://BUCKET/KEY`` (:class:`S3Staging`) and
``az://ACCOUNT/CONTAINER/BLOB`` (:class:`AzureStaging`) files on the transfer engine (``[parsl]``).

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

Credentials: ``key``/``secret``/``token`` (named as s3fs names them) when given, which then
travel with every task to its worker (as its other arguments do: over the executor's own
channel); else the worker finds them as the AWS chain does (``AWS_ACCESS_KEY_ID``/
``AWS_SECRET_ACCESS_KEY``, ``~/.aws``, ...) in its own environment. Each worker process keeps
one :class:`~transfer.client.Client` per configuration for all its tasks (one warm pool, one
engine; closed when the process exits), instead of one per task. :class:`AzureStaging` stages
``az://`` Files the same way; its worker finds the account's credentials in its own environment
(docs/azure.md: a connection string, an account key, a SAS, a managed or workload identity),
which never travel with the task. A task's files land under ``local_dir`` (default: the executor's working directory, else the
worker's current directory) as ``BUCKET/KEY``, so equal file names in two prefixes do not meet.
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
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

__all__ = ["AzureStaging", "S3Staging"]

Pair = Tuple[str, str]


class S3Staging(Staging, RepresentationMixin):
    """Stages ``s3://`` Files in and out of tasks, one engine batch per task and direction."""

    SCHEME = "s3"

    def __init__(self, endpoint_url: Optional[str] = None, region: Optional[str] = None, threads: int = 8,
                 bundles: bool = False, local_dir: Optional[str] = None, ca_bundle: Optional[str] = None,
                 key: Optional[str] = None, secret: Optional[str] = None, token: Optional[str] = None) -> None:
        """``ca_bundle``: PEM file of the CAs that verify the endpoint's TLS certificate instead
        of the system's, at this path on every worker too; checked here (ConfigError naming it).
        ``key`` and ``secret`` go together (``token`` for temporary keys). Raises InvalidInput,
        naming the argument, for a ``threads`` that is not a whole number of at least 1, or a
        key without its secret: here, once, rather than in every task when its worker opens a
        Client."""
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InvalidInput(f"{type(self).__name__} threads must be a whole number of at least 1 "
                               f"(got {threads!r})", operation="config")
        if (key is None) != (secret is None):
            raise InvalidInput("S3Staging key and secret must be given together", operation="config")
        if ca_bundle is not None:
            check_ca_bundle(ca_bundle, f"{type(self).__name__}(ca_bundle)")
        self.key = key
        self.secret = secret
        self.token = token
        self.endpoint_url = endpoint_url
        self.region = region
        self.threads = threads
        self.bundles = bundles
        self.local_dir = local_dir
        self.ca_bundle = ca_bundle

    def _options(self) -> Dict[str, Any]:
        return {"endpoint_url": self.endpoint_url, "region": self.region, "threads": self.threads,  # Client's
                "bundles": self.bundles, "ca_bundle": self.ca_bundle, "key": self.key,  # arguments
                "secret": self.secret, "token": self.token}

    def __repr__(self) -> str:  # RepresentationMixin's would show the secret in Parsl's logs
        return (f"S3Staging(endpoint_url={self.endpoint_url!r}, region={self.region!r}, threads={self.threads}, "
                f"bundles={self.bundles}, local_dir={self.local_dir!r}, ca_bundle={self.ca_bundle!r}, "
                f"key={'...' if self.key else None})")

    def can_stage_in(self, file: File) -> bool:
        return bool(file.scheme == self.SCHEME)

    def can_stage_out(self, file: File) -> bool:
        return bool(file.scheme == self.SCHEME)

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


class AzureStaging(S3Staging):
    """Stages ``az://ACCOUNT/CONTAINER/BLOB`` Files as :class:`S3Staging` does ``s3://`` ones; a
    File lands under ``local_dir`` as ``ACCOUNT/CONTAINER/BLOB``. Credentials and endpoint: the
    worker's environment (docs/azure.md), none of them an argument."""

    SCHEME = "az"

    def __init__(self, threads: int = 8, bundles: bool = False, local_dir: Optional[str] = None,
                 ca_bundle: Optional[str] = None) -> None:
        """As :class:`S3Staging`'s, without its S3 endpoint and keys."""
        super().__init__(threads=threads, bundles=bundles, local_dir=local_dir, ca_bundle=ca_bundle)

    def __repr__(self) -> str:
        return (f"AzureStaging(threads={self.threads}, bundles={self.bundles}, local_dir={self.local_dir!r}, "
                f"ca_bundle={self.ca_bundle!r})")


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
        client = worker_client(self.options)
        if inputs:
            client.copy(inputs)
        result = self.func(*args, **kwargs)
        if outputs:
            client.copy(outputs)
        return result

    def __repr__(self) -> str:  # never the options: they may hold a secret
        return f"StagedTask({getattr(self.func, '__name__', self.func)!r}, {len(self.inputs)} in, {len(self.outputs)} out)"


_CLIENTS: Dict[Tuple[Tuple[str, Any], ...], Tuple[int, Client]] = {}  # options -> (pid, Client)
_CLIENTS_LOCK = threading.Lock()


def worker_client(options: Dict[str, Any]) -> Client:
    """The Client of this worker process for ``options``, made on its first task. Process-wide
    on purpose: Parsl gives a staging wrapper nothing that outlives one task, and a Client per
    task paid a new pool (connections, TLS handshakes) and engine each time. Thread-safe (a
    ThreadPoolExecutor's tasks share it); a forked child makes its own; closed at exit."""
    key = tuple(sorted(options.items()))
    with _CLIENTS_LOCK:
        held = _CLIENTS.get(key)
        if held is None or held[0] != os.getpid():
            if not _CLIENTS:
                atexit.register(_close_clients)
            held = _CLIENTS[key] = (os.getpid(), Client(**options))
        return held[1]


def _close_clients() -> None:
    with _CLIENTS_LOCK:
        held = list(_CLIENTS.values())
        _CLIENTS.clear()
    for pid, client in held:
        if pid == os.getpid():
            client.close()


def _make_parents(paths: List[str]) -> None:
    for parent in {os.path.dirname(p) for p in paths}:
        if parent:
            os.makedirs(parent, exist_ok=True)
