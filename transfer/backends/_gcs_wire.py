"""The pieces of the GCS JSON API that google-cloud-storage does not cover the way we need.

Pure Python, no Google imports: request bodies, answer checks and the status-to-error table.

* **Batch deletes**: up to 100 DELETE calls in one request. Each part carries a
  ``Content-ID`` (``<itemN>``) and answers are matched by the ``<response-itemN>`` the server
  echoes, not by position. google-cloud-storage's ``client.batch()`` sends parts without
  Content-ID, which GCS tolerates but fake-gcs-server silently drops (it then answers with an
  empty multipart body), so the request is built here as Google's batch documentation writes it.
* **Stored gzip**: objects stored with ``Content-Encoding: gzip`` are fetched as stored (so
  the CRC32C, which is of the stored bytes, can be checked) and decompressed on the way to the
  file, giving the bytes GCS and ``gsutil``/``gcloud storage cp`` give (decompressive transcoding).
* **Single-request uploads**: ``multipart/related`` with the object's CRC32C in its metadata,
  streamed from disk (the library's multipart upload needs the whole file in memory).
"""

from __future__ import annotations

import json
import secrets
import zlib
from typing import Any, BinaryIO, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import quote

from transfer.backends._wire_common import batch_answers
from transfer.backends.base import ByteRange, ObjectInfo
from transfer.errors import (
    AuthError,
    ChecksumMismatch,
    NotFound,
    RemoteError,
    Throttled,
    TransferError,
    TransientError,
)
from transfer.urls import Url

MAX_CALLS = 100  # the JSON API's limit per batch request
BLOCK = 1 << 20

_GZIP = 16 + zlib.MAX_WBITS  # wbits for a gzip header and trailer
_INFLATE_STEP = 1 << 20  # output bound per decompress call: a small body may inflate a thousandfold



def object_path(bucket: str, key: str) -> str:
    """``/storage/v1/b/BUCKET/o/KEY`` with the key fully percent-encoded (``/`` too)."""
    return f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(key, safe='')}"


def status_error(status: int, message: str, url: str, operation: str,
                 retry_after: Optional[float] = None) -> TransferError:
    """Translate an HTTP status from GCS into the library's exception tree (``retry_after``:
    the answer's ``Retry-After`` in seconds, kept on a :class:`Throttled`)."""
    text = f"HTTP {status}" + (f": {message}" if message else "")
    if status == 404:
        return NotFound(text, url=url, operation=operation, status=status)
    if status in (401, 403):
        return AuthError(text, url=url, operation=operation, status=status)
    if status in (429, 503):
        return Throttled(text, url=url, operation=operation, status=status, retry_after=retry_after)
    if status == 408 or status >= 500:
        return TransientError(text, url=url, operation=operation, status=status)
    return RemoteError(text, url=url, operation=operation, status=status)


# -- batch deletes ----------------------------------------------------------------------


def build_delete(endpoint: str, items: Sequence[Tuple[str, str]]) -> Tuple[str, bytes]:
    """(Content-Type, body) of a batch deleting ``items`` = [(bucket, key), ...]."""
    if not 0 < len(items) <= MAX_CALLS:
        raise ValueError(f"a batch holds 1 to {MAX_CALLS} calls, not {len(items)}")
    boundary = f"pegasus-cloudio-{secrets.token_hex(12)}"
    parts: List[str] = []
    for index, (bucket, key) in enumerate(items):
        # The CRLF before a delimiter belongs to the delimiter, hence the third one.
        parts.append(f"--{boundary}\r\nContent-Type: application/http\r\n"
                     f"Content-Transfer-Encoding: binary\r\nContent-ID: <item{index}>\r\n\r\n"
                     f"DELETE {endpoint}{object_path(bucket, key)} HTTP/1.1\r\n"
                     f"Content-Length: 0\r\n\r\n\r\n")
    parts.append(f"--{boundary}--\r\n")
    return f"multipart/mixed; boundary={boundary}", "".join(parts).encode()


def parse_batch(content_type: str, body: bytes) -> Dict[int, Tuple[int, str]]:
    """{item index: (HTTP status, response text)} for every part the server answered
    (``Content-ID: <response-itemN>``)."""
    answers: Dict[int, Tuple[int, str]] = {}
    for content_id, (status, _, text) in batch_answers(content_type, body).items():
        index = content_id.strip("<>").lower().rpartition("response-item")[2]
        if content_id.lower().startswith("<response-item") and index.isdigit():
            answers[int(index)] = (status, text.decode("utf-8", "replace").strip())
    return answers


def delete_outcomes(urls: Sequence[Url], answers: Mapping[int, Tuple[int, str]]) -> List[Optional[TransferError]]:
    """One entry per URL of a batch: None when removed or already absent."""
    outcomes: List[Optional[TransferError]] = []
    for index, url in enumerate(urls):
        status, text = answers.get(index, (0, ""))
        if status == 0:
            outcomes.append(TransientError("no answer for this object in the batch response",
                                           url=str(url), operation="delete"))
        elif 200 <= status < 300 or status == 404:
            outcomes.append(None)
        else:
            outcomes.append(status_error(status, text[:200], str(url), "delete"))
    return outcomes


# -- uploads and downloads ----------------------------------------------------------------


def multipart_upload(key: str, crc32c: str, path: str, size: int,
                     data: Optional[bytes]) -> Tuple[str, Any]:
    """(Content-Type, body) of a one-request upload; ``data`` is the file's bytes if in memory."""
    boundary = f"pegasus-cloudio-{secrets.token_hex(12)}"
    metadata = json.dumps({"name": key, "crc32c": crc32c}).encode()
    head = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode() + metadata
            + f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode())
    tail = f"\r\n--{boundary}--\r\n".encode()
    body: Any = head + data + tail if data is not None else StreamedBody(head, path, size, tail)
    return f'multipart/related; boundary="{boundary}"', body


class StreamedBody:
    """``head + file bytes + tail`` with a known length; iterable more than once, because
    the authorized session re-sends the body after refreshing an expired token."""

    def __init__(self, head: bytes, path: str, size: int, tail: bytes) -> None:
        self._head, self._path, self._size, self._tail = head, path, size, tail

    def __len__(self) -> int:
        return len(self._head) + self._size + len(self._tail)

    def __iter__(self) -> Iterator[bytes]:
        yield self._head
        with open(self._path, "rb") as fh:
            left = self._size
            while left > 0:
                block = fh.read(min(left, BLOCK))
                if not block:
                    raise TransientError("file shrank while being uploaded", url=self._path, operation="put")
                left -= len(block)
                yield block
        yield self._tail


class CountingSink:
    """Writes everything it is given to ``sink`` (looping over short writes) and counts it.

    ``count`` is of the bytes received (what the stored CRC32C and size describe); after
    :meth:`expect` was told the body is ``gzip``, those are decompressed on the way to ``sink``
    (``written`` counts what reached it), as GCS's decompressive transcoding would.
    """

    def __init__(self, sink: BinaryIO) -> None:
        self._sink = sink
        self._gunzip: Optional[Any] = None
        self.count = 0
        self.written = 0

    def expect(self, encoding: str, url: Url, byte_range: Optional[ByteRange]) -> None:
        """Called with the response's ``Content-Encoding`` before any body byte arrives."""
        if encoding.strip().lower() != "gzip":
            return
        if byte_range is not None:  # a range of the compressed bytes is no range of the file
            raise RemoteError("ranged read of an object stored with Content-Encoding: gzip", url=str(url),
                              operation="get")
        self._gunzip = zlib.decompressobj(_GZIP)

    def write(self, data: bytes) -> int:
        self.count += len(data)
        if self._gunzip is None:
            self._emit(data)
            return len(data)
        pending = bytes(data)
        while pending:
            if self._gunzip.eof:  # gzip allows members one after another
                pending, self._gunzip = self._gunzip.unused_data + pending, zlib.decompressobj(_GZIP)
            self._emit(self._gunzip.decompress(pending, _INFLATE_STEP))
            pending = self._gunzip.unconsumed_tail
        return len(data)

    def finish(self, url: Url) -> None:
        """Flush what the decompressor holds; a gzip body cut short is an error."""
        if self._gunzip is None:
            return
        self._emit(self._gunzip.flush())
        if not self._gunzip.eof:
            raise ChecksumMismatch("gzip-encoded body ends inside its stream", url=str(url), operation="get")

    def _emit(self, data: bytes) -> None:
        view = memoryview(data)
        self.written += len(view)
        while view:
            written = self._sink.write(view)
            view = view[written if written is not None else len(view):]


def check_download(url: Url, status: int, headers: Mapping[str, str], count: int,
                   byte_range: Optional[ByteRange]) -> ObjectInfo:
    """Check the byte count of a finished download (its CRC32C is checked by the library)."""
    generation = headers.get("x-goog-generation") or None
    if byte_range is None:
        size_text = headers.get("x-goog-stored-content-length") or headers.get("content-length") or ""
        expected = size = int(size_text) if size_text.isdigit() else count
    else:
        if status != 206:
            raise RemoteError(f"HTTP {status} to a ranged read (expected 206)", url=str(url), operation="get")
        total = headers.get("content-range", "").rpartition("/")[2]
        size = int(total) if total.isdigit() else 0
        if size and byte_range[1] > size:
            raise RemoteError(f"range {byte_range} ends past the object's {size} bytes", url=str(url),
                              operation="get")
        expected = byte_range[1] - byte_range[0]
    if count != expected:
        raise ChecksumMismatch(f"received {count} bytes, expected {expected}", url=str(url), operation="get")
    return ObjectInfo(url, size, generation)


class Watching:
    """A transport for the library's download that tells ``sink`` the body's encoding first."""

    def __init__(self, session: Any, sink: CountingSink, url: Url, byte_range: Optional[ByteRange]) -> None:
        self._session, self._sink, self._url, self._range = session, sink, url, byte_range

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        response = self._session.request(method, url, **kwargs)
        if response.status_code < 300:
            self._sink.expect(response.headers.get("content-encoding", ""), self._url, self._range)
        return response


def check_upload(url: Url, resource: Mapping[str, Any], size: int, crc32c: Optional[str]) -> ObjectInfo:
    """Compare the stored object's size (and CRC32C, when known) with what was sent."""
    stored = str(resource.get("size", ""))
    if stored != str(size):
        raise ChecksumMismatch(f"store reports {stored or 'no'} bytes, sent {size}", url=str(url),
                               operation="put")
    if crc32c and resource.get("crc32c") and resource["crc32c"] != crc32c:
        raise ChecksumMismatch("CRC32C of the stored object differs from the local file", url=str(url),
                               operation="put")
    return ObjectInfo(url, size, str(resource.get("generation") or "") or None)
