"""An fsspec filesystem on the transfer engine: ``fsspec.filesystem("cloudio", endpoint=...)``.

Registered through the ``fsspec.specs`` entry point as protocol ``cloudio`` (extra
``[fsspec]``); paths are ``bucket/key`` (or ``cloudio://bucket/key``) and name
``s3://bucket/key`` at the given endpoint (``scheme="gs"`` for GCS). Keyword arguments are
those of :class:`transfer.client.Client`.

Bulk ``get``/``put``/``copy``/``rm`` keep fsspec's own path expansion and then run every file
of the call as ONE engine batch (threads, warm pool, bundles, node cache), instead of fsspec's
file-by-file loop: the per-file methods only collect while a bulk call is in progress.
Bundle members are files to ``ls``/``info``/``open``/``cat``. Object stores have no empty
directories: ``mkdir`` of a bucket creates the bucket, other directories exist once
something is stored under them. Files opened for writing in ``with fs.transaction:`` are
stored when it ends, and none of them if it ends by an exception.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import posixpath
import tempfile
import threading
from typing import IO, Any, Callable, Dict, List, Optional, Tuple

from fsspec.caching import register_cache
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from transfer.backends.base import ExclusiveCreate, multipart_uploads
from transfer.client import Client
from transfer.errors import NotFound
from transfer.fsspec_streams import PartStream, ReadAhead
from transfer.listing import Entry
from transfer.urls import Url

__all__ = ["CloudioFileSystem"]

_Pair = Tuple[str, str]
register_cache(ReadAhead, clobber=True)  # clobber: a second import of this module is no conflict


class CloudioFileSystem(AbstractFileSystem):  # type: ignore[misc]  # fsspec is untyped
    """fsspec's interface over :class:`transfer.client.Client` (see the module doc)."""

    protocol = ("cloudio",)
    root_marker = ""

    def __init__(self, *args: Any, scheme: str = "s3", client: Optional[Client] = None, **kwargs: Any) -> None:
        client_args = {k: kwargs.pop(k) for k in list(kwargs) if k in _CLIENT_ARGS}
        super().__init__(*args, **kwargs)
        self.scheme = scheme
        self.client = client or Client(**client_args)
        self._collecting = threading.local()

    # -- paths ------------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = str(path)
        for prefix in ("cloudio://", "cloudio-async://", "cloudio::"):  # the async face's too: it hands paths on
            if text.startswith(prefix):
                text = text[len(prefix):]
        return text.rstrip("/")

    def _url(self, path: str) -> str:
        return f"{self.scheme}://{self._strip_protocol(path)}"

    def _name(self, entry: Entry) -> str:
        return entry.url.split("://", 1)[1].rstrip("/")

    def _details(self, entry: Entry) -> Dict[str, Any]:
        details = {"name": self._name(entry), "size": entry.size, "type": "directory" if entry.is_dir else "file",
                   "ETag": entry.version, "mtime": entry.mtime}
        if entry.metadata is not None:  # as s3fs names them
            details.update(ContentType=entry.content_type, CacheControl=entry.cache_control, Metadata=entry.metadata,
                           checksum=entry.checksum)
        return details

    def checksum(self, path: str) -> int:
        """Of the content: from the store's full-object checksum, else a single-part ETag (the
        MD5 of the bytes); else, as fsspec's, of the info (a multipart ETag, a local file)."""
        details = self._details(self.client.info(self._url(path)))
        etag = details.get("ETag") or ""
        if details.get("checksum"):
            return int(hashlib.md5(details["checksum"].encode()).hexdigest(), 16)
        if len(etag) == 32 and all(c in "0123456789abcdefABCDEF" for c in etag):
            return int(etag, 16)
        return int(super().checksum(path))

    # -- namespace --------------------------------------------------------------------

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> List[Any]:
        path = self._strip_protocol(path)
        cached = self.dircache.get(path)
        if cached is None:
            cached = [self._details(e) for e in self.client.list(self._url(path))]
            if not (len(cached) == 1 and cached[0]["name"] == path):  # a file lists as itself: not a directory
                self.dircache[path] = cached
        return cached if detail else [d["name"] for d in cached]

    def info(self, path: str, **kwargs: Any) -> Dict[str, Any]:
        path = self._strip_protocol(path)
        parent = self._parent(path)
        for item in self.dircache.get(parent, ()):
            if item["name"] == path:
                return dict(item)
        if path in self.dircache:
            return {"name": path, "size": 0, "type": "directory"}
        return self._details(self.client.info(self._url(path)))

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if "/" not in path:  # a bucket; deeper directories exist once something is under them
            self.client.mkdir(self._url(path))
            self.invalidate_cache()

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        path = self._strip_protocol(path)
        if not exist_ok and "/" in path and self.exists(path):
            raise FileExistsError(path)
        self.mkdir(path)

    def rmdir(self, path: str) -> None:
        """Delete an empty bucket (as s3fs does); a deeper prefix has nothing to remove: it
        disappears with its last object."""
        path = self._strip_protocol(path)
        if path and "/" not in path:
            self.invalidate_cache()
            self.client.remove_bucket(self._url(path))

    def modified(self, path: str) -> Any:
        import datetime

        mtime = self.info(path).get("mtime")
        if mtime is None:
            raise NotImplementedError("the store gave no modification time")
        return datetime.datetime.fromtimestamp(mtime, tz=datetime.timezone.utc)

    # -- bulk operations: fsspec's expansion, one engine batch ---------------------------

    def get(self, rpath: Any, lpath: Any, recursive: bool = False, **kwargs: Any) -> None:
        self._bulk(lambda: super(CloudioFileSystem, self).get(rpath, lpath, recursive=recursive, **kwargs),
                   self._run_get)

    def put(self, lpath: Any, rpath: Any, recursive: bool = False, **kwargs: Any) -> None:
        self._bulk(lambda: super(CloudioFileSystem, self).put(lpath, rpath, recursive=recursive, **kwargs),
                   self._run_put)

    def copy(self, path1: Any, path2: Any, recursive: bool = False, **kwargs: Any) -> None:
        self._bulk(lambda: super(CloudioFileSystem, self).copy(path1, path2, recursive=recursive, **kwargs),
                   self._run_copy)

    def get_file(self, rpath: str, lpath: Any, callback: Any = None, outfile: Any = None, **kwargs: Any) -> None:
        if not isinstance(lpath, (str, os.PathLike)):
            lpath.write(self.cat_file(rpath))
            return
        self._one((self._strip_protocol(rpath), _local(lpath)), self._run_get)

    def put_file(self, lpath: Any, rpath: str, callback: Any = None, mode: str = "overwrite", **kwargs: Any) -> None:
        if mode == "create":
            self._create(_local(lpath), rpath)
            return
        self._one((_local(lpath), self._strip_protocol(rpath)), self._run_put)

    def _create(self, local: str, path: str) -> None:
        """Store ``local`` as ``path`` only if no object has that name: FileExistsError
        otherwise. Atomic where the store can refuse a replacement (S3's ``If-None-Match: *``,
        :class:`~transfer.backends.base.ExclusiveCreate`); elsewhere checked just before."""
        self.invalidate_cache()
        url = self.client.url(self._url(path))
        backend = self.client.session.backend(url)
        if isinstance(backend, ExclusiveCreate):
            try:
                backend.put_new(local, url)
            finally:  # stored or refused, the node cache's entry of the name may be of another object
                self.client.forget(url)
            return
        if self.exists(path):
            raise FileExistsError(path)
        self.client.copy([(local, url)])

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        self._one((self._strip_protocol(path1), self._strip_protocol(path2)), self._run_copy)

    def rm(self, path: Any, recursive: bool = False, maxdepth: Optional[int] = None) -> None:
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        files = [p for p in paths if not self._known_dir(p)]
        self.invalidate_cache()
        if files:
            self.client.remove([self._url(p) for p in files])
        if recursive:  # fsspec's meaning: a bucket removed recursively goes too
            for bucket in [p for p in paths if p and "/" not in p]:
                self.rmdir(bucket)

    def rm_file(self, path: str) -> None:
        self.rm(path)

    def _bulk(self, expand: Callable[[], None], run: Callable[[List[_Pair]], None]) -> None:
        """Run fsspec's expansion with the per-file methods collecting, then one batch."""
        if getattr(self._collecting, "pairs", None) is not None:
            expand()  # nested: the outer call runs the batch
            return
        pairs: List[_Pair] = []
        self._collecting.pairs = pairs
        try:
            expand()
        finally:
            self._collecting.pairs = None
        if pairs:
            run(pairs)

    def _one(self, pair: _Pair, run: Callable[[List[_Pair]], None]) -> None:
        pairs = getattr(self._collecting, "pairs", None)
        if pairs is not None:
            pairs.append(pair)
        else:
            run([pair])

    def _run_get(self, pairs: List[_Pair]) -> None:
        files = []
        for rpath, lpath in pairs:
            if self._known_dir(rpath):
                os.makedirs(lpath, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(lpath) or ".", exist_ok=True)
                files.append((self._url(rpath), lpath))
        results = self.client.copy(files, check=False)
        for (rpath, lpath), result in zip(files, results):
            if not result.ok:
                if isinstance(result.error, NotFound) and self.isdir(rpath[len(self.scheme) + 3:]):
                    os.makedirs(lpath, exist_ok=True)
                    continue
                raise result.error  # type: ignore[misc]

    def _run_put(self, pairs: List[_Pair]) -> None:
        files = [(lpath, self._url(rpath)) for lpath, rpath in pairs if not os.path.isdir(lpath)]
        self.invalidate_cache()
        self.client.copy(files)

    def _run_copy(self, pairs: List[_Pair]) -> None:
        files = [(self._url(a), self._url(b)) for a, b in pairs if not self._known_dir(a)]
        self.invalidate_cache()
        self.client.copy(files)

    def _known_dir(self, path: str) -> bool:
        """Whether a listing this filesystem already made shows ``path`` as a directory."""
        path = self._strip_protocol(path)
        if path in self.dircache:
            return True
        return any(item["name"] == path and item["type"] == "directory"
                   for item in self.dircache.get(self._parent(path), ()))

    # -- single objects ---------------------------------------------------------------

    def cat_file(self, path: str, start: Optional[int] = None, end: Optional[int] = None, **kwargs: Any) -> bytes:
        url, pin = self._url(path), None
        if start is not None and start < 0 or end is not None and end < 0:
            pin = self.client.info(url)  # the store's size (a listing may be stale), and the read pinned to it
            start = None if start is None else max(0, pin.size + start) if start < 0 else start
            end = None if end is None else max(0, pin.size + end) if end < 0 else end
        return self.client.read_bytes(url, start, end, pin=pin)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        if mode == "create" or self._intrans:  # through a file ("xb": created only if absent), which a
            with self.open(path, "xb" if mode == "create" else "wb") as fh:  # transaction stores when it ends
                fh.write(value)
            return
        self.invalidate_cache()
        self.client.write_bytes(self._url(path), bytes(value), **_attributes(kwargs))

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> "CloudioFile":
        if "x" in mode and self.exists(path):
            raise FileExistsError(path)
        if mode == "rb":
            kwargs.setdefault("cache_type", ReadAhead.name)
            details = self.info(path)
            if details["type"] == "directory":  # size 0: it would read as an empty file
                raise IsADirectoryError(f"{self._strip_protocol(path)}: is a directory, not a file")
            kwargs["size"] = details["size"]
        if mode == "wb":  # a streamed part smaller than 5 MiB would fail at the end (S3's smallest part)
            block_size = max(block_size or 0, _MIN_PART)
        made = CloudioFile(self, path, mode.replace("x", "w"), block_size or "default", autocommit,
                           cache_options=cache_options, **kwargs)
        made.exclusive = "x" in mode  # stored only if the name is still free when it is stored
        if mode == "rb":
            made.details = details
        return made

    def sign(self, path: str, expiration: int = 100, **kwargs: Any) -> str:
        """A presigned GET URL (``method="PUT"`` for an upload) valid ``expiration`` seconds
        (:meth:`transfer.client.Client.presign`)."""
        return self.client.presign(self._url(path), kwargs.get("method", "GET"), int(expiration))

    def invalidate_cache(self, path: Optional[str] = None) -> None:
        self.dircache.clear()


class CloudioFile(AbstractBufferedFile):  # type: ignore[misc]
    """Reads are ranged GETs of the version opened (an object replaced meanwhile raises rather
    than mix two versions; bundle members: the member's bytes). A plain ``"wb"`` file on a
    store with multipart uploads (S3) streams: each block (at least 5 MiB, S3's smallest part)
    is sent from memory as a part when it fills, so memory holds about one block and no local
    file is written; an object that fits one block is one PUT at close. Other writes (``"xb"``,
    in a transaction, other stores) are spooled to a temporary file and stored as one object
    (one engine transfer) when the file is closed. Appending (``"ab"``) spools the stored bytes
    first, so the object keeps them."""

    _spool: IO[bytes]
    _stream: Optional[PartStream] = None  # None: this file spools
    _decided = False  # whether it streams is decided at its first block
    exclusive = False  # opened "xb": stored with _create, never over an object that appeared

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.mode == "ab":
            self._initiate_upload()
            self.loc = os.path.getsize(self._spool.name)

    def _fetch_range(self, start: int, end: int) -> bytes:
        if start >= self.size:
            return b""
        url = self.fs._url(self.path)  # every block from the version opened: a replaced object fails
        pin = Entry(url, posixpath.basename(url), self.size, False, self.details.get("ETag"))
        data: bytes = self.fs.client.read_bytes(url, start, min(end, self.size), pin=pin)
        return data

    def _part_stream(self) -> Optional[PartStream]:
        """This file's part stream, or None when it spools (see the class doc)."""
        if not self._decided:
            self._decided = True
            if self.mode == "wb" and not self.exclusive and self.autocommit:
                url = self.fs.client.url(self.fs._url(self.path))
                parts = multipart_uploads(self.fs.client.session.backend(url))
                if parts is not None:
                    self._stream = PartStream(parts, url)
        return self._stream

    def _send_part(self, stream: PartStream, final: bool) -> bool:
        data = self.buffer.getvalue()
        try:
            if final and stream.upload_id is None:  # it all fitted one block: one plain PUT
                self.fs.invalidate_cache()
                self.fs.client.write_bytes(stream.url, data)
                return True
            if data or not final:
                stream.send(data)
            if final:
                stream.finish()
        except BaseException:
            stream.abort()
            raise
        if final:
            self.fs.invalidate_cache()
            self.fs.client.forget(stream.url)
        return True

    def _initiate_upload(self) -> None:
        if self._part_stream() is not None:
            return  # parts are sent as they fill
        if hasattr(self, "_spool"):
            return  # appending: made when the file was opened
        self._spool = tempfile.NamedTemporaryFile(prefix="pegasus-cloudio-", delete=False)
        if self.mode == "ab":
            self._spool.close()
            [stored] = self.fs.client.copy([(self.fs._url(self.path), self._spool.name)], check=False)
            if not stored.ok and not isinstance(stored.error, NotFound):  # absent: the append creates it
                os.unlink(self._spool.name)
                raise stored.error
            self._spool = open(self._spool.name, "ab")

    def _upload_chunk(self, final: bool = False) -> bool:
        stream = self._part_stream()
        if stream is not None:
            return self._send_part(stream, final)
        if not hasattr(self, "_spool"):
            self._initiate_upload()
        self._spool.write(self.buffer.getvalue())
        if final:
            self._spool.close()
            if self.autocommit:  # else in a transaction: stored by commit() when it ends
                self.commit()
        return True

    def commit(self) -> None:
        try:
            self.fs.invalidate_cache()
            if self.exclusive:
                self.fs._create(self._spool.name, self.path)
            else:
                self.fs.client.copy([(self._spool.name, self.fs._url(self.path))])
        finally:
            os.unlink(self._spool.name)

    def discard(self) -> None:
        if self._stream is not None:
            self._stream.abort()
        spool = getattr(self, "_spool", None)
        if spool is not None:
            spool.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(spool.name)


def _attributes(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The Client's attribute arguments from s3fs's names for them (``ContentType``,
    ``CacheControl``, ``Metadata``); nothing when none is given."""
    names = {"ContentType": "content_type", "CacheControl": "cache_control", "Metadata": "metadata"}
    return {ours: kwargs[theirs] for theirs, ours in names.items() if kwargs.get(theirs) is not None}


def _local(path: Any) -> str:
    """A local path as the Client must get it: absolute, so never taken for a URL ('file:x',
    'a:b' are file names here); a trailing separator (a directory) kept."""
    text: str = os.fspath(path)
    return os.path.abspath(text) + (os.sep if text.endswith(os.sep) else "")


_MIN_PART = 5 << 20  # S3's smallest part but the last
_CLIENT_ARGS = frozenset(inspect.signature(Client).parameters)  # all of them, as the module doc says
