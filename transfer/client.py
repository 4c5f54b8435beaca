"""The plain API for workflow engines that are not Pegasus: copy many, read, write, list, remove.

::

    from transfer.client import Client

    with Client(endpoint_url="http://127.0.0.1:9000", key="minio", secret="minio123") as client:
        client.mkdir("s3://run1")
        client.write_bytes("s3://run1/in/a.txt", b"hello")
        client.copy([("s3://run1/in/a.txt", "/scratch/a.txt"), ("/scratch/b.txt", "s3://run1/out/")])
        print([(e.name, e.is_dir) for e in client.list("s3://run1/")])
        client.remove("s3://run1/in/", recursive=True)

A :class:`Client` is a :class:`~transfer.session.Session` (one warm connection pool per
endpoint) and an :class:`~transfer.engine.Engine` (threads, retries, bundles, node cache) with
the endpoint and credentials as arguments (named as s3fs names them). Nothing is read unasked: no config file, no
``PEGASUS_CLOUDIO_*`` variable; the environment only for credentials of URLs whose keys were
not given (and only ``env`` when passed, instead of ``os.environ``). URLs are strings:
``s3://BUCKET/KEY`` at ``endpoint_url``, ``s3://USER@SITE/BUCKET/KEY`` (Pegasus credentials file),
``gs://``, ``http(s)://``, ``scp://``, plain local paths (taken literally: no ``$VAR``; ``:``
allowed). Errors are :mod:`transfer.errors` classes (``NotFound`` is a FileNotFoundError...).
"""

from __future__ import annotations

import io
import os
import posixpath
import threading

from transfer import listing, schemes
from transfer.backends.base import (AttributedPuts, Attributes, BucketRemoval, ConditionalPuts, ExclusiveCreate,
                                    Presigns, RangedReads, Touches, cache_keys, namespace, uploads)
from transfer.config import Settings
from transfer.context import check_ca_bundle
from transfer.credentials import Credentials
from transfer.engine import Engine
from transfer.errors import InvalidInput, NotFound, RemoteError, TransferError
from transfer.listing import Entry
from transfer.ops import Mkdir, Remove, Result, Transfer
from transfer.session import BackendOpener, Session
from transfer.urls import Url, parse_url

# An engine's start-up is a per-process cost: typing, tempfile and the node cache are imported
# where they are used (the plain API's own modules, as the drop-in's, stay lean: see transfer.lean).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

    from transfer.cache import NodeCache

    UrlLike = Union[str, Url]

__all__ = ["Client", "Entry", "literal_url"]


class Client:
    """One endpoint configuration, one warm pool, one engine. Thread-safe; close it (or use
    ``with``) to release connections and threads."""

    def __init__(self, *, endpoint_url: Optional[str] = None, region: Optional[str] = None,
                 key: Optional[str] = None, secret: Optional[str] = None, token: Optional[str] = None,
                 anonymous: bool = False, threads: int = 8,
                 bundles: bool = False, cache_dir: Optional[str] = None, cache_bytes: int = 10 << 30,
                 ca_bundle: Optional[str] = None, settings: Optional[Settings] = None,
                 env: Optional[Mapping[str, str]] = None, endpoint: Optional[str] = None,
                 access_key: Optional[str] = None, secret_key: Optional[str] = None,
                 session_token: Optional[str] = None) -> None:
        """See the module doc. The S3 endpoint and keys are named as s3fs and botocore name
        them: ``endpoint_url``, ``key``, ``secret``, ``token``; ``endpoint``, ``access_key``,
        ``secret_key`` and ``session_token`` are the same arguments under their older names
        (InvalidInput when both names of one are given). ``key`` and ``secret`` go together
        (else InvalidInput); ``settings`` replaces the defaults (``threads`` and ``bundles``
        then come from it); ``cache_dir`` turns on the node cache there, holding at most
        ``cache_bytes``; ``ca_bundle``: PEM file of the CAs that verify TLS instead of the
        system's (over ``settings``' own), loaded here: ConfigError ``ca_bundle=FILE: ...`` if
        it cannot be."""
        endpoint = _either("endpoint_url", endpoint_url, "endpoint", endpoint)
        access_key = _either("key", key, "access_key", access_key)
        secret_key = _either("secret", secret, "secret_key", secret_key)
        session_token = _either("token", token, "session_token", session_token)
        if (access_key is None) != (secret_key is None):
            raise InvalidInput("key and secret (access_key and secret_key) must be given together",
                               operation="config")
        credentials = Credentials(access_key, secret_key, session_token) if access_key and secret_key else None
        if settings is None:
            settings = Settings(threads=threads, bundle=bundles)  # the Session checks it
        if ca_bundle is not None:
            check_ca_bundle(ca_bundle, "ca_bundle")
            settings = settings.replace(ca_bundle=ca_bundle)
        from transfer.backends.s3 import S3At  # the S3 backend module, only when a Client is made

        opener: BackendOpener = S3At(endpoint, region, credentials, anonymous)
        self.session = Session(settings, dict(os.environ) if env is None else dict(env),
                               backends=dict.fromkeys(schemes.S3, opener))
        self._cache: Optional[NodeCache] = None
        if cache_dir:
            from transfer.cache import CacheConfig, NodeCache
            self._cache = NodeCache(CacheConfig(cache_dir, cache_bytes))
        self.engine = Engine(self.session, cache=self._cache)

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the engine's part threads and close the session's connections. The node cache
        is not closed here: each engine run settles it (its counters, eviction)."""
        try:
            self.engine.close()
        finally:
            self.session.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def url(self, text: UrlLike) -> Url:
        """``text`` parsed (local paths and keys literally, trailing spaces included); a Url
        passes through."""
        return text if isinstance(text, Url) else literal_url(text)

    def forget(self, url: UrlLike) -> None:
        """Drop this node's cache entry of ``url``: the object was (or may have been) stored
        outside the engine, whose uploads drop it themselves. Nothing without a node cache."""
        target = self.url(url)
        if self._cache is None or target.is_local:
            return
        keys = cache_keys(self.session.backend(target))
        if keys is not None:
            self._cache.drop(keys.cache_key(target))

    # -- many files -----------------------------------------------------------------------

    def copy(self, pairs: Iterable[Tuple[UrlLike, UrlLike]], *, check: bool = True,
             cancel: Optional[threading.Event] = None) -> List[Result]:
        """Copy every ``(source, destination)`` pair as one engine batch; one result per pair,
        in order. A destination ending in ``/`` is a directory (the source's name is added).
        ``check``: raise the first failure's error once the batch is done."""
        ops = []
        for src, dst in pairs:
            source = self.url(src)
            ops.append(Transfer((source,), self._dest(source, self.url(dst))))
        _refuse_shared_destinations(ops)
        results = self.engine.run(ops, cancel)
        if check:
            _raise_first(results)
        return results

    async def copy_async(self, pairs: Iterable[Tuple[UrlLike, UrlLike]], *, check: bool = True) -> List[Result]:
        """:meth:`copy` off the event loop; cancelling the awaiting task (``asyncio.wait_for``
        timing out) cancels the batch, which stops promptly."""
        import asyncio  # only callers on an event loop pay for its import

        cancel = threading.Event()
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, lambda: self.copy(list(pairs), check=check, cancel=cancel))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            cancel.set()
            raise

    def remove(self, urls: Union[UrlLike, Sequence[UrlLike]], *, recursive: bool = False) -> None:
        """Remove objects (bundle members too), or whole prefixes with ``recursive`` (an object's
        URL still removes the object). Without it a missing object raises NotFound and a
        directory InvalidInput: nothing is removed silently-not. Several URLs go as one batch:
        on S3 one DeleteObjects per 1,000 keys, after one listing of each directory they are in
        (not a HEAD per key; see :func:`transfer.listing.kinds`). Bundle members and absent
        keys are looked up one by one."""
        targets = [self.url(u) for u in ([urls] if isinstance(urls, (str, Url)) else urls)]
        ops = []
        for target, kind in zip(targets, self._kinds(targets)):  # all looked up before anything is removed
            is_dir = True if kind is None else kind  # nothing there: removing it recursively is no error
            if kind is None and not recursive:
                raise NotFound("no such file or directory", url=str(target), operation="remove")
            if is_dir and not recursive:
                raise InvalidInput("is a directory: pass recursive=True to remove everything under it",
                                   url=str(target), operation="remove")
            ops.append(Remove(target, is_dir))  # a recursive Remove lists 'url/' only: an object is itself
        _raise_first(self.engine.run(ops))

    def mkdir(self, url: UrlLike) -> None:
        """Create a local directory, or the bucket of an object-store URL (idempotent)."""
        _raise_first(self.engine.run([Mkdir(self.url(url))]))

    def remove_bucket(self, url: UrlLike) -> None:
        """Delete an empty bucket (``s3://bucket``, ``gs://bucket``): NotFound when there is
        none, RemoteError (409; fake-gcs-server 412) while something is in it (``remove(url,
        recursive=True)`` first), InvalidInput for a URL naming a key or a store without buckets."""
        target = self.url(url)
        backend = None if target.is_local else self.session.backend(target)
        if not isinstance(backend, BucketRemoval) or target.path.strip("/"):
            raise InvalidInput("not a bucket: remove_bucket takes s3://BUCKET or gs://BUCKET", url=str(target),
                               operation="remove")
        backend.remove_bucket(target)

    # -- one object -----------------------------------------------------------------------

    def read_bytes(self, url: UrlLike, start: Optional[int] = None, end: Optional[int] = None, *,
                   pin: Optional[Entry] = None) -> bytes:
        """The object's bytes (``[start, end)`` when given, as a slice: empty past the end;
        bundle members too). One GET when it answers; a missing object (a bundle member?) or
        an error worth retrying goes the engine's way (retries, bundles, node cache).
        ``pin``: the object as :meth:`info` found it; a range of an object replaced since (other
        ETag or size) raises RemoteError "the object changed" instead of mixing two versions."""
        target = self.url(url)
        if self._cache is None and not target.is_local:
            try:
                return self._get(target, start, end, pin)
            except TransferError as err:
                if not (err.retryable or isinstance(err, NotFound)):
                    raise
        return self._read_via_engine(target, start, end)

    def _get(self, target: Url, start: Optional[int], end: Optional[int], pin: Optional[Entry]) -> bytes:
        backend = self.session.backend(target)
        if start is None and end is None and pin is None:
            sink = io.BytesIO()
            backend.get(target, sink)
            return sink.getvalue()
        first = start or 0
        last = (backend.stat(target).size if pin is None else pin.size) if end is None else end
        if pin is not None:
            last = min(last, pin.size)
        if last <= first:
            return b""
        sink = io.BytesIO()
        if pin is not None and pin.version and isinstance(backend, RangedReads):
            backend.get_range(target, (first, last), pin.version, pin.size, sink.write)
            return sink.getvalue()
        try:
            backend.get(target, sink, (first, last))
        except RemoteError as err:
            if err.status != 416:
                raise
            return b""  # the range starts at or past the end: empty, as a slice of the bytes is
        return sink.getvalue()

    def _read_via_engine(self, target: Url, start: Optional[int], end: Optional[int]) -> bytes:
        import tempfile
        with tempfile.TemporaryDirectory(prefix="pegasus-cloudio-") as scratch:
            dest = parse_url(os.path.join(scratch, "object"))
            _raise_first(self.engine.run([Transfer((target,), dest)]))
            with open(dest.path, "rb") as fh:
                if start:
                    fh.seek(start)
                return fh.read() if end is None else fh.read(max(0, end - (start or 0)))

    def write_bytes(self, url: UrlLike, data: bytes, *, if_none_match: Optional[str] = None,
                    if_match: Optional[str] = None, content_type: Optional[str] = None,
                    cache_control: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None) -> None:
        """Store ``data`` as the object ``url`` (verified by size and checksum); a URL ending in
        ``/`` names a directory, not an object: InvalidInput. Conditional writes, atomic in the
        store (one PUT, so up to 5 GiB): ``if_none_match="*"`` stores only if no object has the
        name (AlreadyExists otherwise), ``if_match=ETAG`` only over the object of that ETag
        (:attr:`Entry.version`; RemoteError with status 412 otherwise). Where the store cannot
        (GCS, SFTP, local files): InvalidInput naming the URL, nothing stored. ``content_type``,
        ``cache_control`` and ``metadata`` (user metadata: ASCII names and values) are stored
        with the object in the same one PUT (S3; elsewhere InvalidInput), returned by
        :meth:`info`, and kept by copies inside one S3 store."""
        target = self.url(url)
        if target.path.endswith("/"):  # copy() would add a name to it: a key nobody asked for
            raise InvalidInput("names a directory (ends in '/'), not an object to write", url=str(target),
                               operation="put")
        uploads(self.session.backend(target), target, "put")
        import tempfile
        with tempfile.TemporaryDirectory(prefix="pegasus-cloudio-") as scratch:
            path = os.path.join(scratch, posixpath.basename(target.path.rstrip("/")) or "object")
            with open(path, "wb") as fh:
                fh.write(data)
            attributes = Attributes(content_type, cache_control, tuple(sorted(
                (name.lower(), value) for name, value in (metadata or {}).items())))
            if attributes != Attributes():
                self._put_with(path, target, attributes, if_none_match, if_match)
            elif if_none_match is None and if_match is None:
                _raise_first(self.engine.run([Transfer((self.url(path),), target)]))
            else:
                self._put_if(path, target, if_none_match, if_match)

    def _put_with(self, path: str, target: Url, attributes: Attributes, if_none_match: Optional[str],
                  if_match: Optional[str]) -> None:
        """One PUT of the local file ``path`` with ``attributes`` (see :meth:`write_bytes`)."""
        backend = self.session.backend(target)
        if not isinstance(backend, AttributedPuts):
            raise InvalidInput(f"{target.scheme}:// stores keep no content type, cache control or metadata",
                               url=str(target), operation="put")
        _check_conditions(target, if_none_match, if_match)
        bad = [text for pair in attributes.metadata for text in pair if not text.isascii() or "\n" in text]
        if bad:
            raise InvalidInput(f"metadata names and values must be ASCII on one line (got {bad[0]!r})",
                               url=str(target), operation="put")
        try:
            backend.put_with(path, target, attributes, if_none_match=if_none_match == "*", if_match=if_match)
        finally:  # the node cache's entry of the name may be of another object
            self.forget(target)

    def _put_if(self, path: str, target: Url, if_none_match: Optional[str], if_match: Optional[str]) -> None:
        """One conditional PUT of the local file ``path`` (see :meth:`write_bytes`)."""
        backend = self.session.backend(target)
        _check_conditions(target, if_none_match, if_match)
        if not isinstance(backend, ExclusiveCreate if if_none_match else ConditionalPuts):
            raise InvalidInput(f"{target.scheme}:// stores take no conditional writes "
                               f"({'if_none_match' if if_none_match else 'if_match'})", url=str(target),
                               operation="put")
        try:
            if isinstance(backend, ExclusiveCreate) and if_none_match:
                backend.put_new(path, target)
            elif isinstance(backend, ConditionalPuts) and if_match:
                backend.put_if_match(path, target, if_match)
        finally:  # stored or refused, the node cache's entry of the name may be of another object
            self.forget(target)

    def presign(self, url: UrlLike, method: str = "GET", expires: int = 3600) -> str:
        """A URL that lets anyone without keys GET (or PUT) the object for ``expires`` seconds
        (1 to 604,800, SigV4's and GCS V4's limit), signed here with no request sent: on S3 as
        botocore's ``generate_presigned_url`` signs it, on GCS as google-cloud-storage's
        ``generate_signed_url(version="v4")`` with the service account's key. InvalidInput,
        naming the URL, for another method, an expiry out of range, anonymous access (or a GCS
        key that is not a service account's), or a store that cannot sign (not S3 or GCS)."""
        target = self.url(url)
        if method not in ("GET", "PUT") or not 1 <= expires <= 604800:
            raise InvalidInput(f"presign takes GET or PUT and 1 to 604800 seconds (got {method!r}, {expires!r})",
                               url=str(target), operation="presign")
        backend = self.session.backend(target)
        if not isinstance(backend, Presigns) or target.path.rstrip("/") == "":
            raise InvalidInput("cannot sign a URL for this: an s3:// or gs:// object URL is needed", url=str(target),
                               operation="presign")
        return backend.presign(target, method, expires)

    def touch(self, url: UrlLike) -> Entry:
        """Renew the modification time of the object at ``url`` (bytes and attributes kept;
        on S3 a copy onto itself, objects up to 5 GiB), or of every file under it when it is a
        directory; an empty object when nothing is there. InvalidInput naming the URL where the
        store cannot (GCS, SFTP, HTTP). Returns what :meth:`info` then says."""
        target = self.url(url)
        backend = self.session.backend(target)
        try:
            found: Optional[Entry] = self._info(target)
        except NotFound:
            found = None
        if found is None:
            self.write_bytes(target, b"")
        elif not isinstance(backend, Touches):
            raise InvalidInput(f"{target.scheme}:// objects cannot be touched in place", url=str(target),
                               operation="touch")
        else:
            for entry in self.find(target) if found.is_dir else [found]:
                backend.touch(self.url(entry.url))
                self.forget(entry.url)
        return self._info(target)

    # -- namespace ------------------------------------------------------------------------

    def info(self, url: UrlLike) -> Entry:
        """The object, bundle member or directory at ``url``; NotFound when none is there."""
        return self._info(self.url(url))

    def exists(self, url: UrlLike) -> bool:
        try:
            self.info(url)
        except NotFound:
            return False
        return True

    def list(self, url: UrlLike) -> List[Entry]:
        """One level under ``url``: files (bundle members included) and directories, by name.
        NotFound when ``url`` is neither a directory nor a file."""
        target = self.url(url)
        return listing.one_level(self._namespace(target), target)

    def find(self, url: UrlLike) -> List[Entry]:
        """Every file under ``url``, recursively (bundle members included), by URL."""
        target = self.url(url)
        return listing.recursive(self._namespace(target), target)

    def iter_list(self, url: UrlLike) -> Iterator[List[Entry]]:
        """:meth:`list` lazily, a page at a time: each page (sorted by name) is one listing
        request of the store (S3: up to 1,000 names), sent when the page before it is taken;
        bundle members in a page of their own at the end. Errors (NotFound...) come with the
        first page."""
        target = self.url(url)
        return listing.iter_one_level(self._namespace(target), target)

    def iter_find(self, url: UrlLike) -> Iterator[List[Entry]]:
        """:meth:`find` lazily: pages of up to 1,000 files in the store's order (S3: key
        order), each asked of the store when the one before it is taken, so the first costs
        one request and memory stays flat however many keys there are; bundle members come in
        pages of their own after the plain files. Errors come with the first page."""
        target = self.url(url)
        return listing.iter_recursive(self._namespace(target), target)

    # -- helpers --------------------------------------------------------------------------

    def _namespace(self, url: Url) -> listing.Lister:
        backend = self.session.backend(url)
        namespace(backend, url, "list")  # InvalidInput naming the URL when it cannot be listed
        return backend

    def _kinds(self, urls: Sequence[Url]) -> List[Optional[bool]]:
        """:func:`transfer.listing.kinds` of ``urls``, asked of each one's backend."""
        by_backend: Dict[int, Tuple[listing.Lister, List[int]]] = {}
        for i, url in enumerate(urls):
            backend = self.session.backend(url)
            by_backend.setdefault(id(backend), (backend, []))[1].append(i)
        answers: List[Optional[bool]] = [None] * len(urls)
        for backend, indexes in by_backend.values():
            for i, kind in zip(indexes, listing.kinds(backend, [urls[i] for i in indexes])):
                answers[i] = kind
        return answers

    def _info(self, url: Url) -> Entry:
        return listing.info(self.session.backend(url), url)

    def _dest(self, source: Url, dest: Url) -> Url:
        if dest.is_local and dest.path.endswith(os.sep) and source.path.rstrip("/"):
            return dest.with_path(os.path.join(dest.path, posixpath.basename(source.path.rstrip("/"))))
        return dest


def _check_conditions(target: Url, if_none_match: Optional[str], if_match: Optional[str]) -> None:
    """InvalidInput naming ``target`` unless the write conditions are ones a store can check."""
    if if_none_match not in (None, "*") or (if_none_match and if_match):
        raise InvalidInput("if_none_match takes only '*', and not together with if_match", url=str(target),
                           operation="put")


def _either(name: str, value: Optional[str], alias: str, aliased: Optional[str]) -> Optional[str]:
    """The argument given under ``name`` or its older name ``alias``; InvalidInput naming both
    when each was given."""
    if value is not None and aliased is not None:
        raise InvalidInput(f"{name} and {alias} are one argument (the second its older name): give one",
                           operation="config")
    return aliased if value is None else value


def literal_url(text: str) -> Url:
    """``parse_url(text)`` with trailing blanks kept: a key or local path is taken literally."""
    return parse_url(text, trailing_blanks=True)


def _refuse_shared_destinations(ops: Sequence[Transfer]) -> None:
    """Copies of two sources to one destination run at once: it would hold either, and both
    report ok. The same pair twice is harmless."""
    sources: Dict[Url, Tuple[Url, ...]] = {}
    for op in ops:
        if sources.setdefault(op.dest, op.sources) != op.sources:
            raise InvalidInput("two sources of one copy write this destination", url=str(op.dest), operation="copy")


def _raise_first(results: Sequence[Result]) -> None:
    failed = [r for r in results if not r.ok]
    if failed and failed[0].error is not None:
        error = failed[0].error
        if len(failed) > 1:
            error.message += f" (and {len(failed) - 1} more of {len(results)} failed)"
            error.args = (error.message,)
        raise error
