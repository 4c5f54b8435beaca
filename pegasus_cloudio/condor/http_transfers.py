"""http(s) for the plugin: single-PUT uploads and downloads with a bearer token.

The library's http backend downloads only and knows no ``$_CONDOR_CREDS`` tokens, but the
plugin must upload to URLs HTCondor pre-signed for PUT (``output_destination = s3://...`` is
handed over as ``https://...?X-Amz-Signature=...``) and honour ``<name>+https://`` prefixes as
curl_plugin does. :class:`PluginHttpBackend` adds exactly that on top of the session's own
http backend and delegates everything else to it; :func:`plugin_session` hands it out for
http/https URLs (the session's ``backends`` seam), so the one :class:`~transfer.engine.Engine`
still does all threading, retries and atomic writes.

* An upload is one PUT with ``Content-Length`` and ``Content-MD5`` (a store that checks it
  rejects corrupted bodies; left out when a V2-style URL signature would cover it);
  200/201/204 succeed; 307/308 redirects are followed. When the URL is pre-signed and the
  returned ETag is an MD5, it must match the local file. A file whose size, modification time
  or inode changed while it was sent fails (LocalIOError): a store that ignores Content-MD5
  would hold a mix of two versions.
* A token is re-read for every request and sent only to the URL's own origin: a redirect to
  another origin drops it. Tokens are never sent over plain http.
* Error URLs have their query string removed, so signatures never reach messages.
"""

from __future__ import annotations

import base64
import os
import re
from typing import BinaryIO, Hashable, List, Mapping, Optional, Tuple

from pegasus_cloudio.condor.credentials import is_presigned, may_add_headers, read_token
from transfer import schemes
from transfer.atomic import local_error
from transfer.backends.base import Backend, ByteRange, ObjectInfo
from transfer.backends.http import check_response as check_status
from transfer.errors import ChecksumMismatch, InvalidInput, LocalIOError, TransferError
from transfer.http.connection import Body, file_body
from transfer.http.origins import REDIRECTS, OriginPools, origin_of
from transfer.http.pool import PooledResponse
from transfer.backends.opening import Opening
from transfer.lean import record
from transfer.session import Session
from transfer.config import Settings
from transfer.urls import Url

_PUT_REDIRECTS = (307, 308)
_MD5_ETAG = re.compile(r'^"?([0-9a-fA-F]{32})"?$')

Headers = List[Tuple[str, str]]


@record(frozen=True)
class TokenUrl(Url):
    """An http(s) URL whose requests carry the bearer token ``$_CONDOR_CREDS/<credential>.use``.

    A distinct type, so it never compares equal to the same URL without a credential.
    """

    credential: str = ""


def without_query(url: Url) -> Url:
    """``url`` with its query string removed (safe to put in messages)."""
    return url.with_path(url.path.split("?", 1)[0])


class PluginHttpBackend:
    """The session's http backend plus PUT uploads and bearer-token downloads. Thread-safe."""

    def __init__(self, inner: Backend, context: Opening) -> None:
        self._inner = inner
        self._context = context
        self._origins = OriginPools(max_idle=context.settings.threads + 2, ssl_context=context.ssl_context,
                                    timeouts=context.timeouts, stats=context.stats)

    # -- Backend ------------------------------------------------------------------------

    def stat(self, url: Url) -> ObjectInfo:
        return self._inner.stat(url)

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        """Delegated unless the URL carries a credential prefix; then GET with the token."""
        if not isinstance(url, TokenUrl):
            return self._inner.get(url, sink, byte_range)
        extra = [("Range", f"bytes={byte_range[0]}-{byte_range[1] - 1}")] if byte_range else []
        with self._request("GET", url, extra, None, REDIRECTS) as response:
            check_status(response, without_query(url), "get", ok=(206,) if byte_range else (200,))
            count = response.read_into(sink.write)
            declared = response.headers.get("content-length", "")
            version = response.headers.get("etag") or response.headers.get("last-modified")
        if declared.isdigit() and count != int(declared):
            raise ChecksumMismatch(f"received {count} of {declared} bytes", url=str(without_query(url)),
                                   operation="get")
        return ObjectInfo(url, count, version)

    def put(self, path: str, url: Url) -> ObjectInfo:
        """One PUT of the whole file; verified by Content-MD5 (and the ETag of pre-signed URLs).
        LocalIOError when the file changed while it was sent: a store that ignores Content-MD5
        may then hold bytes the file never had at once."""
        try:
            before = _file_state(path)
            size, md5, body = file_body(path)
        except OSError as err:
            raise local_error(err, path, "put") from err
        headers = [("Content-MD5", base64.b64encode(md5).decode())] if may_add_headers(url.path) else []
        with self._request("PUT", url, headers, body, _PUT_REDIRECTS) as response:
            check_status(response, without_query(url), "put", ok=(200, 201, 204))
            etag = response.headers.get("etag", "")
        try:
            after = _file_state(path)
        except OSError as err:
            raise local_error(err, path, "put") from err
        if after != before or after[0] != size:
            raise LocalIOError("the file changed while it was uploaded (its size or modification "
                               "time differs); the stored object may not match it", url=path, operation="put")
        found = _MD5_ETAG.match(etag)
        if found and is_presigned(url.path) and found.group(1).lower() != md5.hex():
            raise ChecksumMismatch("ETag of stored object differs from local MD5",
                                   url=str(without_query(url)), operation="put")
        return ObjectInfo(url, size, etag.strip('"') or None)

    def close(self) -> None:
        """Closes this backend's own pools and the inner backend it was opened with."""
        try:
            self._origins.close()
        finally:
            self._inner.close()

    # -- plumbing -----------------------------------------------------------------------

    def _auth(self, url: Url, origin: str, first_origin: str) -> Headers:
        if not isinstance(url, TokenUrl) or origin != first_origin:
            return []
        if not origin.startswith("https:"):
            raise InvalidInput("refusing to send a bearer token over plain http",
                               url=str(without_query(url)), operation="credentials")
        return [("Authorization", f"Bearer {read_token(url.credential, self._context.env)}")]

    def _request(self, method: str, url: Url, headers: Headers, body: Body,
                 follow: Tuple[int, ...]) -> PooledResponse:
        first_origin = origin_of(url.full)
        try:
            response, _ = self._origins.request(
                method, url.full, lambda origin: headers + self._auth(url, origin, first_origin), body, follow)
        except TransferError as err:
            raise err.relabelled(url=str(without_query(url)), operation=method.lower()) from err
        return response


def _file_state(path: str) -> Tuple[int, int, int]:
    """(size, modification time in ns, inode) of a local file; OSError if it cannot be read."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


class _PluginHttp:
    """Opens http/https URLs as one :class:`PluginHttpBackend` around the registry's http backend
    (a :class:`~transfer.session.BackendOpener`)."""

    def endpoint_key(self, url: Url, context: Opening) -> Hashable:
        return "plugin-http"  # one backend for both schemes, as HTCondor hands them together

    def open_backend(self, url: Url, context: Opening) -> Backend:
        from transfer.backends import http

        return PluginHttpBackend(http.open_backend(url, context), context)


def plugin_session(settings: Settings, env: Mapping[str, str]) -> Session:
    """A :class:`Session` whose http/https URLs go to :class:`PluginHttpBackend`."""
    opener = _PluginHttp()
    return Session(settings, env, backends=dict.fromkeys(schemes.HTTP, opener))
