"""Google Cloud Storage (``gs://BUCKET/KEY``) on google-cloud-storage, one pooled session per endpoint.

``Url.host`` is the bucket and ``Url.path`` the key. Endpoint and credentials are chosen by
:mod:`transfer.backends._gcs_auth` (site key files, ``GOOGLE_APPLICATION_CREDENTIALS``,
anonymous for emulators; ``STORAGE_EMULATOR_HOST``; plain HTTP only for an ``http://``
endpoint). Each backend owns one ``google.cloud.storage.Client`` whose authorized
``requests`` session has one urllib3 pool of ``threads + 2`` connections that blocks when
all are busy, so a batch never opens (or discards) more than that.

* **get**: exactly one media request, no metadata GET first. The stored bytes are fetched
  as they are, the CRC32C the server sends in ``x-goog-hash`` is checked by the library
  (``google-crc32c`` in C) and the byte count against ``x-goog-stored-content-length`` (or
  the ``Content-Range`` of a ranged read). An object stored with ``Content-Encoding: gzip``
  is decompressed on the way to the sink, as GCS's decompressive transcoding and gsutil give
  it; a ranged read of one is refused (a range of compressed bytes is no range of the file).
* **put**: one multipart request below ``multipart_threshold``, streamed from disk, with
  the file's CRC32C in the metadata (the server rejects a mismatch) and checked again in
  the answer; at or above it, a resumable upload in ``multipart_part_size`` chunks, the
  file's CRC32C sent by the library in ``x-goog-hash`` with the last one (GCS refuses a
  mismatch) and checked in the answer (an object that differs is removed). Chunks, and only
  chunks, are retried in here. ``stat`` returns the stored CRC32C as the checksum.
* **presign** (``Presigns``): V4 signed URLs with a service-account key, no request sent.
* **delete**: JSON API batches of up to 100 DELETEs (see :mod:`._gcs_wire` for why the
  request is built here); a missing object counts as removed.
* **make_dirs**: bucket create-if-missing. **copy** (``ServerSideCopy``): ``rewrite``.

Every google/requests/urllib3 exception is translated here into :mod:`transfer.errors`.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import os
from typing import Any, BinaryIO, Callable, Dict, Hashable, Iterator, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import quote

from transfer.errors import ConfigError

try:
    import google.auth
    import google.auth.credentials
    import google.auth.exceptions
    import google.auth.transport.requests
    import google.oauth2.credentials
    import google.oauth2.service_account
    import google_crc32c
    import requests
    import urllib3
    from google.api_core import exceptions as api_exceptions

    # google-cloud-storage and parts of google-auth carry no type information: they are
    # used through these handles, so the Any stays at this boundary.
    _storage: Any = importlib.import_module("google.cloud.storage")
    _storage_errors: Any = importlib.import_module("google.cloud.storage.exceptions")
    _media: Any = importlib.import_module("google.cloud.storage._media.requests")
    _DEFAULT_RETRY: Any = importlib.import_module("google.cloud.storage.retry").DEFAULT_RETRY
    _auth: Any = google.auth
    _auth_http: Any = google.auth.transport.requests
    _oauth2: Any = google.oauth2
    _crc32c: Any = google_crc32c
except ImportError as missing:  # the registry hands this to the engine as a clear failure
    from transfer.backends import missing_extra
    raise missing_extra("gs", missing.name or "google.cloud.storage") from missing

from transfer.atomic import local_error
from transfer.backends import _gcs_wire as wire
from transfer.backends._gcs_auth import GcsSource, load_key, project_for, resolve
from transfer.backends._gcs_sign import signed_url
from transfer.backends.base import Attributes, ByteRange, ObjectInfo
from transfer.config import Settings
from transfer.errors import (
    AuthError,
    ChecksumMismatch,
    InvalidInput,
    RemoteError,
    TransferError,
    TransientError,
    retry_after_seconds,
)
from transfer.backends.opening import Opening
from transfer.http.proxy import Proxy, boto_proxy_for
from transfer.urls import Url

Signer = Tuple[str, Callable[[bytes], bytes]]  # a service account's email and RSA signing function
_CHUNK_UNIT = 256 << 10  # resumable chunks are multiples of 256 KiB
_TOKEN_URI = "https://oauth2.googleapis.com/token"  # google-auth's, for a key that names none
_LIST_FIELDS = "items(name,size,generation,updated),nextPageToken"
_NETWORK_ERRORS = (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                   requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError,
                   urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)


def split_url(url: Url, need_key: bool = False) -> Tuple[str, str]:
    """(bucket, key) of ``gs://BUCKET/KEY``: the path less its one leading ``/`` (a name may
    itself start with ``/``; a listing's URL of such an object has ``//``)."""
    bucket, key = url.host, url.path[1:] if url.path.startswith("/") else url.path
    if not bucket or "@" in bucket:
        raise InvalidInput("expected gs://BUCKET/KEY", url=str(url), operation="parse")
    if need_key and not key:
        raise InvalidInput("gs:// URL names no object", url=str(url), operation="parse")
    return bucket, key


def endpoint_key(url: Url, context: Opening) -> Hashable:
    source = resolve(url.site_label, context.env, context.settings)
    return ("gcs", source.endpoint, source.key_path)


def open_backend(url: Url, context: Opening) -> "GcsBackend":
    source = resolve(url.site_label, context.env, context.settings)
    info = load_key(source.key_path) if source.key_path else None
    credentials = _credentials(source, info)
    token_uri = None if source.anonymous else str((info or {}).get("token_uri") or _TOKEN_URI)
    session, token_http = _session(credentials, source, token_uri, context)
    try:
        if not source.anonymous:  # once, here: threads that find no token all fetch one at once
            with _translated(url, "credentials"):
                credentials.refresh(_auth_http.Request(token_http))
        client = _storage.Client(project=project_for(source, info, context.env), credentials=credentials,
                                 _http=session, client_options={"api_endpoint": source.endpoint})
    except BaseException:
        session.close()
        token_http.close()
        raise
    # The library's bucket-metadata cache (App-centric Observability) starts a background
    # GET of each bucket on first use: an extra request and connection we never need.
    client._bucket_metadata_cache = None
    return GcsBackend(client, session, token_http, source.endpoint, context.settings, _signer(credentials))


def _credentials(source: GcsSource, info: Optional[Mapping[str, Any]]) -> Any:
    if info is None:
        return _auth.credentials.AnonymousCredentials()
    try:
        if info.get("type") == "authorized_user":
            return _oauth2.credentials.Credentials.from_authorized_user_info(dict(info), _storage.Client.SCOPE)
        return _oauth2.service_account.Credentials.from_service_account_info(dict(info),
                                                                             scopes=_storage.Client.SCOPE)
    except (google.auth.exceptions.GoogleAuthError, ValueError) as err:
        raise ConfigError(f"unusable key file: {type(err).__name__}", url=source.key_path,
                          operation="credentials") from None


def _signer(credentials: Any) -> Optional[Signer]:
    """(email, RSA signing function) of a service-account key; None for other credentials."""
    if isinstance(credentials, _oauth2.service_account.Credentials):
        return str(credentials.signer_email), credentials.sign_bytes
    return None


def _session(credentials: Any, source: GcsSource, token_uri: Optional[str], context: Opening) -> Tuple[Any, Any]:
    """(authorized session with one blocking pool of ``threads + 2`` connections, token session
    for ``token_uri``, None when anonymous), each through the proxy botocore's rules pick for
    its host (:func:`~transfer.http.proxy.boto_proxy_for`; ``requests`` reads the same variables)."""
    proxies = [_proxy_of(url, context.env) for url in (token_uri, source.endpoint)]  # refused before any socket
    verify: Any = context.settings.ca_bundle or True
    token_http = requests.Session()
    token_http.trust_env = False  # all configuration comes from the opening context, never os.environ
    token_http.verify = verify
    _through(token_http, proxies[0], _ProxyAdapter(max_retries=0))
    session = _auth_http.AuthorizedSession(
        credentials, refresh_status_codes=() if source.anonymous else (401,),
        auth_request=_auth_http.Request(token_http))
    session.trust_env = False
    session.verify = verify
    adapter = _ProxyAdapter(pool_connections=2, pool_maxsize=context.settings.threads + 2,
                            pool_block=True, max_retries=0)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    _through(session, proxies[1], adapter)
    stats = context.stats
    session.hooks["response"].append(lambda response, *args, **kwargs: stats.count(requests=1))
    session.hooks["response"].append(_redirect_guard(source.endpoint))
    if token_uri:
        token_http.hooks["response"].append(_redirect_guard(token_uri))
    return session, token_http


def _redirect_guard(origin: str) -> Callable[..., None]:
    """A response hook that lets ``requests`` follow a redirect only where
    :func:`transfer.http.origins.refusal` lets this session's token (and a body) go: the
    endpoint's own origin. Any other ``Location`` is a RemoteError naming it, never contacted
    (``requests`` alone would re-send a 307's body to any host, and its token to another port
    of the same host on old versions)."""
    from urllib.parse import urljoin

    from transfer.http.origins import origin_of, refusal

    def guard(response: Any, *args: Any, **kwargs: Any) -> None:
        if not response.is_redirect:
            return
        location = urljoin(response.url, response.headers["location"])
        why = refusal(origin, location)
        if why is not None:
            status = response.status_code
            response.close()  # back to the bounded pool: a refusal must not hold a connection
            raise RemoteError(f"HTTP {status} redirect to {origin_of(location)} not followed: {why}",
                              status=status)
    return guard


class _ProxyAdapter(requests.adapters.HTTPAdapter):
    """Sends the proxy's credentials from a :class:`~transfer.http.proxy.Proxy`, so that they
    are in no proxy URL (urllib3 puts those in its messages)."""

    authorization: Optional[str] = None

    def proxy_headers(self, proxy: str) -> Dict[str, str]:
        return {"Proxy-Authorization": self.authorization} if self.authorization else {}


def _proxy_of(url: Optional[str], env: Mapping[str, str]) -> Tuple[str, Optional[Proxy]]:
    scheme = (url or "").partition(":")[0].lower()
    return scheme, boto_proxy_for(scheme, url, env) if url else None


def _through(session: Any, proxy: Tuple[str, Optional[Proxy]], adapter: _ProxyAdapter) -> None:
    """Send ``session``'s requests of one scheme through ``proxy``: (scheme, proxy or None)."""
    scheme, found = proxy
    if found is not None:
        adapter.authorization = found.authorization
        session.mount(f"{scheme}://", adapter)
        session.proxies = {scheme: f"http://{found}"}


class GcsBackend:
    """One GCS endpoint with one set of credentials. Thread-safe."""

    def __init__(self, client: Any, session: Any, token_http: Any, endpoint: str, settings: Settings,
                 signer: Optional[Signer] = None):
        self._client = client
        self._signer = signer
        self._http = session
        self._token_http = token_http
        self._endpoint = endpoint
        self._timeout = (settings.connect_timeout, settings.read_timeout)
        self._threshold = settings.multipart_threshold
        self._chunk = max(1, settings.multipart_part_size // _CHUNK_UNIT) * _CHUNK_UNIT
        self._chunk_retry = _DEFAULT_RETRY.with_delay(
            initial=settings.retry_base_delay, maximum=settings.retry_max_delay
        ).with_timeout(settings.retry_max_delay * settings.max_attempts)

    # -- Backend ------------------------------------------------------------------------

    def stat(self, url: Url) -> ObjectInfo:
        bucket, key = split_url(url, need_key=True)
        blob = self._client.bucket(bucket).blob(key)
        with _translated(url, "stat"):
            blob.reload(retry=None, timeout=self._timeout)
        info = _blob_info(url, blob)
        # The CRC32C every upload sends (and the store checks) describes the content: info's checksum
        checksum = f"crc32c:{blob.crc32c}" if blob.crc32c else None
        return ObjectInfo(info.url, info.size, info.version, info.mtime, Attributes(checksum=checksum))

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        bucket, key = split_url(url, need_key=True)
        start = end = None
        if byte_range is not None:
            if byte_range[1] <= byte_range[0]:
                raise InvalidInput(f"empty byte range {byte_range}", url=str(url), operation="get")
            start, end = byte_range[0], byte_range[1] - 1
        counted = wire.CountingSink(sink)
        # gzip accepted: the server then sends the stored bytes, which the CRC32C describes, and
        # the sink decompresses a gzip-encoded body as GCS would have (see _gcs_wire).
        download = _media.RawDownload(f"{self._endpoint}/download{wire.object_path(bucket, key)}?alt=media",
                                      stream=counted, start=start, end=end,
                                      headers={"accept-encoding": "gzip"}, checksum="crc32c", retry=None)
        with _translated(url, "get"):
            response = download.consume(wire.Watching(self._http, counted, url, byte_range), timeout=self._timeout)
        info = wire.check_download(url, response.status_code, response.headers, counted.count, byte_range)
        counted.finish(url)
        return info if counted.written == counted.count else ObjectInfo(url, counted.written, info.version)

    def put(self, path: str, url: Url) -> ObjectInfo:
        bucket, key = split_url(url, need_key=True)
        try:
            size = os.stat(path).st_size
        except OSError as err:
            raise local_error(err, path, "put") from err
        crc: Optional[str] = None
        with _translated(url, "put"):
            if size < self._threshold:
                crc, data = _read_for_upload(path)
                resource = self._upload_single(bucket, key, path, size, crc, data, url)
            else:  # the library checks the CRC32C of what it sent against the answer
                resource = self._upload_resumable(bucket, key, path, size)
        try:
            return wire.check_upload(url, resource, size, crc)
        except ChecksumMismatch:
            self._discard(bucket, key, resource.get("generation"))
            raise

    def list(self, url: Url) -> Iterator[ObjectInfo]:
        bucket, key = split_url(url)
        prefix = key.rstrip("/") + "/" if key else ""
        with _translated(url, "list"):
            blobs = iter(self._client.list_blobs(bucket, prefix=prefix, fields=_LIST_FIELDS, retry=None,
                                                 timeout=self._timeout))
        while True:
            with _translated(url, "list"):
                blob = next(blobs, None)
            if blob is None:
                return
            yield _blob_info(url.with_path("/" + blob.name), blob)

    def delete(self, urls: Sequence[Url]) -> List[Optional[TransferError]]:
        results: List[Optional[TransferError]] = [None] * len(urls)
        items: List[Tuple[int, Tuple[str, str]]] = []
        for index, url in enumerate(urls):
            try:
                items.append((index, split_url(url, need_key=True)))
            except TransferError as err:
                results[index] = err
        for begin in range(0, len(items), wire.MAX_CALLS):
            chunk = items[begin:begin + wire.MAX_CALLS]
            outcomes = self._delete_batch([urls[i] for i, _ in chunk], [path for _, path in chunk])
            for (index, _), outcome in zip(chunk, outcomes):
                results[index] = outcome
        return results

    def make_dirs(self, url: Url) -> None:
        bucket, _ = split_url(url)
        with _translated(url, "mkdir"):
            try:
                self._client.get_bucket(bucket, retry=None, timeout=self._timeout)
                return
            except api_exceptions.NotFound:
                pass
            if self._client.project is None:
                raise ConfigError("creating a bucket needs a project: use a key with project_id or set "
                                  "GOOGLE_CLOUD_PROJECT", url=str(url), operation="mkdir")
            try:
                self._client.create_bucket(bucket, retry=None, timeout=self._timeout)
            except api_exceptions.Conflict:
                self._confirm_existing(bucket, url)

    def remove_bucket(self, url: Url) -> None:
        """``BucketRemoval``: the bucket's DELETE (404 NotFound, 409 not empty raise)."""
        bucket, _ = split_url(url)
        with _translated(url, "remove"):
            self._client.bucket(bucket).delete(retry=None, timeout=self._timeout)

    def names_bucket(self, url: Url) -> bool:
        """``Buckets``: no key past the bucket (``gs://BUCKET``)."""
        return split_url(url)[1].strip("/") == ""

    def bucket_exists(self, url: Url) -> bool:
        """``Buckets``: the bucket's metadata GET; 404 is False, other failures raise."""
        bucket, _ = split_url(url)
        with _translated(url, "stat"):
            try:
                self._client.get_bucket(bucket, retry=None, timeout=self._timeout)
            except api_exceptions.NotFound:
                return False
        return True

    def cache_key(self, url: Url) -> str:
        bucket, key = split_url(url)
        return f"{self._endpoint}/{bucket}/{key}"

    def close(self) -> None:
        self._client.close()  # closes the authorized session and its pool
        self._token_http.close()

    # -- ServerSideCopy -----------------------------------------------------------------

    def copy(self, source: Url, dest: Url, draw: Optional[Callable[[], None]] = None) -> ObjectInfo:
        """``rewrite`` calls until the object is whole (``draw`` before each after the first:
        ``ServerSideCopy``)."""
        (src_bucket, src_key), (dst_bucket, dst_key) = split_url(source, True), split_url(dest, True)
        src = self._client.bucket(src_bucket).blob(src_key)
        dst = self._client.bucket(dst_bucket).blob(dst_key)
        token: Optional[str] = None
        with _translated(source, "copy"):
            while True:  # large or cross-location copies take several rewrite calls
                token, _, _ = dst.rewrite(src, token=token, retry=None, timeout=self._timeout)
                if token is None:
                    break
                if draw is not None:
                    draw()
        return _blob_info(dest, dst)

    # -- Presigns --------------------------------------------------------------------------

    def presign(self, url: Url, method: str, expires: int) -> str:
        """A V4 signed URL (see :mod:`._gcs_sign`), signed with the service account's RSA key;
        InvalidInput when the credentials hold none (anonymous, or an authorized-user file)."""
        bucket, key = split_url(url, need_key=True)
        if self._signer is None:
            raise InvalidInput("no service-account key to sign a URL with (anonymous or authorized-user "
                               "credentials)", url=str(url), operation="presign")
        email, sign = self._signer
        return signed_url(self._endpoint, bucket, key, method, expires, email, sign)

    # -- helpers --------------------------------------------------------------------------

    def _upload_single(self, bucket: str, key: str, path: str, size: int, crc: str,
                       data: Optional[bytes], url: Url) -> Dict[str, Any]:
        content_type, body = wire.multipart_upload(key, crc, path, size, data)
        response = self._http.request(
            "POST", f"{self._endpoint}/upload/storage/v1/b/{quote(bucket, safe='')}/o?uploadType=multipart",
            data=body, headers={"Content-Type": content_type}, timeout=self._timeout)
        if response.status_code != 200:
            raise wire.status_error(response.status_code, _reason(response), str(url), "put")
        return _json(response)

    def _upload_resumable(self, bucket: str, key: str, path: str, size: int) -> Dict[str, Any]:
        upload = _media.ResumableUpload(
            f"{self._endpoint}/upload/storage/v1/b/{quote(bucket, safe='')}/o?uploadType=resumable",
            self._chunk, checksum="crc32c", retry=self._chunk_retry)
        try:
            stream = open(path, "rb")
        except OSError as err:
            raise local_error(err, path, "put") from err
        with stream:
            upload.initiate(self._http, stream, {"name": key}, "application/octet-stream", total_bytes=size,
                            timeout=self._timeout)
            response = None
            try:
                while not upload.finished:
                    response = upload.transmit_next_chunk(self._http, timeout=self._timeout)
            except _storage_errors.DataCorruption as err:  # stored, but not what we sent
                self._discard(bucket, key, _json(err.response).get("generation"))
                raise
        return _json(response)

    def _delete_batch(self, urls: Sequence[Url], paths: Sequence[Tuple[str, str]]) -> List[Optional[TransferError]]:
        content_type, body = wire.build_delete(self._endpoint, paths)
        try:
            with _translated(urls[0], "delete"):
                response = self._http.request("POST", f"{self._endpoint}/batch/storage/v1", data=body,
                                              headers={"Content-Type": content_type}, timeout=self._timeout)
            if response.status_code != 200:
                raise wire.status_error(response.status_code, _reason(response), str(urls[0]), "delete")
        except TransferError as err:  # the whole batch failed: every object gets the error
            return [err.relabelled(url=str(u), operation="delete") for u in urls]
        return wire.delete_outcomes(urls, wire.parse_batch(response.headers.get("content-type", ""),
                                                           response.content))

    def _discard(self, bucket: str, key: str, generation: Any) -> None:
        """Best-effort delete of an object that failed verification (only that generation)."""
        if not generation:
            return
        try:
            self._client.bucket(bucket).blob(key).delete(if_generation_match=int(generation), retry=None,
                                                         timeout=self._timeout)
        except (api_exceptions.GoogleAPICallError, requests.exceptions.RequestException, ValueError):
            pass  # the engine's next attempt overwrites it; the error reported is the mismatch

    def _confirm_existing(self, bucket: str, url: Url) -> None:
        """After a 409 on create: the bucket exists; it is ours if we can read it."""
        try:
            self._client.get_bucket(bucket, retry=None, timeout=self._timeout)
        except api_exceptions.Forbidden:
            raise AuthError("bucket name is taken by another project", url=str(url), operation="mkdir") from None


def _read_for_upload(path: str) -> Tuple[str, Optional[bytes]]:
    """(base64 CRC32C, the file's bytes if small enough to hold in memory)."""
    checksum = _crc32c.Checksum()
    try:
        with open(path, "rb") as fh:
            data = fh.read(wire.BLOCK + 1)
            checksum.update(data)
            for block in iter(lambda: fh.read(wire.BLOCK), b""):
                checksum.update(block)
    except OSError as err:
        raise local_error(err, path, "put") from err
    return base64.b64encode(checksum.digest()).decode(), data if len(data) <= wire.BLOCK else None


def _json(response: Any) -> Dict[str, Any]:
    try:
        found = response.json() if response is not None else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _blob_info(url: Url, blob: Any) -> ObjectInfo:
    updated = blob.updated
    return ObjectInfo(url, int(blob.size or 0), str(blob.generation) if blob.generation else None,
                      updated.timestamp() if updated is not None else None)


def _reason(response: Any) -> str:
    try:
        return str(response.json()["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return str(getattr(response, "reason", "") or "")


def translate(err: BaseException, url: str, operation: str) -> Optional[TransferError]:
    """The library's error for a google/requests/urllib3 exception; None for anything else."""
    if isinstance(err, _storage_errors.DataCorruption):
        return ChecksumMismatch("CRC32C of the transferred bytes does not match the store's",
                                url=url, operation=operation)
    if isinstance(err, _storage_errors.InvalidResponse):
        headers = getattr(err.response, "headers", None) or {}
        return wire.status_error(int(getattr(err.response, "status_code", 0) or 0), _reason(err.response),
                                 url, operation, retry_after_seconds(headers.get("retry-after")))
    if isinstance(err, api_exceptions.GoogleAPICallError):
        return wire.status_error(int(err.code or 0), str(err.message)[:200], url, operation)
    if isinstance(err, api_exceptions.RetryError):
        return TransientError(f"gave up retrying: {err.cause}", url=url, operation=operation)
    if isinstance(err, google.auth.exceptions.RefreshError):
        return AuthError(f"could not obtain an access token: {err}", url=url, operation=operation)
    if isinstance(err, google.auth.exceptions.TransportError):
        return TransientError(f"token endpoint unreachable: {type(err).__name__}", url=url, operation=operation)
    if isinstance(err, requests.exceptions.SSLError):
        return RemoteError(f"TLS failure: {err}", url=url, operation=operation)
    if isinstance(err, _NETWORK_ERRORS):
        return TransientError(f"{type(err).__name__}: {err}", url=url, operation=operation)
    if isinstance(err, (requests.exceptions.RequestException, ValueError)):
        return InvalidInput(f"{type(err).__name__}: {err}", url=url, operation=operation)
    return None


@contextlib.contextmanager
def _translated(url: Url, operation: str) -> Iterator[None]:
    try:
        yield
    except TransferError as err:
        if err.url is None:  # raised below the library (a redirect refused by a response hook)
            raise err.relabelled(url=str(url), operation=operation) from err
        raise
    except Exception as err:  # noqa: BLE001 - what translate() does not know is re-raised as is
        found = translate(err, str(url), operation)
        if found is None:
            raise
        raise found from err
