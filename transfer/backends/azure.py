"""Azure Blob Storage (``az://ACCOUNT/CONTAINER/BLOB``) on the REST API over persistent HTTP connections.

Endpoint and credentials come from the Azure CLI's environment names
(:mod:`transfer.backends._azure_auth`: connection string, account key, SAS token; a SAS on the
URL itself); requests are signed with Shared Key (:mod:`._azure_sign`, ``x-ms-version``
pinned) or carry the SAS, or a bearer token of an Entra identity (:mod:`._azure_identity`,
opt-in), or none of them (public containers). TLS is verified; plain http only
where a connection string's endpoint says so (an emulator).

* **get**: one Get Blob (ranges in ``x-ms-range``); a whole blob is checked against its
  ``Content-MD5`` when the blob has one (every single-request upload here stores it) and
  always by byte count; a cut body is resumed pinned to the ETag (:mod:`transfer.http.resume`).
  Large blobs read in parallel ranges through :class:`~transfer.backends.base.RangedReads`;
  many small ones as pipelined requests (:class:`~transfer.backends.base.BatchReads`,
  :mod:`._azure_pipelined`).
* **put**: one Put Blob with ``Content-MD5`` (the service refuses a body that does not match)
  below the multipart threshold; above it the engine drives :class:`MultipartUploads`: Put
  Block per part (each with its ``Content-MD5``) and one Put Block List. Blocks never committed
  are dropped by the service (a week later), so an abort has nothing to send.
* **list**: List Blobs pages (``prefix``, ``delimiter``, ``marker``); **delete**: Blob Batch,
  up to 256 Delete Blob sub-requests per request (each signed on its own, answers matched by
  ``Content-ID``; a missing blob counts as removed); **make_dirs**: Create Container if missing;
  **copy** (``ServerSideCopy``): Copy Blob, waited for while the service says ``pending``.

Errors are translated in :mod:`._azure_wire` (``ServerBusy`` is a throttle answer).
"""

from __future__ import annotations

import secrets
import time

from transfer.atomic import local_error
from transfer.backends import _azure_wire as wire
from transfer.backends._azure_auth import AzureAccess, check_account, resolve
from transfer.backends._azure_identity import BearerTokens, token_fetch
from transfer.backends._azure_sign import X_MS_VERSION, SharedKey
from transfer.backends._wire_common import batch_answers, canonical_query, http_date_epoch, uri_encode_path
from transfer.backends.base import BodyStream, ByteRange, ObjectInfo
from transfer.backends.opening import Opening
from transfer.config import Settings
from transfer.errors import (
    ChecksumMismatch, ConfigError, InvalidInput, NotFound, RemoteError, TransferError, TransientError,
    retry_after_seconds,
)
from transfer.http.connection import Body, FileRegion, file_body
from transfer.http.pool import ConnectionPool, PooledResponse
from transfer.http.resume import ResumingBody, read_range, send_idempotent
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Callable, Dict, Hashable, Iterator, List, Optional, Sequence, Tuple

    from transfer._threads import Cancel
    from transfer.backends.base import Take
    from transfer.peer_scope import Scope

__all__ = ["AzureBackend", "endpoint_key", "open_backend"]
_PAGE = 5000  # List Blobs' largest page
_COPY_POLL_S = 0.2


def _access(url: Url, context: Opening) -> AzureAccess:
    check_account(url.host, str(url))
    return resolve(url.host, context.env)


def endpoint_key(url: Url, context: Opening) -> Hashable:
    access = _access(url, context)
    return ("azure", access.account, access.endpoint, access.where)


def open_backend(url: Url, context: Opening) -> "AzureBackend":
    access = _access(url, context)
    origin, path = _split_endpoint(access.endpoint, str(url))
    tokens = _bearer_tokens(access, origin, context) if access.identity else None
    pool = ConnectionPool(origin, max_idle=context.settings.threads + 2, max_open=context.settings.threads + 2,
                          ssl_context=context.ssl_context() if origin.startswith("https://") else None,
                          timeouts=context.timeouts, stats=context.stats)
    return AzureBackend(pool, access, context.settings, path_prefix=path, tokens=tokens)


def _bearer_tokens(access: AzureAccess, origin: str, context: Opening) -> BearerTokens:
    """The identity's tokens (azure-identity is imported by ``token_fetch``); ConfigError naming the
    identity's setting when the endpoint is plain http (a bearer token goes over TLS only)."""
    if not origin.startswith("https://"):
        raise ConfigError(f"{access.where}: bearer tokens are sent over https only, and the blob endpoint of "
                          f"{access.account} is {origin}", operation="credentials")
    return BearerTokens(token_fetch(access.identity or "", context.env, context.settings.ca_bundle, access.account))


def _split_endpoint(endpoint: str, url: str) -> Tuple[str, str]:
    """(``scheme://host[:port]``, path prefix) of an account endpoint."""
    scheme, sep, rest = endpoint.partition("://")
    host, slash, path = rest.partition("/")
    if not sep or not host:
        raise InvalidInput(f"bad Azure blob endpoint {endpoint!r}", url=url, operation="connect")
    return f"{scheme}://{host}", f"/{path}".rstrip("/") if slash else ""


class AzureBackend:
    """One storage account with one set of credentials. Thread-safe.

    ``path_prefix``: the endpoint's own path (a path-style emulator's ``/ACCOUNT``); ``page_size``:
    names per List Blobs page (the service's largest by default); ``tokens``: the bearer tokens
    of ``access.identity`` (requests without a SAS or key carry them)."""

    def __init__(self, pool: ConnectionPool, access: AzureAccess, settings: Settings, path_prefix: str = "",
                 page_size: int = _PAGE, tokens: Optional[BearerTokens] = None):
        self._pool = pool
        self._page = page_size
        self._access = access
        self._prefix = path_prefix
        self._signer = SharedKey(access.account, access.key) if access.key else None
        self._tokens = tokens
        self._scopes: Dict[str, Scope] = {}
        self.multipart_threshold = settings.multipart_threshold
        self.part_size = settings.multipart_part_size

    # -- request plumbing ---------------------------------------------------------------

    def _path(self, path: wire.AzurePath) -> str:
        return uri_encode_path(f"{self._prefix}/{path.container}" + (f"/{path.blob}" if path.blob else ""))

    def _send(self, method: str, path: wire.AzurePath, *, query: Optional[Dict[str, str]] = None,
              headers: Sequence[Tuple[str, str]] = (), body: Body = None) -> PooledResponse:
        """One request, signed with the account key or carrying the SAS (the URL's first)."""
        length = body.length if isinstance(body, FileRegion) else len(body or b"")
        target, sent = self._signed(method, path, canonical_query(query) if query else "",
                                    [("x-ms-date", wire.http_date()), ("x-ms-version", X_MS_VERSION), *headers],
                                    length)
        return self._pool.request(method, target, sent, body)

    def _signed(self, method: str, path: wire.AzurePath, query_text: str, headers: List[Tuple[str, str]],
                length: int) -> Tuple[str, List[Tuple[str, str]]]:
        """(target with its query, headers) of a request or a batch's sub-request: the SAS (the
        URL's first) goes in the query, else the account key signs it, else the identity's
        bearer token goes in ``Authorization``, else nothing (anonymous)."""
        target = self._path(path)
        sas = path.sas or (self._access.sas or "")
        if sas:
            query_text = f"{query_text}&{sas}" if query_text else sas
        elif self._signer is not None:
            headers = [*headers, ("Authorization", self._signer.authorization(method, target, query_text, headers,
                                                                              length))]
        elif self._tokens is not None:
            headers = [*headers, ("Authorization", self._tokens.authorization())]
        return (f"{target}?{query_text}" if query_text else target), headers

    def _check(self, response: PooledResponse, url: str, operation: str, ok: Tuple[int, ...] = (200,)) -> None:
        if response.status in ok:
            return
        body = response.read() if response.status >= 300 else b""
        raise wire.azure_error(response.status, response.headers, body, url, operation, self._access.account,
                               self._access.where, retry_after_seconds(response.headers.get("retry-after")))

    # -- Backend ------------------------------------------------------------------------

    def stat(self, url: Url) -> ObjectInfo:
        """Get Blob Properties (one HEAD)."""
        with self._send("HEAD", wire.split_url(url, need_blob=True)) as response:
            self._check(response, str(url), "stat")
            return wire.blob_info(url, response.headers)

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        if byte_range is None:
            stream = self.open_read(url)
            check = stream.check
            try:
                count = stream.read(stream.info.size, sink.write if check is None else _tee(check.update, sink.write))
            finally:
                stream.close()
            if count != stream.info.size:
                raise ChecksumMismatch(f"received {count} bytes, expected {stream.info.size}", url=str(url),
                                       operation="get")
            if stream.check is not None and not stream.check.matches():
                raise ChecksumMismatch("MD5 of received bytes differs from the blob's Content-MD5", url=str(url),
                                       operation="get")
            return stream.info
        return self._get_range(url, sink, byte_range)

    def _get_range(self, url: Url, sink: BinaryIO, byte_range: ByteRange) -> ObjectInfo:
        """One Get Blob with ``x-ms-range`` (a range past the end is cut there, as the service
        answers); a cut body is resumed pinned to the answer's ETag."""
        first, end = byte_range
        if end <= first:
            raise InvalidInput(f"empty byte range {byte_range}", url=str(url), operation="get")
        path, text = wire.split_url(url, need_blob=True), str(url)
        response = send_idempotent(lambda: self._send("GET", path, headers=[("x-ms-range", f"bytes={first}-{end - 1}")]),
                                   text)
        try:
            self._check(response, text, "get", ok=(206,))
            version = wire.etag(response.headers) or ""
            length, total = wire.span(response.headers, text)
        except BaseException:
            response.discard()
            raise

        def rest(offset: int) -> PooledResponse:
            return self._rest(url, path, (offset, first + length), version, total)
        with ResumingBody(response, rest if version else None, first, first + length, text) as body:
            count = body.read_into(sink.write)
        if count != length:
            raise ChecksumMismatch(f"received {count} bytes of range {first}-{end - 1}, expected {length}", url=text,
                                   operation="get")
        # the blob's size, as every backend's ranged get reports it (Backend.get)
        return ObjectInfo(url, total, version or None, http_date_epoch(response.headers.get("last-modified")))

    def put(self, path: str, url: Url) -> ObjectInfo:
        """Put Blob with ``Content-MD5``, which the service checks and keeps as the blob's."""
        target = wire.split_url(url, need_blob=True)
        try:
            size, md5, body = file_body(path)
        except OSError as err:
            raise local_error(err, path, "put") from err
        md5_b64 = _b64(md5)
        headers = [("x-ms-blob-type", "BlockBlob"), ("Content-MD5", md5_b64), ("x-ms-blob-content-md5", md5_b64)]
        with self._send("PUT", target, headers=headers, body=body) as response:
            self._check(response, str(url), "put", ok=(201,))
            stored = wire.md5_hex(response.headers)
        if stored is not None and stored != md5.hex():
            raise ChecksumMismatch("Content-MD5 of the stored blob differs from the file's", url=str(url),
                                   operation="put")
        return ObjectInfo(url, size, wire.etag(response.headers))

    def list(self, url: Url) -> Iterator[ObjectInfo]:
        for objects, _ in self._pages(url, delimiter=""):
            yield from objects

    def list_dir(self, url: Url) -> Tuple[List[ObjectInfo], List[Url]]:
        """One level under ``url`` (List Blobs with delimiter ``/``): (blobs, sub-prefixes ending in ``/``)."""
        objects: List[ObjectInfo] = []
        prefixes: List[Url] = []
        for found, subs in self._pages(url, delimiter="/"):
            objects.extend(found)
            prefixes.extend(subs)
        return objects, prefixes

    def _pages(self, url: Url, delimiter: str) -> Iterator[Tuple[List[ObjectInfo], List[Url]]]:
        path = wire.split_url(url)
        prefix = path.blob.rstrip("/") + "/" if path.blob else ""
        marker = ""
        while True:
            query = {"restype": "container", "comp": "list", "prefix": prefix, "maxresults": str(self._page)}
            if delimiter:
                query["delimiter"] = delimiter
            if marker:
                query["marker"] = marker
            with self._send("GET", wire.AzurePath(path.container, "", path.sas), query=query) as response:
                self._check(response, str(url), "list")
                blobs, subs, marker = wire.parse_listing(response.read())
            yield ([ObjectInfo(wire.child_url(url, path.container, name, path.sas), size, version, mtime)
                    for name, size, version, mtime in blobs],
                   [wire.child_url(url, path.container, sub, path.sas) for sub in subs])
            if not marker:
                return

    def delete(self, urls: Sequence[Url]) -> List[Optional[TransferError]]:
        """Blob Batch: up to 256 Delete Blob sub-requests in one request per container (and SAS),
        each signed on its own; one Delete Blob for a lone blob. A missing blob counts as removed."""
        results: List[Optional[TransferError]] = [None] * len(urls)
        groups: Dict[Tuple[str, str], List[Tuple[int, wire.AzurePath]]] = {}
        for index, url in enumerate(urls):
            try:
                path = wire.split_url(url, need_blob=True)
            except TransferError as err:
                results[index] = err
                continue
            groups.setdefault((path.container, path.sas), []).append((index, path))
        for members in groups.values():
            for at in range(0, len(members), wire.BATCH_MAX):
                chunk = members[at:at + wire.BATCH_MAX]
                found = self._delete_batch([urls[i] for i, _ in chunk], [p for _, p in chunk]) if len(chunk) > 1 \
                    else [self._delete_one(urls[chunk[0][0]], chunk[0][1])]
                for (index, _), outcome in zip(chunk, found):
                    results[index] = outcome
        return results

    def _delete_one(self, url: Url, path: wire.AzurePath) -> Optional[TransferError]:
        try:
            with self._send("DELETE", path) as response:
                if response.status != 404:
                    self._check(response, str(url), "delete", ok=(200, 202))
        except TransferError as err:
            return err
        return None

    def _delete_batch(self, urls: Sequence[Url], paths: Sequence[wire.AzurePath]) -> List[Optional[TransferError]]:
        """One Blob Batch (container scope) deleting ``paths``, all of one container and SAS."""
        subrequests = [("DELETE", *self._signed("DELETE", path, "", [("x-ms-date", wire.http_date())], 0))
                       for path in paths]
        content_type, body = wire.batch_body([(method, target, [*headers, ("Content-Length", "0")])
                                              for method, target, headers in subrequests])
        scope = wire.AzurePath(paths[0].container, "", paths[0].sas)
        try:
            with self._send("POST", scope, query={"restype": "container", "comp": "batch"},
                            headers=[("Content-Type", content_type)], body=body) as response:
                if response.status == 404:  # no such container: its blobs are gone, as for one Delete Blob
                    response.read()
                    return [None] * len(urls)
                self._check(response, str(urls[0]), "delete", ok=(202,))
                answers = batch_answers(response.headers.get("content-type", ""), response.read())
        except TransferError as err:  # the whole batch failed: every blob gets the error
            return [err.relabelled(url=str(url), operation="delete") for url in urls]
        return [self._outcome(url, answers.get(str(index))) for index, url in enumerate(urls)]

    def _outcome(self, url: Url, answer: Optional[Tuple[int, Dict[str, str], bytes]]) -> Optional[TransferError]:
        """What one sub-request's answer says of its blob: None when removed or already absent."""
        if answer is None:
            return TransientError("no answer for this blob in the batch response", url=str(url), operation="delete")
        status, headers, text = answer
        if status in (200, 202, 404):
            return None
        return wire.azure_error(status, headers, text, str(url), "delete", self._access.account, self._access.where,
                                retry_after_seconds(headers.get("retry-after")))

    def make_dirs(self, url: Url) -> None:
        """Create Container if missing (409 ``ContainerAlreadyExists`` is success)."""
        path = wire.split_url(url)
        with self._send("PUT", wire.AzurePath(path.container, "", path.sas), query={"restype": "container"}) \
                as response:
            if response.status == 409:
                response.read()
                return
            self._check(response, str(url), "mkdir", ok=(201,))

    def names_bucket(self, url: Url) -> bool:
        """``Buckets``: no blob past the container (``az://ACCOUNT/CONTAINER``)."""
        return wire.split_url(url).blob.strip("/") == ""

    def bucket_exists(self, url: Url) -> bool:
        """``Buckets``: Get Container Properties; 404 is False, other failures raise."""
        path = wire.split_url(url)
        with self._send("HEAD", wire.AzurePath(path.container, "", path.sas), query={"restype": "container"}) \
                as response:
            if response.status == 404:
                return False
            self._check(response, str(url), "stat")
        return True

    def cache_key(self, url: Url) -> str:
        path = wire.split_url(url)
        return f"{self._pool.base_url}{self._prefix}/{path.container}/{path.blob}"

    def peer_scope(self, url: Url) -> Optional[Scope]:
        """``PeerScopes``: derived from the account key, endpoint, account and container; None
        for SAS or anonymous reads (nothing then names one identity)."""
        if self._access.key is None or wire.split_url(url).sas:
            return None
        container = wire.split_url(url).container
        known = self._scopes.get(container)
        if known is None:
            from transfer.peer_scope import derive_scope  # peer sharing only
            known = self._scopes[container] = derive_scope(self._access.key, "azure", self._access.endpoint,
                                                           self._access.account, container)
        return known

    def close(self) -> None:
        self._pool.close()

    # -- RangedReads --------------------------------------------------------------------

    def open_read(self, url: Url) -> BodyStream:
        path, text = wire.split_url(url, need_blob=True), str(url)
        response = send_idempotent(lambda: self._send("GET", path), text)
        try:
            self._check(response, text, "get")
            info = wire.blob_info(url, response.headers)
            reopen = (lambda offset: self._rest(url, path, (offset, info.size), info.version or "", info.size))
            body = ResumingBody(response, reopen if info.version else None, 0, info.size, text)
        except BaseException:
            response.discard()
            raise
        return BodyStream(body, info, wire.content_md5_check(response.headers, info.size))

    def get_range(self, url: Url, byte_range: ByteRange, version: str, size: int,
                  write: Callable[[bytes], object]) -> int:
        """``x-ms-range`` with ``If-Match`` on the ETag; the answer's span is checked too."""
        first, end = byte_range
        path = wire.split_url(url, need_blob=True)

        return read_range(lambda offset: self._rest(url, path, (offset, end), version, size), first, end, str(url),
                          write)

    def _rest(self, url: Url, path: wire.AzurePath, byte_range: ByteRange, version: str, size: int) -> PooledResponse:
        first, end = byte_range
        headers = [("x-ms-range", f"bytes={first}-{end - 1}")] + ([("If-Match", f'"{version}"')] if version else [])
        response = self._send("GET", path, headers=headers)
        span = response.headers.get("content-range", "")
        try:
            if response.status == 412 or (response.status == 206 and span != f"bytes {first}-{end - 1}/{size}"):
                raise RemoteError(f"the blob changed while being read (asked ETag {version}, {size} bytes; got HTTP "
                                  f"{response.status}, {span or 'no range'})", url=str(url), operation="get",
                                  status=response.status)
            self._check(response, str(url), "get", ok=(206,))
        except BaseException:
            response.discard()
            raise
        return response

    # -- BatchReads ---------------------------------------------------------------------

    def read_small(self, urls: Sequence[Url], take: Take, *, connections: int, cancel: Optional[Cancel] = None,
                   missing: Optional[Callable[[int], bool]] = None, depth: Optional[int] = None,
                   eager: bool = False, throttled: Optional[Callable[[float], None]] = None,
                   draw: Optional[Callable[[], None]] = None) -> List[int]:
        """Pipelined Get Blob requests (:mod:`transfer.http.pipeline`) of blobs up to 1 MiB,
        each tagged by its ``x-ms-client-request-id``; see
        :class:`~transfer.backends.base.BatchReads` and :mod:`transfer.backends._azure_pipelined`."""
        from transfer.backends._azure_pipelined import read_small  # batches of small files only

        def sign(path: wire.AzurePath, tag: str) -> Tuple[str, List[Tuple[str, str]]]:
            return self._signed("GET", path, "", [("x-ms-date", wire.http_date()), ("x-ms-version", X_MS_VERSION),
                                                  ("x-ms-client-request-id", tag)], 0)
        return read_small(self._pool, sign, urls, take, connections, cancel, missing, depth, eager, throttled, draw)

    # -- Touches ------------------------------------------------------------------------

    def touch(self, url: Url) -> ObjectInfo:
        """``Touches``: Set Blob Metadata with the metadata a HEAD gave (any write to a blob
        renews its Last-Modified; the bytes and content headers are untouched)."""
        path, text = wire.split_url(url, need_blob=True), str(url)
        with self._send("HEAD", path) as response:
            self._check(response, text, "touch")
            kept = [(name, value) for name, value in response.headers.items() if name.lower().startswith("x-ms-meta-")]
        with self._send("PUT", path, query={"comp": "metadata"}, headers=kept) as response:
            self._check(response, text, "touch")
        return self.stat(url)

    # -- ServerSideCopy -----------------------------------------------------------------

    def copy(self, source: Url, dest: Url, draw: Optional[Callable[[], None]] = None) -> ObjectInfo:
        """Copy Blob inside the account; waited for while the service reports it pending
        (``draw`` before each HEAD: ``ServerSideCopy``)."""
        src, dst = wire.split_url(source, need_blob=True), wire.split_url(dest, need_blob=True)
        if source.host != dest.host:
            raise InvalidInput("a server-side copy stays inside one storage account", url=str(dest), operation="copy")
        location = f"{self._pool.base_url}{self._path(src)}" + (f"?{src.sas}" if src.sas else "")
        with self._send("PUT", dst, headers=[("x-ms-copy-source", location)]) as response:
            self._check(response, str(dest), "copy", ok=(202, 201))
            status = response.headers.get("x-ms-copy-status", "success")
        while status == "pending":
            time.sleep(_COPY_POLL_S)
            if draw is not None:
                draw()
            with self._send("HEAD", dst) as response:
                self._check(response, str(dest), "copy")
                status = response.headers.get("x-ms-copy-status", "success")
        if status != "success":
            raise RemoteError(f"the copy ended {status}", url=str(dest), operation="copy")
        if draw is not None:
            draw()
        return self.stat(dest)

    # -- MultipartUploads (block blobs) --------------------------------------------------

    def start_upload(self, url: Url) -> str:
        """A fresh id that names this upload's blocks (the service has no upload to start)."""
        wire.split_url(url, need_blob=True)
        return secrets.token_hex(8)

    def upload_part(self, url: Url, upload_id: str, number: int, region: FileRegion) -> str:
        """Put Block with the part's ``Content-MD5`` (the service refuses a body that differs);
        returns the block id."""
        block = wire.block_id(upload_id, number)
        headers = [("Content-MD5", _b64(_md5_of_region(region)))]
        with self._send("PUT", wire.split_url(url, need_blob=True), query={"comp": "block", "blockid": block},
                        headers=headers, body=region) as response:
            self._check(response, str(url), "put", ok=(201,))
        return block

    def complete_upload(self, url: Url, upload_id: str, receipts: Sequence[str]) -> ObjectInfo:
        """Put Block List of the blocks in order, then the blob's size is checked against theirs."""
        body = ("<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>"
                + "".join(f"<Latest>{block}</Latest>" for block in receipts) + "</BlockList>").encode()
        from transfer import _digests
        headers = [("Content-MD5", _b64(_digests.md5(body))), ("Content-Type", "application/xml")]
        with self._send("PUT", wire.split_url(url, need_blob=True), query={"comp": "blocklist"}, headers=headers,
                        body=body) as response:
            self._check(response, str(url), "put", ok=(201,))
        return self.stat(url)

    def abort_upload(self, url: Url, upload_id: str) -> None:
        """Nothing to send: blocks never committed are dropped by the service."""


def _tee(update: Callable[[bytes], None], write: Callable[[bytes], object]) -> Callable[[bytes], None]:
    def tee(data: bytes) -> None:
        update(data)
        write(data)
    return tee


def _b64(digest: bytes) -> str:
    import binascii
    return binascii.b2a_base64(digest, newline=False).decode()


def _md5_of_region(region: FileRegion) -> bytes:
    from transfer import _digests
    digest = _digests.new("md5")
    try:
        for block in region.blocks():
            digest.update(block)
    except OSError as err:
        raise local_error(err, region.path, "put") from err
    return digest.digest()
