"""The pegasus-s3 subcommands, on the transfer library (one Session, one Engine per run).

Data moves through :class:`transfer.Engine` (atomic downloads, multipart uploads, server-side
copies, batched deletes, retries); single requests (stat, bucket create, listing) go to the
session's S3 backend. Every method raises :class:`CommandError` or a
:class:`transfer.errors.TransferError` for the CLI to print; none of them prints errors.

Differences from pegasus-s3 5.1.3 (its defects, spec §7.4): listings and ``rm`` existence
checks see every key (pagination); ``rm`` expands ``*``, ``?`` and ``[...]`` in keys (so
pegasus-transfer's recursive cleanup ``prefix/*`` deletes the prefix); ``put FILE URL/``
stores ``URL/<basename>``. ``s3s://`` is ``s3://`` (the endpoint's scheme decides the transport).
"""

from __future__ import annotations

import fnmatch
import logging
import os
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Set, TextIO, Tuple

from pegasus_cloudio.s3cli.bucket_ops import list_buckets
from pegasus_cloudio.s3cli.upload_ops import Upload, list_uploads
from pegasus_cloudio.s3cli.uri import WILDCARDS, CommandError, S3Uri, has_wildcards, new_bucket_problem, parse_s3_uri
from transfer import Engine, Session
from transfer.backends.base import MultipartUploads, ObjectInfo, Store, store
from transfer.backends.s3 import split_url
from transfer.errors import NotFound
from transfer.ops import Operation, Remove, Result, Transfer
from transfer.urls import Url, parse_url

if TYPE_CHECKING:
    from pegasus_cloudio.dropin.signals import Interrupts
    from pegasus_cloudio.progress import Progress

    # (files, bytes if known, a way to learn them with requests) -> the reporter of one batch
    # (pegasus_cloudio.progress.Progress); the maker asks with requests only for a terminal
    Sizes = Callable[[], Optional[int]]
    ShowProgress = Callable[[int, Optional[int], Optional[Sizes]], ContextManager[Progress]]

log = logging.getLogger("pegasus_cloudio.s3cli")

KB, MB, GB, TB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
_STAT_AT_MOST = 10  # a copy's sources are stat'ed for a progress line's total up to this many


def human_size(size: int) -> str:
    """pegasus-s3's ``-H`` format."""
    for unit, name in ((TB, "TB"), (GB, "GB"), (MB, "MB"), (KB, "KB")):
        if size >= unit:
            return f"{size / float(unit):6.1f}{name}"
    return f"{size:6.0f}B"


def local_path(text: str) -> str:
    """A FILE argument: a path or a ``file:`` URL."""
    return parse_url(text).path if text.startswith("file:") else text


class S3Commands:
    """One CLI run: listing output goes to ``out``; data moves through one engine."""

    def __init__(self, session: Session, out: TextIO, threads: Optional[int] = None,
                 watcher: Optional["Interrupts"] = None, progress: Optional["ShowProgress"] = None) -> None:
        """``watcher`` is told each batch before it runs and each result (the signal handler's
        record of what did not finish); ``progress`` makes the reporter of each put, get or cp
        batch (None: no progress), told each result too."""
        self._session = session
        self._out = out
        self._watcher = watcher
        self._progress = progress
        self._shown: Optional[Progress] = None  # the reporter of the batch running
        self._engine = Engine(session, threads=threads, on_result=self._finished)
        self._listings: Dict[Tuple[str, str, str], Set[str]] = {}

    def _finished(self, result: Result) -> None:
        if self._watcher is not None:
            self._watcher.finished(result)
        shown = self._shown
        if shown is not None:
            shown.finished(result)

    def _backend(self, uri: S3Uri) -> Store:
        url = uri.to_url()
        return store(self._session.backend(url), url, "s3")

    # -- ls / mkdir -----------------------------------------------------------------------

    def ls(self, uri: S3Uri, long_format: bool = False, human: bool = False) -> None:
        """Buckets (no bucket in the URL) or every key starting with the URL's key."""
        if uri.bucket is None:
            for name in list_buckets(self._backend(uri)):
                self._out.write(f"\t{name}\n")
            return
        for info in self._list_prefix(uri, uri.key or ""):
            key = split_url(info.url).key
            if not long_format:
                self._out.write(f"\t{key}\n")
                continue
            size = human_size(info.size) if human else f"{info.size:13d}"
            modified = str(datetime.fromtimestamp(info.mtime, timezone.utc)) if info.mtime else "-"
            self._out.write(f"\t{'-':15s} {size} {modified} {'-':24s} {key}\n")

    def mkdir(self, uri: S3Uri) -> None:
        """Create the bucket; an existing bucket of this identity is success."""
        if uri.bucket is None:
            raise CommandError(f"URL for mkdir must contain a bucket: {uri}")
        if uri.key is not None:
            raise CommandError(f"URL for mkdir cannot contain a key: {uri}")
        problem = new_bucket_problem(uri.bucket)
        if problem is not None:  # before any request: the store's answer (InvalidBucketName) says no why
            raise CommandError(f"mkdir {uri}: {problem}")
        self._backend(uri).make_dirs(uri.to_url())
        log.info("Bucket %s is ready for %s", uri.bucket, uri.ident)

    # -- rm -------------------------------------------------------------------------------

    def rm(self, urls: Sequence[str], force: bool = False) -> None:
        """Delete keys; wildcard keys are expanded. Without ``force`` every key must exist."""
        targets: List[S3Uri] = []
        missing: List[S3Uri] = []
        for uri in (parse_s3_uri(u) for u in urls):
            if uri.bucket is None:
                raise CommandError(f"URL for rm must contain a bucket: {uri}")
            if uri.key is None:
                raise CommandError(f"URL for rm must contain a key: {uri}")
            if has_wildcards(uri.key):
                matches = self._expand(uri)
                targets += matches
                found = bool(matches)
            else:
                targets.append(uri)
                found = force or self._exists(uri)
            if not found and not force:
                missing.append(uri)
        if missing:
            raise CommandError(f"Some keys to delete do not exist in bucket: {missing[0].bucket}; "
                               "use --force to ignore non existing keys")
        unique = {str(t): t for t in targets}
        log.info("Deleting %d keys", len(unique))
        self._run([Remove(t.to_url()) for t in unique.values()])

    def _expand(self, uri: S3Uri) -> List[S3Uri]:
        pattern = uri.key or ""
        literal = pattern[:min((pattern.index(c) for c in WILDCARDS if c in pattern), default=len(pattern))]
        return [uri.with_key(split_url(info.url).key) for info in self._list_prefix(uri, literal)
                if fnmatch.fnmatchcase(split_url(info.url).key, pattern)]

    def _exists(self, uri: S3Uri) -> bool:
        key = uri.key or ""
        directory = key.rpartition("/")[0]
        cache_key = (uri.ident, uri.bucket or "", directory)
        if cache_key not in self._listings:
            self._listings[cache_key] = {split_url(i.url).key for i in self._list_prefix(uri, directory)}
        return key in self._listings[cache_key]

    def _list_prefix(self, uri: S3Uri, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (all pages)."""
        directory = uri.with_key(prefix.rpartition("/")[0])
        try:
            for info in self._backend(uri).list(directory.to_url()):
                if split_url(info.url).key.startswith(prefix):
                    yield info
        except NotFound:
            raise CommandError(f"Invalid bucket: {uri.bucket}") from None

    # -- put / get / cp -------------------------------------------------------------------

    def put(self, source: str, url: str, *, force: bool = False, create_bucket: bool = False,
            recursive: bool = False) -> None:
        """Upload FILE (or, with ``recursive``, a directory tree) to URL."""
        path = local_path(source)
        uri = parse_s3_uri(url)
        if not os.path.exists(path):
            raise CommandError(f"No such file or directory: {path}")
        if uri.bucket is None:
            raise CommandError(f"URL for put must have a bucket: {url}")
        if os.path.isdir(path) and not recursive:
            raise CommandError(f"FILE: {path} is a directory. FILE must be a file.")
        pairs = _tree_pairs(path, uri) if os.path.isdir(path) else [(path, _put_target(path, uri))]
        if create_bucket:
            self._backend(uri).make_dirs(uri.to_url())
        if not force:
            for _, dest in pairs:
                if self._stat(dest):
                    raise CommandError(f"Key: {dest.key} already exists. Try --force to overwrite")
        self._run([Transfer((Url("file", "", os.path.abspath(p)),), d.to_url()) for p, d in pairs],
                  total=sum(os.path.getsize(p) for p, _ in pairs))

    def get(self, url: str, output: Optional[str] = None, *, recursive: bool = False) -> None:
        """Download URL to FILE (default: the key's basename in the current directory)."""
        uri = parse_s3_uri(url)
        if uri.bucket is None:
            raise CommandError(f"URL must contain a bucket: {url}")
        if uri.key is None and not recursive:
            raise CommandError(f"URL must contain a key: {url}")
        if recursive:
            pairs, size = self._download_tree(uri, output)
            self._run(_downloads(pairs), total=size)
            return
        name = os.path.basename((uri.key or "").rstrip("/"))
        target = local_path(output) if output else name
        if target.endswith("/"):
            target += name
        self._run(_downloads([(uri, target)]), sizes=lambda: self._size(uri))

    def _download_tree(self, uri: S3Uri, output: Optional[str]) -> Tuple[List[Tuple[S3Uri, str]], int]:
        """The keys under ``uri`` and their local paths, and the bytes of them all."""
        key = (uri.key or "").rstrip("/")
        root = local_path(output) if output else (os.path.basename(key) or uri.bucket or ".")
        pairs = []
        size = 0
        for info in self._list_prefix(uri, key):
            found = split_url(info.url).key
            if found == key or not key:
                pairs.append((uri.with_key(found), root if found == key else os.path.join(root, found)))
            elif found.startswith(key + "/"):
                pairs.append((uri.with_key(found), os.path.join(root, found[len(key) + 1:])))
            else:
                continue
            size += info.size
        return pairs, size

    def cp(self, sources: Sequence[str], dest: str, *, force: bool = False, create: bool = False,
           recursive: bool = False) -> None:
        """Server-side copies between keys of one identity."""
        dst = parse_s3_uri(dest)
        srcs = [parse_s3_uri(s) for s in sources]
        if len(srcs) > 1 and dst.key is not None:
            raise CommandError("Destination must be a bucket if there are multiple sources")
        if dst.bucket is None:
            raise CommandError(f"Destination URL does not contain a bucket: {dst}")
        pairs: List[Tuple[S3Uri, S3Uri]] = []
        for src in srcs:
            if src.ident != dst.ident:
                raise CommandError(f"Identities for source and destination do not match: {src} -> {dst}")
            if src.key is None and not recursive:
                raise CommandError(f"Source URL does not contain a key: {src}")
            pairs += self._copy_pairs(src, dst)
        if create:
            self._backend(dst).make_dirs(dst.to_url())
        if not force:
            for _, target in pairs:
                if self._stat(target):
                    raise CommandError(f"Key: {target.key} already exists in destination bucket: "
                                       f"{target.bucket}, (see --force)")
        self._run([Transfer((s.to_url(),), d.to_url()) for s, d in pairs],
                  sizes=lambda: sum(self._size(s) or 0 for s, _ in pairs) if len(pairs) <= _STAT_AT_MOST else None)

    def _copy_pairs(self, src: S3Uri, dst: S3Uri) -> List[Tuple[S3Uri, S3Uri]]:
        if src.key is None:
            return [(src.with_key(k), dst.with_key(k)) for k in
                    (split_url(i.url).key for i in self._list_prefix(src, ""))]
        key = dst.key or src.key
        if dst.key and dst.key.endswith("/"):
            key = dst.key + os.path.basename(src.key)
        return [(src, dst.with_key(key))]

    # -- plumbing -------------------------------------------------------------------------

    def _size(self, uri: S3Uri) -> Optional[int]:
        """The object's size, None if it is not there (the transfer then says so)."""
        try:
            return self._backend(uri).stat(uri.to_url()).size
        except NotFound:
            return None

    def _stat(self, uri: S3Uri) -> bool:
        try:
            self._backend(uri).stat(uri.to_url())
        except NotFound:
            return False
        return True

    # -- lsup / rmup (pegasus-s3 4.x) ------------------------------------------------------

    def lsup(self, uri: S3Uri) -> None:
        """Uploads in progress under the URL's key: initiated, upload id, key."""
        if uri.bucket is None:
            raise CommandError("lsup needs a bucket: s3://USER@SITE/BUCKET[/KEY]")
        for upload in list_uploads(self._backend(uri), uri.to_url()):
            self._out.write(f"\t{upload.initiated}\t{upload.upload_id}\t{upload.key}\n")

    def rmup(self, uri: S3Uri, upload_id: Optional[str], every: bool = False,
             older_than: Optional[float] = None) -> None:
        """Abort one upload (URL is its key) or, with ``every``, all uploads under the URL;
        with ``older_than`` (seconds), only those started longer ago than that (an upload of
        unknown start is kept)."""
        if uri.bucket is None:
            raise CommandError("rmup needs a bucket: s3://USER@SITE/BUCKET[/KEY]")
        if upload_id is None and not every:
            raise CommandError("rmup needs an UPLOAD id, or -a to abort every upload under the URL")
        if upload_id is not None and older_than is not None:
            raise CommandError("rmup --older-than goes with -a, not with an UPLOAD id")
        backend = self._backend(uri)
        if not isinstance(backend, MultipartUploads):
            raise CommandError("rmup needs an S3 endpoint")
        if upload_id is not None:
            found = [Upload(uri.key or "", upload_id, "-")]
        else:
            found = [upload for upload in list_uploads(backend, uri.to_url())
                     if older_than is None or (upload.age is not None and upload.age > older_than)]
        for upload in found:
            backend.abort_upload(uri.with_key(upload.key).to_url(), upload.upload_id)
            log.info("aborted upload %s of %s", upload.upload_id, upload.key)

    def _run(self, ops: Sequence[Operation], total: Optional[int] = None, sizes: Optional["Sizes"] = None) -> None:
        """Run the batch; a put, get or cp (``total``: its bytes, or ``sizes``: how to ask the
        store for them) under a reporter when there is a ``progress`` maker."""
        if self._watcher is not None:
            self._watcher.watch(self._engine, ops)
        if (total is None and sizes is None) or self._progress is None:
            results = self._engine.run(ops)
        else:
            with self._progress(len(ops), total, sizes) as self._shown:
                try:
                    results = self._engine.run(ops)
                finally:
                    self._shown = None
        failed = [r for r in results if not r.ok]
        for result in failed[1:]:  # the first is the command's error, printed once by the CLI
            log.error("%s", result.error)
        if failed:
            more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            raise CommandError(f"{failed[0].error}{more}")


def _downloads(pairs: Sequence[Tuple[S3Uri, str]]) -> List[Operation]:
    return [Transfer((u.to_url(),), Url("file", "", os.path.abspath(p))) for u, p in pairs]


def _put_target(path: str, uri: S3Uri) -> S3Uri:
    name = os.path.basename(path)
    key = uri.key or name
    return uri.with_key(key + name if key.endswith("/") else key)


def _tree_pairs(path: str, uri: S3Uri) -> List[Tuple[str, S3Uri]]:
    """Files under ``path`` and their keys under URL (4.x ``put -r`` naming)."""
    base = os.path.basename(os.path.abspath(path))
    prefix = uri.key or base
    if prefix.endswith("/"):
        prefix += base
    pairs = []
    for root, _dirs, files in os.walk(path):
        for name in sorted(files):
            full = os.path.join(root, name)
            pairs.append((full, uri.with_key(f"{prefix}/{os.path.relpath(full, path)}")))
    return pairs
