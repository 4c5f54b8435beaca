"""S3 (and S3-compatible stores) over persistent HTTP connections, signed with SigV4.

URLs: ``s3://USER@SITE/BUCKET/KEY`` (``s3s://`` alike), resolved against the Pegasus
credentials file of the URL's site label, and AWS-style ``s3://BUCKET/KEY``, resolved by the
AWS credential chain. TLS is verified; plain HTTP is used only when the configured endpoint
is ``http://``. ``s3s://`` is ``s3://``: the endpoint's scheme decides the transport, as in both
stock tools (``pegasus-s3`` and the Go ``pegasus-transfer``); an ``http://`` endpoint under ``s3s://``
gets one warning per backend opened, so once a run. Proxies are taken from the
environment as botocore (stock ``pegasus-s3``'s library) takes them
(:func:`~transfer.http.proxy.boto_proxy_for`).

A download is one GET (no HEAD first), checked against Content-Length and, for single-part
objects, the MD5 ETag; for large objects the engine adds ranged GETs pinned to the first
GET's ETag (:class:`~transfer.backends.base.RangedReads`, see :mod:`transfer.ranged`). Uploads are one PUT with Content-MD5 and the full-object ``x-amz-checksum-crc32`` (kept with the object, so ``info`` has it) below the multipart threshold (:mod:`transfer.backends._s3_put`, whose checks the pipelined PUTs of a batch send too);
above it the engine drives :class:`MultipartUploads` (:mod:`transfer.backends._s3_multipart`: each
part's CRC32 checked by the store, and the whole object's CRC32 kept with it where the store takes
``FULL_OBJECT`` checksums). Listings: :mod:`transfer.backends._s3_listing`. Deletes go 1,000 keys
per request.
"""

from __future__ import annotations

import binascii
import sys

from transfer import _digests
from transfer.lean import logger
from transfer.backends._s3_wire import (
    S3Path,
    _info,
    _range_length,
    check_bucket,
    check_endpoint,
    default_endpoint,
    etag_md5,
    iso8601_epoch,
    s3_error,
    split_url,
    virtual_hosted,
    xml_escape,
    xml_tree,
)
from transfer.backends._s3_checksum import CHECKSUM_MODE, response_check, stored_checksum
from transfer.backends._s3_route import AnyReply, PoolFactory, Router, check_reply
from transfer.backends._sigv4 import EMPTY_SHA256
from transfer.backends._wire_common import canonical_query, http_date_epoch, uri_encode_path
from transfer.backends.base import Attributes, BodyStream, ByteRange, ObjectInfo
from transfer.config import Settings
from transfer.credentials import (
    CredentialSource,
    Credentials,
    S3SiteConfig,
    pegasus_credentials_path,
    pegasus_s3_config,
)
from transfer.errors import (
    ChecksumMismatch, ConfigError, InvalidInput, NotFound, RemoteError, TransferError,
)
from transfer.http.connection import Body, FileRegion
from transfer.http.pool import ConnectionPool, PooledResponse
from transfer.http.resume import ResumingBody, read_range, send_idempotent
from transfer.backends.opening import Opening
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from transfer.backends._s3_multipart import S3Multipart
    from typing import BinaryIO, Callable, Dict, Hashable, Iterator, List, Optional, Sequence, Tuple, Union

    from transfer._threads import Cancel
    from transfer.backends.base import PendingUpload, Stored, Take
    from transfer.http.proxy import Proxy
    from transfer.peer_scope import Scope

__all__ = ["S3At", "S3Backend", "S3Path", "check_bucket", "default_endpoint", "open_backend", "split_url",
           "virtual_hosted"]
# imported inside methods, not above (a job that needs none never loads them); a process that forks
# jobs imports them ahead (the node stager's preload follows every loaded module's DEFERRED)
DEFERRED = ("transfer.backends._s3_put", "transfer.backends._s3_listing", "transfer.backends._s3_pipelined")
_log = logger(__name__)  # logging is imported only when a warning is written


def _site_config(url: Url, context: Opening) -> S3SiteConfig:
    if "@" in url.host:
        return pegasus_s3_config(context.pegasus_credentials(url.site_label), url.host)
    from transfer.backends.aws_chain import aws_s3_config  # only AWS-style URLs pay for the chain's imports

    return aws_s3_config(context.env)


def endpoint_key(url: Url, context: Opening) -> Hashable:
    if "@" in url.host:
        return ("pegasus", pegasus_credentials_path(url.site_label, context.env), url.host.lower(),
                url.scheme)
    return ("aws", url.scheme)


def open_backend(url: Url, context: Opening) -> "S3Backend":
    return _open(url, _site_config(url, context), context)


class S3At:
    """Opens plain ``s3://BUCKET/KEY`` URLs at a given endpoint with given keys (or unsigned,
    or through the AWS chain of the session's environment when ``credentials`` is None and
    ``anonymous`` is false), for :class:`~transfer.session.Session`'s ``backends`` argument.
    ``s3://USER@SITE/...`` URLs keep their Pegasus credentials file."""

    def __init__(self, endpoint: Optional[str] = None, region: Optional[str] = None,
                 credentials: Optional[Credentials] = None, anonymous: bool = False) -> None:
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        self.region = region
        self.credentials = credentials
        self.anonymous = anonymous

    def endpoint_key(self, url: Url, context: Opening) -> Hashable:
        return endpoint_key(url, context)

    def open_backend(self, url: Url, context: Opening) -> "S3Backend":
        if "@" in url.host:
            return open_backend(url, context)
        config = S3SiteConfig(self.endpoint, self.region, self.credentials, where="the endpoint argument")
        if self.credentials is None and not self.anonymous:
            chain = _site_config(url, context)
            config = S3SiteConfig(self.endpoint or chain.endpoint, self.region or chain.region, chain.credentials,
                                  source=chain.source, where=chain.where)
        return _open(url, config, context)


def _open(url: Url, config: S3SiteConfig, context: Opening) -> "S3Backend":
    region = config.region or "us-east-1"
    endpoint = config.endpoint or default_endpoint(region)
    check_endpoint(endpoint, region, config.where)
    _story(url, config, endpoint, region)
    if url.scheme == "s3s" and not endpoint.startswith("https://"):
        # Pegasus's own 030-pegasuslite-s3 names s3s:// on http sites; refusing it failed the workflow
        _log.warning("s3s:// %s: the endpoint %s (%s) is plain http, so the data goes unencrypted, as with "
                     "the stock tools", url.host, endpoint, config.where)
    env = context.env

    def proxy(base_url: str) -> Optional[Proxy]:
        """botocore's choice for a client of ``endpoint`` (the bypass is the endpoint's)."""
        if not any(name[-6:].lower() == "_proxy" for name in env):
            return None  # no proxy variable (most jobs): the proxy module is not even imported
        from transfer.http.proxy import boto_proxy_for
        return boto_proxy_for(base_url.partition(":")[0].lower(), endpoint, env)

    pool = ConnectionPool(
        endpoint, max_idle=context.settings.threads + 2, max_open=context.settings.threads + 2,
        ssl_context=context.ssl_context() if endpoint.startswith("https://") else None,
        timeouts=context.timeouts, stats=context.stats, proxy=proxy(endpoint))
    return S3Backend(pool, config, region, context.settings,
                     pool_for=lambda base_url: pool.sibling(base_url, proxy(base_url)))


def _story(url: Url, config: S3SiteConfig, endpoint: str, region: str) -> None:
    """What ``-d`` tells of an S3 endpoint opened: where endpoint and keys came from, and the
    addressing style; never a key. Only where a command turned logging on (``logging`` is not
    imported for it: start-up time)."""
    logging = sys.modules.get("logging")
    if logging is None or not logging.getLogger(__name__).isEnabledFor(logging.DEBUG):
        return
    host = endpoint.partition("://")[2].split("/", 1)[0].rsplit(":", 1)[0]
    style = ("virtual-hosted-style addressing (bucket in the Host) for DNS-style bucket names, else path-style"
             if host.endswith(".amazonaws.com") else "path-style addressing (bucket in the path)")
    keys = (f"section [{url.host}] of the same file" if "@" in url.host else
            "given by the caller" if config.credentials is not None and config.source is None else
            "the AWS credential chain")
    logging.getLogger(__name__).debug("%s://%s: endpoint %s from %s, region %s, %s, keys from %s",
                                      url.scheme, url.host, endpoint, config.where or "the default", region, style,
                                      keys)


class S3Backend:
    """One S3 endpoint with one set of credentials. Thread-safe.

    ``pool_for(endpoint)`` makes the pools of other regions' endpoints and of redirect
    targets (see :mod:`transfer.backends._s3_route`); by default they copy ``pool``'s settings.
    """

    def __init__(self, pool: ConnectionPool, config: S3SiteConfig, region: str, settings: Settings,
                 pool_for: Optional[PoolFactory] = None):
        self._pool = pool
        self._config = config
        self._region = region
        amazon = config.endpoint is None or pool.host.endswith(".amazonaws.com")
        source = config.source or (_fixed(config.credentials) if config.credentials else None)
        self._credentials = source
        self._scopes: Dict[Tuple[Credentials, str], Scope] = {}  # a few entries: one per bucket read
        self._router = Router(pool, region, source, pool_for or pool.sibling, amazon_default=amazon)
        self._multipart_steps: Optional[S3Multipart] = None  # made on first use (_multipart)
        self.multipart_threshold = settings.multipart_threshold
        self.part_size = settings.multipart_part_size
        self.orphan_age = settings.multipart_orphan_age

    @property
    def _multipart(self) -> "S3Multipart":
        """The multipart steps, their module imported on first use: a one-file job never loads
        it (``tests/test_startup_imports.py``). Stateless beside the router, so two threads that
        each make one are harmless."""
        steps = self._multipart_steps
        if steps is None:
            from transfer.backends._s3_multipart import S3Multipart
            steps = self._multipart_steps = S3Multipart(self._router)
        return steps

    # -- request plumbing ---------------------------------------------------------------

    def _target(self, path: S3Path) -> Tuple[str, str]:
        """(host header, encoded path) for path-style or virtual-hosted addressing."""
        return self._router.for_bucket(path.bucket).target(path)

    def _send(self, method: str, path: S3Path, *, query: Optional[Dict[str, str]] = None,
              headers: Optional[List[Tuple[str, str]]] = None, body: Body = None,
              payload_hash: str = EMPTY_SHA256, url: str = "") -> AnyReply:
        query_text = canonical_query(query) if query else ""
        return self._router.send(method, path, query_text, headers or [], body, payload_hash, url)

    _check = staticmethod(check_reply)

    # -- Backend ------------------------------------------------------------------------

    def stat(self, url: Url) -> ObjectInfo:
        """One HEAD asking for the full-object checksum too (``x-amz-checksum-mode``)."""
        path = split_url(url)
        with self._send("HEAD", path, headers=[CHECKSUM_MODE], url=str(url)) as response:
            self._check(response, str(url), "stat")
            info = _info(url, response.status, response.headers)
            return ObjectInfo(info.url, info.size, info.version, http_date_epoch(response.headers.get("last-modified")),
                              _attributes(response.headers))

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        """Stream the object (or ``byte_range``) to ``sink``; a full object is verified against
        its checksum header or MD5 ETag (see :mod:`transfer.backends._s3_checksum`). A body
        cut short is resumed from the byte it reached (:mod:`transfer.http.resume`)."""
        path = split_url(url)
        text = str(url)
        headers = [("Range", f"bytes={byte_range[0]}-{byte_range[1] - 1}")] if byte_range else [CHECKSUM_MODE]
        with send_idempotent(lambda: self._send("GET", path, headers=headers, url=text), text) as response:
            self._check(response, text, "get", ok=(206,) if byte_range else (200,))
            info = _info(url, response.status, response.headers)
            check = None if byte_range else response_check(response.headers, etag_md5(info, response.headers), info.size)
            body = self._body(response, url, byte_range[0] if byte_range else 0, info.size)
            if check is not None:
                write, update = sink.write, check.update

                def tee(data: bytes) -> None:
                    update(data)
                    write(data)

                count = body.read_into(tee)
                if not check.matches():
                    raise ChecksumMismatch(f"{check.name.upper()} of received bytes differs from the store's",
                                           url=text, operation="get")
            else:
                count = body.read_into(sink.write)
        expected = _range_length(response.headers, byte_range) if byte_range else info.size
        if count != expected:
            raise ChecksumMismatch(f"received {count} bytes, expected {expected}", url=text,
                                   operation="get")
        return info

    def _body(self, response: AnyReply, url: Url, first: int, size: int) -> "ResumingBody":
        """``response``'s body (bytes ``first`` onwards of an object of ``size`` bytes), resumed
        after a cut with ranged GETs pinned to its ETag; not resumed without an ETag or a length."""
        length = response.headers.get("content-length", "")
        etag = response.headers.get("etag", "").strip('"')
        end = first + int(length) if length.isdigit() else size
        if not isinstance(response, PooledResponse):
            raise RemoteError(f"unexpected HTTP {response.status} answer", url=str(url), operation="get")
        path = split_url(url)

        def reopen(offset: int) -> PooledResponse:
            return self._rest(url, path, (offset, end), etag, size)
        return ResumingBody(response, reopen if etag and length.isdigit() else None, first, end, str(url))

    def put(self, path: str, url: Url) -> ObjectInfo:
        return self._put(path, url, exclusive=False)

    def put_new(self, path: str, url: Url) -> ObjectInfo:
        """``ExclusiveCreate``: a PUT with ``If-None-Match: *``, which the store answers 412
        when the key exists (AWS S3 since 2024, MinIO)."""
        return self._put(path, url, exclusive=True)

    def put_if_match(self, path: str, url: Url, version: str) -> ObjectInfo:
        """``ConditionalPuts``: a PUT with ``If-Match``, which the store answers 412 when the
        object's ETag is no longer ``version`` (or it is gone: 404 on MinIO, 412 on AWS)."""
        return self._put(path, url, exclusive=False, if_match=version)

    def put_with(self, path: str, url: Url, attributes: Attributes, *, if_none_match: bool = False,
                 if_match: Optional[str] = None) -> ObjectInfo:
        """``AttributedPuts``: one PUT with ``Content-Type``, ``Cache-Control`` and
        ``x-amz-meta-*`` headers (metadata names and values in ASCII, S3's rule for headers)."""
        headers = [(name, value) for name, value in (("Content-Type", attributes.content_type),
                                                     ("Cache-Control", attributes.cache_control)) if value]
        headers += [(f"x-amz-meta-{name}", value) for name, value in attributes.metadata]
        return self._put(path, url, exclusive=if_none_match, if_match=if_match, extra=headers)

    def _put(self, path: str, url: Url, exclusive: bool, if_match: Optional[str] = None,
             extra: Sequence[Tuple[str, str]] = ()) -> ObjectInfo:
        from transfer.backends._s3_put import put_file  # uploads only: a stage-in never loads it
        return put_file(self._router, path, url, exclusive, if_match, extra)

    # -- listings (:mod:`transfer.backends._s3_listing`) --------------------------------

    def list(self, url: Url) -> Iterator[ObjectInfo]:
        from transfer.backends._s3_listing import list_pages, page_objects  # not on a one-file job's path

        for page in list_pages(self._router, url, delimiter=None):
            yield from page_objects(url, page)
            del page  # not held while the next page is asked for

    def list_dir(self, url: Url) -> Tuple[List[ObjectInfo], List[Url]]:
        """One level under ``url`` (ListObjectsV2 with delimiter ``/``): (objects, sub-prefixes,
        each ending in ``/``)."""
        objects: List[ObjectInfo] = []
        prefixes: List[Url] = []
        for found, subs in self.list_dir_pages(url):
            objects.extend(found)
            prefixes.extend(subs)
        return objects, prefixes

    def list_dir_pages(self, url: Url, start_after: str = "") -> Iterator[Tuple[List[ObjectInfo], List[Url]]]:
        """``PagedListing``: :meth:`list_dir` a page (up to 1,000 names) per request, each
        request sent when the page before it has been taken."""
        from transfer.backends._s3_listing import dir_page, list_pages  # not on a one-file job's path

        for page in list_pages(self._router, url, delimiter="/", start_after=start_after):
            yield dir_page(url, page)
            del page  # not held while the next page is asked for

    def delete(self, urls: Sequence[Url]) -> List[Optional[TransferError]]:
        results: List[Optional[TransferError]] = [None] * len(urls)
        by_bucket: Dict[str, List[int]] = {}
        for index, url in enumerate(urls):
            by_bucket.setdefault(split_url(url).bucket, []).append(index)
        size = self._config.batch_delete_size if self._config.batch_delete else 1
        for bucket, indexes in by_bucket.items():
            for start in range(0, len(indexes), size):
                batch = indexes[start:start + size]
                try:
                    errors = self._delete_batch(bucket, [split_url(urls[i]).key for i in batch])
                except TransferError as err:
                    errors = {split_url(urls[i]).key: err for i in batch}
                for i in batch:
                    results[i] = errors.get(split_url(urls[i]).key)
        return results

    def _delete_batch(self, bucket: str, keys: List[str]) -> Dict[str, TransferError]:
        objects = "".join(f"<Object><Key>{xml_escape(k)}</Key></Object>" for k in keys)
        body = f'<?xml version="1.0" encoding="UTF-8"?><Delete><Quiet>true</Quiet>{objects}</Delete>'.encode()
        headers = [("Content-MD5", binascii.b2a_base64(_digests.md5(body), newline=False).decode()),
                   ("Content-Type", "application/xml")]
        url = f"s3 bucket {bucket}"
        with self._send("POST", S3Path(bucket, ""), query={"delete": ""}, headers=headers, body=body,
                        payload_hash=_digests.sha256_hex(body), url=url) as response:
            self._check(response, url, "delete")
            root = xml_tree(response.read())
        errors: Dict[str, TransferError] = {}
        for item in root.iter("Error"):
            key = item.findtext("Key") or ""
            errors[key] = s3_error(403 if item.findtext("Code") == "AccessDenied" else 500, b"",
                                    key, "delete", code=item.findtext("Code"),
                                    message=item.findtext("Message"))
        return errors

    def make_dirs(self, url: Url) -> None:
        bucket = S3Path(split_url(url).bucket, "")
        with self._send("HEAD", bucket, url=str(url)) as response:
            if response.status == 200:
                return
        body = b""
        if self._region != "us-east-1":
            body = (f"<CreateBucketConfiguration><LocationConstraint>{self._region}"
                    f"</LocationConstraint></CreateBucketConfiguration>").encode()
        with self._send("PUT", bucket, body=body, payload_hash=_digests.sha256_hex(body),
                        url=str(url)) as response:
            if response.status == 409:
                text = response.read()
                if b"BucketAlreadyOwnedByYou" in text:
                    return
                raise s3_error(409, text, str(url), "mkdir")
            self._check(response, str(url), "mkdir")

    def remove_bucket(self, url: Url) -> None:
        """``BucketRemoval``: DeleteBucket (404 NotFound, 409 BucketNotEmpty raise)."""
        with self._send("DELETE", S3Path(split_url(url).bucket, ""), url=str(url)) as response:
            self._check(response, str(url), "remove", ok=(200, 204))

    def names_bucket(self, url: Url) -> bool:
        """``Buckets``: no key past the bucket."""
        return split_url(url).key.strip("/") == ""

    def bucket_exists(self, url: Url) -> bool:
        """``Buckets``: HeadBucket; 404 is False, other failures raise (403: AuthError)."""
        with self._send("HEAD", S3Path(split_url(url).bucket, ""), url=str(url)) as response:
            if response.status == 404:
                return False
            self._check(response, str(url), "stat")
        return True

    def list_buckets(self) -> List[str]:
        """Names of the buckets the identity owns (ListBuckets), in the store's order."""
        with self._send("GET", S3Path("", ""), url="s3 buckets") as response:
            self._check(response, "s3 buckets", "list")
            tree = xml_tree(response.read())
        return [item.findtext("Name") or "" for item in tree.iter("Bucket")]

    def close(self) -> None:
        for pool in self._router.pools():
            pool.close()

    def cache_key(self, url: Url) -> str:
        path = split_url(url)
        return f"{self._pool.base_url}/{path.bucket}/{path.key}"

    # -- PeerScopes ---------------------------------------------------------------------

    def peer_scope(self, url: Url) -> Optional[Scope]:
        """Derived from the secret key of this backend's credentials, the endpoint, the key
        id and the bucket (rotating credentials give a new scope at each rotation)."""
        creds = self._credentials() if self._credentials is not None else None
        if creds is None or not creds.secret_key:
            return None
        bucket = split_url(url).bucket
        known = self._scopes.get((creds, bucket))
        if known is None:  # one derivation per identity and bucket, not per file
            from transfer.peer_scope import derive_scope  # peer sharing only
            known = derive_scope(creds.secret_key, "s3", self._pool.base_url, creds.access_key, bucket)
            self._scopes[(creds, bucket)] = known
        return known

    # -- RangedReads --------------------------------------------------------------------

    def open_read(self, url: Url) -> BodyStream:
        text = str(url)  # once: every small download passes here
        response = send_idempotent(lambda: self._send("GET", split_url(url), headers=[CHECKSUM_MODE], url=text), text)
        try:
            self._check(response, text, "get")
            info = _info(url, response.status, response.headers)
            body = self._body(response, url, 0, info.size)
        except BaseException:
            response.discard()
            raise
        return BodyStream(body, info, response_check(response.headers, etag_md5(info, response.headers), info.size))

    def get_range(self, url: Url, byte_range: ByteRange, version: str, size: int,
                  write: Callable[[bytes], object]) -> int:
        """If-Match pins the version; the answer's Content-Range and ETag are checked too, for
        stores that ignore If-Match. A cut is resumed from the byte it reached, pinned the same way."""
        first, end = byte_range
        path = split_url(url)

        return read_range(lambda offset: self._rest(url, path, (offset, end), version, size), first, end, str(url),
                          write)

    def _rest(self, url: Url, path: S3Path, byte_range: ByteRange, version: str, size: int) -> PooledResponse:
        """The answer for ``byte_range`` of version ``version`` (an object of ``size`` bytes),
        body unread; RemoteError if the object changed (412, or a store that ignores If-Match
        answering another ETag or span)."""
        first, end = byte_range
        headers = [("Range", f"bytes={first}-{end - 1}"), ("If-Match", f'"{version}"')]
        response = self._send("GET", path, headers=headers, url=str(url))
        span, etag = response.headers.get("content-range", ""), response.headers.get("etag", "").strip('"')
        try:
            if response.status == 412 or (response.status == 206 and (
                    span != f"bytes {first}-{end - 1}/{size}" or etag != version)):
                raise RemoteError(f"the object changed while being read (asked ETag {version}, {size} bytes; "
                                  f"got HTTP {response.status}, ETag {etag or '-'}, {span or 'no range'})",
                                  url=str(url), operation="get", status=response.status)
            self._check(response, str(url), "get", ok=(206,))
            if not isinstance(response, PooledResponse):
                raise RemoteError(f"unexpected HTTP {response.status} answer", url=str(url), operation="get")
        except BaseException:
            response.discard()
            raise
        return response

    # -- BatchReads ---------------------------------------------------------------------

    def read_small(self, urls: Sequence[Url], take: Take, *, connections: int, cancel: Optional[Cancel] = None,
                   missing: Optional[Callable[[int], bool]] = None, depth: Optional[int] = None,
                   eager: bool = False, throttled: Optional[Callable[[float], None]] = None,
                   draw: Optional[Callable[[], None]] = None) -> List[int]:
        """Pipelined GETs (:mod:`transfer.http.pipeline`) of objects up to 1 MiB, grouped by
        the route of their bucket; see :class:`~transfer.backends.base.BatchReads` and
        :mod:`transfer.backends._s3_pipelined`."""
        from transfer.backends._s3_pipelined import read_small  # batches of small files only
        return read_small(self._router, urls, take, connections, cancel, missing, depth, eager, throttled, draw)

    # -- BatchWrites --------------------------------------------------------------------

    def write_small(self, items: Sequence[Tuple[str, Url]], stored: Stored, *, connections: int,
                    cancel: Optional[Cancel] = None, throttled: Optional[Callable[[float], None]] = None,
                    draw: Optional[Callable[[], None]] = None) -> List[int]:
        """Pipelined PUTs (:mod:`transfer.http.pipeline`) of files below 1 MiB and the multipart
        threshold; see :class:`~transfer.backends.base.BatchWrites` and
        :mod:`transfer.backends._s3_pipelined`."""
        from transfer.backends._s3_pipelined import write_small  # batches of small files only
        return write_small(self._router, items, stored, connections, cancel, throttled,
                           self.multipart_threshold - 1, draw)

    # -- DialsAhead ---------------------------------------------------------------------

    def dial_ahead(self, url: Url, connections: int) -> None:
        """Connections to the route of ``url``'s bucket (:meth:`ConnectionPool.dial_ahead`)."""
        try:
            bucket = split_url(url).bucket
        except TransferError:
            return
        self._router.for_bucket(bucket).pool.dial_ahead(connections)

    # -- ServerSideCopy -----------------------------------------------------------------

    def copy(self, source: Url, dest: Url, draw: Optional[Callable[[], None]] = None) -> ObjectInfo:
        """CopyObject, then a HEAD for what was stored (``draw`` before it: ``ServerSideCopy``)."""
        src, dst = split_url(source), split_url(dest)
        copy_source = uri_encode_path(f"{src.bucket}/{src.key}")
        with self._send("PUT", dst, headers=[("x-amz-copy-source", copy_source)], url=str(dest)) as response:
            self._check(response, str(dest), "copy")
            text = response.read()
        if b"<Error>" in text:  # S3 may report a failed copy inside a 200 response
            raise s3_error(500, text, str(dest), "copy")
        if draw is not None:
            draw()
        return self.stat(dest)

    # -- Presigns -----------------------------------------------------------------------

    def presign(self, url: Url, method: str, expires: int) -> str:
        """``Presigns``: a URL anyone may ``method`` (GET or PUT) for ``expires`` seconds,
        addressed as this backend addresses the bucket (path-style or virtual-hosted)."""
        route = self._router.for_bucket(split_url(url).bucket)
        if route.signer is None:
            raise InvalidInput("anonymous: there are no keys to sign a URL with", url=str(url), operation="presign")
        host, encoded = route.target(split_url(url))
        return f"{route.pool.scheme}://{host}{encoded}?{route.signer.presign(method, host, encoded, expires)}"

    # -- Touches ------------------------------------------------------------------------

    def touch(self, url: Url) -> ObjectInfo:
        """``Touches``: a copy of the object onto itself, which S3 allows only with new
        metadata (``REPLACE``): its attributes are sent again as a HEAD gave them, so none is
        lost. Objects up to 5 GiB (CopyObject's limit)."""
        path, text = split_url(url), str(url)
        with self._send("HEAD", path, url=text) as response:
            self._check(response, text, "touch")
            kept = [(name, value) for name, value in response.headers.items()
                    if name in _ATTRIBUTE_HEADERS or name.startswith("x-amz-meta-")]
        headers = [("x-amz-copy-source", uri_encode_path(f"{path.bucket}/{path.key}")),
                   ("x-amz-metadata-directive", "REPLACE"), *kept]
        with self._send("PUT", path, headers=headers, url=text) as response:
            self._check(response, text, "touch")
            answer = response.read()
        if b"<Error>" in answer:  # S3 may report a failed copy inside a 200 response
            raise s3_error(500, answer, text, "touch")
        return self.stat(url)

    # -- MultipartUploads (:mod:`transfer.backends._s3_multipart`) ----------------------

    def start_upload(self, url: Url) -> str:
        return self._multipart.start(url)

    def upload_part(self, url: Url, upload_id: str, number: int, region: Union[FileRegion, bytes]) -> str:
        return self._multipart.upload_part(url, upload_id, number, region)

    def complete_upload(self, url: Url, upload_id: str, receipts: Sequence[str]) -> ObjectInfo:
        return self._multipart.complete(url, upload_id, receipts)

    def abort_upload(self, url: Url, upload_id: str) -> None:
        self._multipart.abort(url, upload_id)

    # -- PendingUploads -----------------------------------------------------------------

    def pending_uploads(self, url: Url, *, whole_key: bool = True) -> Iterator[PendingUpload]:
        """ListMultipartUploads of ``url``'s key, or under it (see :mod:`._s3_uploads`)."""
        path = split_url(url)
        where = f"s3 uploads in {path.bucket}"
        from transfer.backends import _s3_uploads  # only where an upload is multipart or a command lists

        def list_page(query: Dict[str, str]) -> bytes:
            with self._send("GET", S3Path(path.bucket, ""), query=query, url=where) as response:
                self._check(response, where, "list")
                return response.read()
        return _s3_uploads.pending(list_page, path.key, whole_key)


def _attributes(headers: Dict[str, str]) -> Attributes:
    """An object's attributes from its HEAD answer's headers."""
    metadata = tuple(sorted((name[len("x-amz-meta-"):], value) for name, value in headers.items()
                            if name.startswith("x-amz-meta-")))
    return Attributes(headers.get("content-type"), headers.get("cache-control"), metadata, stored_checksum(headers))


# what an object keeps through a copy onto itself (besides x-amz-meta-*): its HTTP attributes
_ATTRIBUTE_HEADERS = frozenset(("content-type", "cache-control", "content-disposition", "content-encoding",
                                "content-language", "expires"))


def _fixed(credentials: Credentials) -> CredentialSource:
    return lambda: credentials
