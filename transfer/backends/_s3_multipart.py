"""S3's :class:`~transfer.backends.base.MultipartUploads`: an upload in parts.

Every part goes up with its ``x-amz-checksum-crc32``, which the store checks against the
bytes it received (as it would a Content-MD5, at an eighth of MD5's CPU); the assembled
object's ETag must be the parts' MD5s combined. A part's receipt is ``ETAG\nCRC32``.
"""

from __future__ import annotations

import binascii
import zlib

from transfer import _digests
from transfer.backends._s3_route import check_reply
from transfer.backends._s3_wire import (
    _info, _server_side_encrypted, multipart_etag, s3_error, split_url, xml_escape, xml_tree,
)
from transfer.backends._sigv4 import EMPTY_SHA256, UNSIGNED, canonical_query
from transfer.backends.base import ObjectInfo
from transfer.errors import ChecksumMismatch, NotFound, RemoteError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Sequence, Tuple, Union

    from transfer.backends._s3_route import AnyReply, Router
    from transfer.http.connection import Body, FileRegion
    from transfer.urls import Url

__all__ = ["S3Multipart", "crc32_of"]


class S3Multipart:
    """Multipart uploads through one :class:`~transfer.backends._s3_route.Router`; thread-safe."""

    def __init__(self, router: Router) -> None:
        self._router = router

    def _send(self, method: str, url: Url, query: Dict[str, str], headers: List[Tuple[str, str]],
              body: Body = None, payload_hash: str = EMPTY_SHA256) -> AnyReply:
        return self._router.send(method, split_url(url), canonical_query(query), headers, body, payload_hash,
                                 str(url))

    def start(self, url: Url) -> str:
        """CreateMultipartUpload declaring CRC32 part checksums; its UploadId."""
        headers = [("x-amz-checksum-algorithm", "CRC32")]
        with self._send("POST", url, {"uploads": ""}, headers) as response:
            check_reply(response, str(url), "put")
            upload_id = xml_tree(response.read()).findtext("UploadId")
        if not upload_id:
            raise RemoteError("no UploadId in CreateMultipartUpload response", url=str(url), operation="put")
        return upload_id

    def upload_part(self, url: Url, upload_id: str, number: int, region: Union[FileRegion, bytes]) -> str:
        """UploadPart with ``x-amz-checksum-crc32``, which the store checks; the part's receipt."""
        crc = crc32_of(region)
        query = {"partNumber": str(number), "uploadId": upload_id}
        with self._send("PUT", url, query, [("x-amz-checksum-crc32", crc)], region, UNSIGNED) as response:
            check_reply(response, str(url), "put")
            etag = response.headers.get("etag", "")
            echoed = response.headers.get("x-amz-checksum-crc32")
        if echoed is not None and echoed != crc:
            raise ChecksumMismatch(f"CRC32 of part {number} as stored ({echoed}) differs from the file's ({crc})",
                                   url=str(url), operation="put")
        return f"{etag}\n{crc}"

    def complete(self, url: Url, upload_id: str, receipts: Sequence[str]) -> ObjectInfo:
        """CompleteMultipartUpload from the receipts, then a HEAD whose ETag must be the
        parts' MD5s combined."""
        pairs = [receipt.partition("\n")[::2] for receipt in receipts]
        etags = [etag for etag, _ in pairs]
        listed = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>{xml_escape(etag)}</ETag>"
                         + (f"<ChecksumCRC32>{crc}</ChecksumCRC32>" if crc else "") + "</Part>"
                         for n, (etag, crc) in enumerate(pairs, 1))
        body = f"<CompleteMultipartUpload>{listed}</CompleteMultipartUpload>".encode()
        with self._send("POST", url, {"uploadId": upload_id}, [], body, _digests.sha256_hex(body)) as response:
            check_reply(response, str(url), "put")
            text = response.read()
        if b"<Error>" in text:  # S3 may report a failed completion inside a 200 response
            raise s3_error(500, text, str(url), "put")
        with self._send("HEAD", url, {}, []) as response:
            check_reply(response, str(url), "stat")
            info = _info(url, response.status, response.headers)
            encrypted = _server_side_encrypted(response.headers)
        expected = multipart_etag(etags)
        if expected and not encrypted and (info.version or "").lower() != expected:
            raise ChecksumMismatch("ETag of the assembled object differs from its parts' MD5s", url=str(url),
                                   operation="put")
        return info

    def abort(self, url: Url, upload_id: str) -> None:
        """AbortMultipartUpload; an upload already completed or aborted (NoSuchUpload) is success."""
        try:
            with self._send("DELETE", url, {"uploadId": upload_id}, []) as response:
                check_reply(response, str(url), "abort", ok=(200, 204))
        except NotFound:
            pass


def _b64_crc32(value: int) -> str:
    return binascii.b2a_base64(value.to_bytes(4, "big"), newline=False).decode()


def crc32_of(region: Union[FileRegion, bytes]) -> str:
    """Base64 of the big-endian CRC32 of a file region or of bytes, as ``x-amz-checksum-crc32``
    wants it."""
    if isinstance(region, bytes):
        return _b64_crc32(zlib.crc32(region))
    crc = 0
    with open(region.path, "rb") as fh:
        fh.seek(region.offset)
        left = region.length
        while left > 0:
            block = fh.read(min(left, 1 << 20))
            if not block:
                break
            crc = zlib.crc32(block, crc)
            left -= len(block)
    return _b64_crc32(crc)
