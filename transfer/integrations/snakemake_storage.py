"""A Snakemake storage plugin for ``s3://BUCKET/KEY`` and ``az://ACCOUNT/CONTAINER/BLOB`` on the
transfer engine (``[snakemake]``). Azure's credentials and endpoint come from its own settings
(docs/azure.md: ``AZURE_STORAGE_CONNECTION_STRING``, ``AZURE_STORAGE_ACCOUNT``/``_KEY``, a SAS).

Snakemake finds it by its package name, ``snakemake_storage_plugin_pegasus_cloudio`` (shipped
in this wheel), as the storage provider ``pegasus-cloudio``::

    snakemake --default-storage-provider pegasus-cloudio --default-storage-prefix s3://bucket/run \\
        --storage-pegasus-cloudio-endpoint-url http://127.0.0.1:9000

Keys come from ``--storage-pegasus-cloudio-key``/``-secret``/``-token`` (named as s3fs names
them; ``-access-key``/``-secret-key``/``-session-token`` are their older names) or the variables
``SNAKEMAKE_STORAGE_PEGASUS_CLOUDIO_KEY``/``_SECRET``/``_TOKEN``, else from the AWS chain.

What is bulk: one provider holds one warm connection pool and one engine. ``inventory`` lists
an object's directory once (one request per 1,000 keys) and answers existence, modification
time and size of every file in it, for Snakemake's cache and for this provider's own
``exists``/``size``/``mtime``.

How long a listing is believed: a file it showed stays known (this provider's own stores and
removals update it; Snakemake removes a job's stale outputs through the provider before the job
runs). A file it did NOT show is taken as absent only while Snakemake's IOCache still holds the
inventory made from that listing, that is while Snakemake builds the DAG. Snakemake clears that
cache before it runs jobs, and from then on wants fresh answers: under remote execution a job
stores its outputs from another node, after the listing. So afterwards a miss is asked again:
one listing of the file's directory (one request up to 1,000 names, and it answers for the
files beside it too), or one look at the file alone in a directory wider than that.

Retrievals (and stores) that Snakemake starts together (one
``asyncio`` task group: a job's inputs) run as ONE engine batch on the thread pool; a
``directory()`` is one batch too. Snakemake's local mode stores a job's outputs one after
the other (it awaits each), so those are single-file batches over the same warm pool.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

try:
    from snakemake_interface_common.exceptions import WorkflowError
    from snakemake_interface_storage_plugins.common import Operation
    from snakemake_interface_storage_plugins.io import IOCacheStorageInterface, Mtime, get_constant_prefix
    from snakemake_interface_storage_plugins.settings import StorageProviderSettingsBase
    from snakemake_interface_storage_plugins.storage_object import (
        StorageObjectGlob,
        StorageObjectRead,
        StorageObjectTouch,
        StorageObjectWrite,
    )
    from snakemake_interface_storage_plugins.storage_provider import (
        ExampleQuery,
        QueryType,
        StorageProviderBase,
        StorageQueryValidationResult,
    )
except ImportError as missing:  # the extra is not installed
    raise ImportError(f"{missing}: pip install 'pegasus-cloudio[snakemake]'") from missing

from transfer.backends.aws_chain import aws_endpoint_and_region
from transfer.context import check_ca_bundle
from transfer.errors import InvalidInput, NotFound
from transfer.client import Client, Entry

__all__ = ["StorageObject", "StorageProvider", "StorageProviderSettings"]

Pairs = List[Tuple[str, str]]


def _setting(help_text: str, secret: bool = False, kind: Any = str, default: Any = None) -> Any:
    return field(default=default, metadata={"help": help_text, "env_var": secret, "required": False,
                                            "type": kind})


@dataclass
class StorageProviderSettings(StorageProviderSettingsBase):  # type: ignore[misc]
    """``--storage-pegasus-cloudio-<name>`` options (secrets also as environment variables)."""

    endpoint_url: Optional[str] = _setting("S3 endpoint URL, e.g. http://127.0.0.1:9000 (default: AWS)")
    region: Optional[str] = _setting("S3 region (default: us-east-1 or the AWS configuration's)")
    key: Optional[str] = _setting("S3 access key id (default: the AWS credential chain)", secret=True)
    secret: Optional[str] = _setting("S3 secret access key (default: the AWS credential chain)", secret=True)
    token: Optional[str] = _setting("S3 session token of temporary keys", secret=True)
    access_key: Optional[str] = _setting("older name of --storage-pegasus-cloudio-key", secret=True)
    secret_key: Optional[str] = _setting("older name of --storage-pegasus-cloudio-secret", secret=True)
    session_token: Optional[str] = _setting("older name of --storage-pegasus-cloudio-token", secret=True)
    threads: Optional[int] = _setting("concurrent transfers and connections kept (default 8)", kind=int,
                                      default=8)
    ca_bundle: Optional[str] = _setting("PEM file of the CAs that verify the endpoint's TLS certificate, "
                                        "instead of the system's (a private CA)")


_FORMS = {"s3": "s3://BUCKET/KEY", "az": "az://ACCOUNT/CONTAINER/BLOB"}  # scheme -> its query's shape


def _split(query: str) -> Tuple[str, str, str]:
    """(scheme, bucket, key) of ``s3://bucket/key`` or ``az://account/container/blob`` (whose
    bucket is ``account/container``: the unit that is made on store); ValueError naming the
    query otherwise."""
    scheme, _, rest = query.partition("://")
    if scheme not in _FORMS:
        raise ValueError(f"{query}: not an {' or '.join(_FORMS.values())} URL")
    depth = _FORMS[scheme].count("/") - 2  # path parts before the key
    parts = rest.split("/", depth)
    if len(parts) <= depth or not all(parts[:depth]) or not parts[depth].strip("/"):
        raise ValueError(f"{query}: an {scheme}:// query needs a bucket and a key ({_FORMS[scheme]})")
    return scheme, "/".join(parts[:depth]), parts[depth]


_PAGE = 1000  # names per listing request (S3's max-keys)


@dataclass(frozen=True)
class _Held:
    """The inventory a listing made: ``key`` (its directory's) in Snakemake's ``cache``."""

    cache: IOCacheStorageInterface
    key: str

    def holds(self) -> bool:
        """Whether Snakemake still holds it (it clears the cache once the DAG is built)."""
        return self.key in self.cache.exists_in_storage


class _Batches:
    """Copies asked for in the same turn of the event loop run as one engine batch.

    Snakemake starts a job's retrievals as tasks of one ``asyncio.TaskGroup``: each reaches
    :meth:`copy` before any of them waits on the network, so they meet here. The batch runs in
    a worker thread; the loop stays free."""

    def __init__(self, client: Client, log: Any) -> None:
        self._client = client
        self._log = log
        self._pending: List[Tuple[Pairs, "asyncio.Future[None]"]] = []
        self._draining = False

    async def copy(self, pairs: Pairs) -> None:
        loop = asyncio.get_running_loop()
        done: "asyncio.Future[None]" = loop.create_future()
        self._pending.append((pairs, done))
        if not self._draining:
            self._draining = True
            loop.create_task(self._drain())
        await done

    async def _drain(self) -> None:
        try:
            seen = -1
            while seen != len(self._pending):  # let every task started together arrive
                seen = len(self._pending)
                await asyncio.sleep(0)
        finally:  # also when the loop is torn down meanwhile: the next copy starts afresh
            batch, self._pending, self._draining = self._pending, [], False
        pairs = [pair for wanted, _ in batch for pair in wanted]
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                None, lambda: self._client.copy(pairs, check=False))
        except asyncio.CancelledError:
            for _, done in batch:
                done.cancel()
            raise
        except Exception as err:  # the batch itself failed: every waiter hears it
            for _, done in batch:
                if not done.done():
                    done.set_exception(err)
            return
        self._log.debug(f"pegasus-cloudio: {len(pairs)} files for {len(batch)} storage objects in one engine batch")
        at = 0
        for wanted, done in batch:
            mine, at = results[at:at + len(wanted)], at + len(wanted)
            failed = [r.error for r in mine if not r.ok]
            if done.done():
                continue
            if failed:
                done.set_exception(failed[0] or RuntimeError("transfer failed"))
            else:
                done.set_result(None)


class StorageProvider(StorageProviderBase):  # type: ignore[misc]
    """One warm pool and engine for the run; a memo of what listings showed (see the module doc
    for how long it is believed)."""

    def __post_init__(self) -> None:
        settings = self.settings or StorageProviderSettings()
        threads = 8 if settings.threads is None else int(settings.threads)
        if threads < 1:  # the Client would refuse it too, but by the library's name for it
            raise InvalidInput(f"--storage-pegasus-cloudio-threads must be at least 1 (got {threads})",
                               operation="config")
        if settings.ca_bundle is not None:  # named as the user gave it, before any request
            check_ca_bundle(settings.ca_bundle, "--storage-pegasus-cloudio-ca-bundle")
        endpoint, region = settings.endpoint_url, settings.region
        if endpoint is None or region is None:  # the AWS settings' (docs/engines.md), also for keys given here
            aws_endpoint, aws_region = aws_endpoint_and_region(os.environ)
            endpoint, region = endpoint or aws_endpoint, region or aws_region
        self.client = Client(endpoint_url=endpoint, region=region, key=settings.key, secret=settings.secret,
                             token=settings.token, access_key=settings.access_key, secret_key=settings.secret_key,
                             session_token=settings.session_token, threads=threads, ca_bundle=settings.ca_bundle)
        self.batches = _Batches(self.client, self.logger)
        self.listed: Dict[str, Entry] = {}  # url -> what the store showed there (dropped on store/remove)
        self.listed_dirs: Dict[str, _Held] = {}  # directory URL (ending in "/") -> the inventory of its listing
        self.widths: Dict[str, int] = {}  # directory URL -> names directly in it when last listed
        self.changed: Set[str] = set()  # URLs stored or removed since: listings no longer tell
        self.buckets: Set[str] = set()  # buckets known to exist
        self.lock = threading.Lock()
        self._epoch = 0  # counts forget(): a listing that began before one does not record what it saw
        self._listings: Dict[str, Tuple[object, "Future[List[Entry]]"]] = {}  # directory -> (cache, listing)
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="pegasus-cloudio-inventory")

    @classmethod
    def example_queries(cls) -> List[ExampleQuery]:
        return [ExampleQuery(query="s3://mybucket/results/sample1.txt",
                             description="an object in an S3 bucket (endpoint: --storage-pegasus-cloudio-endpoint-url)",
                             type=QueryType.ANY)]

    def rate_limiter_key(self, query: str, operation: Operation) -> Any:
        return self.settings.endpoint_url if self.settings else None

    def default_max_requests_per_second(self) -> float:
        return 1000.0

    def use_rate_limiter(self) -> bool:
        return False  # the engine bounds concurrency and retries with backoff itself

    @classmethod
    def is_valid_query(cls, query: str) -> StorageQueryValidationResult:
        try:
            _split(query)
        except ValueError as err:
            return StorageQueryValidationResult(query=query, valid=False, reason=str(err))
        return StorageQueryValidationResult(query=query, valid=True)

    async def listing(self, directory: str, cache: IOCacheStorageInterface) -> List[Entry]:
        """Every file under ``directory``, listed once per Snakemake cache however many objects
        ask at the same time (Snakemake inventories a job's files concurrently)."""
        with self.lock:
            pending = self._listings.get(directory)
            if pending is None or pending[0] is not cache:
                pending = self._listings[directory] = (cache, self._pool.submit(self._find, directory))
        return await asyncio.wrap_future(pending[1])

    def _find(self, directory: str) -> List[Entry]:
        epoch = self._epoch
        try:
            entries = self.client.find(directory)
        except NotFound:
            entries = []
        self._record(entries, epoch)
        return entries

    def _record(self, entries: List[Entry], epoch: int) -> None:
        with self.lock:
            if epoch == self._epoch:  # else something was stored or removed meanwhile: a later look tells
                for entry in entries:
                    self.listed[entry.url] = entry

    def hold(self, directory: str, held: _Held) -> None:
        """The listing of ``directory`` made the inventory ``held``: its absences hold while that does."""
        with self.lock:
            self.listed_dirs[directory] = held

    def forget(self, url: str) -> None:
        """Drop what listings said about ``url`` and anything under it (it changed)."""
        with self.lock:
            for known in [u for u in self.listed if u == url or u.startswith(url.rstrip("/") + "/")]:
                del self.listed[known]
            self.changed.add(url.rstrip("/"))
            self._epoch += 1

    def remember(self, url: str) -> None:
        """Ask the store once what was just stored at ``url`` (file or directory), so Snakemake's
        checks that follow an upload (exists, mtime, size, repeatedly) cost no request."""
        found = self.client.info(url)
        entries = self.client.find(url + "/") if found.is_dir else []
        with self.lock:
            self.changed.discard(url)
            self.listed[url] = found
            for entry in entries:
                self.listed[entry.url] = entry

    def absent(self, url: str) -> bool:
        """Whether a listing that Snakemake's cache still holds says nothing is at ``url``."""
        inside = url + "/"
        with self.lock:
            if url in self.listed or any(u.startswith(inside) for u in self.listed):
                return False
            at, listed = url, False
            while "/" in at.partition("://")[2]:  # listings are recursive: any listed ancestor tells
                if at in self.changed:
                    return False
                at = posixpath.dirname(at)
                held = self.listed_dirs.get(at + "/")
                listed = listed or (held is not None and held.holds())
            return listed

    def ask(self, url: str) -> Optional[Entry]:
        """What is at ``url`` now, from the store: one listing of its directory, which answers
        for the names beside it too, or in a directory wider than a listing page, ``url`` alone."""
        directory = posixpath.dirname(url) + "/"
        epoch = self._epoch
        if self.widths.get(directory, 0) > _PAGE:
            try:
                found = self.client.info(url)
            except NotFound:
                return None
            self._record([found], epoch)
            return found
        try:
            entries = self.client.list(directory)
        except NotFound:
            entries = []
        with self.lock:
            self.widths[directory] = len(entries)
        self._record(entries, epoch)
        return next((e for e in entries if e.url == url), None)


class StorageObject(StorageObjectRead, StorageObjectWrite, StorageObjectGlob, StorageObjectTouch):  # type: ignore[misc]
    """``s3://BUCKET/KEY`` or ``az://ACCOUNT/CONTAINER/BLOB``: an object, or a ``directory()``
    (every object under ``KEY/``)."""

    provider: StorageProvider

    def __post_init__(self) -> None:
        self.scheme, self.bucket, self.key = _split(self.query) if self.is_valid_query() else ("s3", "", "")
        self.root = f"{self.scheme}://{self.bucket}"  # the bucket's (container's) URL
        self.url = f"{self.root}/{self.key.rstrip('/')}"

    def local_suffix(self) -> str:
        return f"{self.bucket}/{self.key.rstrip('/')}"

    def cleanup(self) -> None:
        pass

    # -- inventory ------------------------------------------------------------------------

    def get_inventory_parent(self) -> Optional[str]:
        return self._parent_key()

    def _parent_key(self) -> str:
        return str(self.cache_key(f"{self.bucket}/{posixpath.dirname(self.key.rstrip('/'))}"))

    async def inventory(self, cache: IOCacheStorageInterface) -> None:
        """One listing of this object's directory fills the cache for every file in it."""
        parent = self._parent_key()
        if parent in cache.exists_in_storage:
            return
        directory = posixpath.dirname(self.url) + "/"
        entries = await self.provider.listing(directory, cache)
        prefix = f"{self.root}/"
        for entry in entries:
            rest = entry.url[len(prefix):]
            if "/" in rest[len(directory) - len(prefix):]:  # deeper: marks its sub-directory present
                sub = directory[len(prefix):] + rest[len(directory) - len(prefix):].split("/", 1)[0]
                cache.exists_in_storage[self.cache_key(f"{self.bucket}/{sub}")] = True
                continue
            key = self.cache_key(f"{self.bucket}/{rest}")
            cache.exists_in_storage[key] = True
            cache.mtime[key] = Mtime(storage=entry.mtime if entry.mtime is not None else 0.0)
            cache.size[key] = entry.size
        cache.exists_in_storage[parent] = bool(entries)
        self.provider.hold(directory, _Held(cache, parent))
        if self.cache_key() not in cache.exists_in_storage:
            cache.exists_in_storage[self.cache_key()] = False

    # -- state ----------------------------------------------------------------------------

    def _entry(self) -> Optional[Entry]:
        """The file or directory at this URL, or None; what a listing showed costs nothing, and
        so does what it did not show while Snakemake builds the DAG."""
        with self.provider.lock:
            listed = self.provider.listed.get(self.url)
        if listed is not None:
            return listed
        if self.provider.absent(self.url):
            return None
        return self.provider.ask(self.url)

    def _existing(self) -> Entry:
        found = self._entry()
        if found is None:
            raise FileNotFoundError(f"{self.query}: no such object in storage")
        return found

    def exists(self) -> bool:
        return self._entry() is not None

    def mtime(self) -> float:
        found = self._existing()
        if found.is_dir:
            times = [e.mtime for e in self.provider.client.find(self.url + "/") if e.mtime is not None]
            return max(times, default=0.0)
        return found.mtime if found.mtime is not None else 0.0

    def size(self) -> int:
        found = self._existing()
        return 0 if found.is_dir else found.size

    def local_footprint(self) -> int:
        found = self._existing()
        return sum(e.size for e in self.provider.client.find(self.url + "/")) if found.is_dir else found.size

    # -- moving bytes ---------------------------------------------------------------------

    def _retrievals(self) -> Pairs:
        """(source URL, local path) of this object, or of every object under the directory."""
        local = self.local_path()
        found = self._existing()
        if not found.is_dir:
            return [(self.url, str(local))]
        inside = self.url + "/"
        return [(e.url, str(local / e.url[len(inside):])) for e in self.provider.client.find(inside)]

    def _stores(self) -> Pairs:
        local = self.local_path()
        if not local.is_dir():
            return [(str(local), self.url)]
        return [(str(path), f"{self.url}/{path.relative_to(local).as_posix()}")
                for path in sorted(local.rglob("*")) if path.is_file()]

    def retrieve_object(self) -> None:
        self.provider.client.copy(self._retrievals())

    async def managed_retrieve(self) -> None:
        """As the base class's, but the copies join the batch of retrievals started with it."""
        await self.wait_for_free_space()
        try:
            self.local_path().parent.mkdir(parents=True, exist_ok=True)
            await self.provider.batches.copy(self._retrievals())
        except Exception as err:
            _remove_local(self.local_path())
            raise WorkflowError(f"Failed to retrieve storage object from {self.print_query}", err)

    def _ensure_bucket(self) -> None:
        if self.bucket not in self.provider.buckets:
            self.provider.client.mkdir(self.root)
            self.provider.buckets.add(self.bucket)

    def store_object(self) -> None:
        self._ensure_bucket()
        self.provider.forget(self.url)
        self.provider.client.copy(self._stores())
        self.provider.remember(self.url)

    async def managed_store(self) -> None:
        """As the base class's, but the copies join the batch of stores started with it."""
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._ensure_bucket)
            self.provider.forget(self.url)
            await self.provider.batches.copy(self._stores())
            await asyncio.get_running_loop().run_in_executor(None, self.provider.remember, self.url)
        except Exception as err:
            raise WorkflowError(f"Failed to store output in storage {self.print_query}", err)

    def touch(self) -> None:
        """``snakemake --touch``: the object's (a directory's: each object's) modification time
        renewed in place, or an empty object where none is (:meth:`transfer.client.Client.touch`)."""
        self._ensure_bucket()
        self.provider.forget(self.url)
        self.provider.client.touch(self.url)
        self.provider.remember(self.url)

    def remove(self) -> None:
        found = self._entry()
        self.provider.forget(self.url)
        if found is not None:
            self.provider.client.remove([self.url + ("/" if found.is_dir else "")], recursive=found.is_dir)

    # -- glob_wildcards -------------------------------------------------------------------

    def list_candidate_matches(self) -> Iterable[str]:
        prefix = get_constant_prefix(self.query)
        if not prefix.startswith(f"{self.root}/") or not self.bucket:
            raise WorkflowError(f"{self.query}: the bucket name may not contain a wildcard")
        directory = posixpath.dirname(prefix[len(self.root) + 1:])
        base = f"{self.root}/{directory + '/' if directory else ''}"
        try:
            entries = self.provider.client.find(base)
        except NotFound:
            return []
        return [e.url for e in entries if e.url.startswith(prefix)]


def _remove_local(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink()
