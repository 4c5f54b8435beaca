"""S3's :class:`~transfer.backends.base.MultipartUploads`: an upload in parts, verified end to end.

Every part goes up with its ``x-amz-checksum-crc32``, which the store checks against the
bytes it received (as it would a Content-MD5, at an eighth of MD5's CPU). The upload is
declared ``x-amz-checksum-type: FULL_OBJECT`` (S3 since 2025, MinIO): the store then keeps
the CRC32 of the whole object, not a ``CRC-of-CRCs-N`` composite, and a download is checked
against it as a single PUT's is (:mod:`transfer.backends._s3_checksum`). The whole-object
CRC32 is combined here from the parts' (zlib's ``crc32_combine``, so no second read of the
file) and sent with CompleteMultipartUpload, which the store refuses when its own
combination differs; the HEAD that follows must give it back.

A store that answers CreateMultipartUpload without echoing ``FULL_OBJECT`` (older MinIO,
Ceph, stores without checksums) makes composite or no checksums: the whole-object value is
then not sent (such a store would compare it with its composite and refuse the upload), and
the parts' CRC32s and the multipart ETag (the parts' MD5s combined) are what is checked.
A part's receipt is ``ETAG\\nCRC32\\nLENGTH``.
"""

from __future__ import annotations

import binascii
import zlib

from transfer import _digests
from transfer.backends._s3_checksum import CHECKSUM_MODE
from transfer.backends._s3_route import check_reply
from transfer.backends._s3_wire import (
    _info, _server_side_encrypted, multipart_etag, s3_error, split_url, xml_escape, xml_tree,
)
from transfer.backends._sigv4 import EMPTY_SHA256, UNSIGNED
from transfer.backends._wire_common import canonical_query
from transfer.backends.base import ObjectInfo
from transfer.errors import ChecksumMismatch, NotFound, RemoteError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

    from transfer.backends._s3_route import AnyReply, Router
    from transfer.http.connection import Body, FileRegion
    from transfer.urls import Url

__all__ = ["S3Multipart", "crc32_of", "combined_crc32"]

_FULL_OBJECT = ("x-amz-checksum-type", "FULL_OBJECT")


class S3Multipart:
    """Multipart uploads through one :class:`~transfer.backends._s3_route.Router`; thread-safe
    (the set of uploads the store took as ``FULL_OBJECT`` changes by single adds and discards)."""

    def __init__(self, router: Router) -> None:
        self._router = router
        self._full_object: Set[str] = set()

    def _send(self, method: str, url: Url, query: Dict[str, str], headers: List[Tuple[str, str]],
              body: Body = None, payload_hash: str = EMPTY_SHA256) -> AnyReply:
        return self._router.send(method, split_url(url), canonical_query(query), headers, body, payload_hash,
                                 str(url))

    def start(self, url: Url) -> str:
        """CreateMultipartUpload declaring CRC32 checksums of the whole object; its UploadId."""
        headers = [("x-amz-checksum-algorithm", "CRC32"), _FULL_OBJECT]
        with self._send("POST", url, {"uploads": ""}, headers) as response:
            check_reply(response, str(url), "put")
            full = response.headers.get("x-amz-checksum-type", "").upper() == "FULL_OBJECT"
            upload_id = xml_tree(response.read()).findtext("UploadId")
        if not upload_id:
            raise RemoteError("no UploadId in CreateMultipartUpload response", url=str(url), operation="put")
        if full:
            self._full_object.add(upload_id)
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
        length = len(region) if isinstance(region, bytes) else region.length
        return f"{etag}\n{crc}\n{length}"

    def complete(self, url: Url, upload_id: str, receipts: Sequence[str]) -> ObjectInfo:
        """CompleteMultipartUpload from the receipts (with the whole object's CRC32 when the
        upload is ``FULL_OBJECT``), then a HEAD: its ETag must be the parts' MD5s combined and
        its full-object CRC32, when it gives one, the parts' CRC32s combined."""
        parts = [_receipt(text) for text in receipts]
        whole = _whole_crc32(parts)
        headers = [("x-amz-checksum-crc32", whole), _FULL_OBJECT] if (
            whole and upload_id in self._full_object) else []
        listed = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>{xml_escape(etag)}</ETag>"
                         + (f"<ChecksumCRC32>{crc}</ChecksumCRC32>" if crc else "") + "</Part>"
                         for n, (etag, crc, _) in enumerate(parts, 1))
        body = f"<CompleteMultipartUpload>{listed}</CompleteMultipartUpload>".encode()
        query = {"uploadId": upload_id}
        with self._send("POST", url, query, headers, body, _digests.sha256_hex(body)) as response:
            check_reply(response, str(url), "put")
            text = response.read()
        if b"<Error>" in text:  # S3 may report a failed completion inside a 200 response
            raise s3_error(500, text, str(url), "put")
        self._full_object.discard(upload_id)
        with self._send("HEAD", url, {}, [CHECKSUM_MODE]) as response:
            check_reply(response, str(url), "stat")
            info = _info(url, response.status, response.headers)
            _check_assembled(response.headers, info, [etag for etag, _, _ in parts], whole, str(url))
        return info

    def abort(self, url: Url, upload_id: str) -> None:
        """AbortMultipartUpload; an upload already completed or aborted (NoSuchUpload) is success."""
        self._full_object.discard(upload_id)
        try:
            with self._send("DELETE", url, {"uploadId": upload_id}, []) as response:
                check_reply(response, str(url), "abort", ok=(200, 204))
        except NotFound:
            pass


def _receipt(text: str) -> Tuple[str, str, Optional[int]]:
    """(ETag, CRC32 or "", length or None) of a part's receipt (older receipts: ``ETAG\\nCRC32``)."""
    etag, _, rest = text.partition("\n")
    crc, _, length = rest.partition("\n")
    return etag, crc, int(length) if length.isdigit() else None


def _whole_crc32(parts: Sequence[Tuple[str, str, Optional[int]]]) -> Optional[str]:
    """Base64 CRC32 of the parts' bytes in order, from their CRC32s; None if one lacks its CRC or length."""
    pieces: List[Tuple[int, int]] = []
    for _, crc, length in parts:
        if not crc or length is None:
            return None
        pieces.append((int.from_bytes(binascii.a2b_base64(crc), "big"), length))
    return _b64_crc32(combined_crc32(pieces))


def _check_assembled(headers: Dict[str, str], info: ObjectInfo, etags: List[str], whole: Optional[str],
                     url: str) -> None:
    expected = multipart_etag(etags)
    if expected and not _server_side_encrypted(headers) and (info.version or "").lower() != expected:
        raise ChecksumMismatch("ETag of the assembled object differs from its parts' MD5s", url=url, operation="put")
    stored = headers.get("x-amz-checksum-crc32", "")
    full = headers.get("x-amz-checksum-type", "FULL_OBJECT").upper() == "FULL_OBJECT"
    if whole and stored and full and "-" not in stored and stored != whole:
        raise ChecksumMismatch(f"CRC32 of the assembled object as stored ({stored}) differs from the file's "
                               f"({whole})", url=url, operation="put")


def _b64_crc32(value: int) -> str:
    return binascii.b2a_base64(value.to_bytes(4, "big"), newline=False).decode()


def crc32_of(region: Union[FileRegion, bytes]) -> str:
    """Base64 of the big-endian CRC32 of a file region or of bytes, as ``x-amz-checksum-crc32``
    wants it."""
    if isinstance(region, bytes):
        return _b64_crc32(zlib.crc32(region))
    crc = 0
    for block in region.blocks():
        crc = zlib.crc32(block, crc)
    return _b64_crc32(crc)


# -- zlib's crc32_combine, which Python's zlib does not expose ----------------------------
# A CRC register after n more zero bits is a linear map over GF(2): a 32x32 bit matrix, kept
# as its 32 columns (the image of each bit). Appending B to A: crc(A+B) = zeros(len B)(crc A) ^ crc B.

_ONE_ZERO_BIT = [0xEDB88320] + [1 << n for n in range(31)]


def _apply(matrix: Sequence[int], vector: int) -> int:
    total, column = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[column]
        vector >>= 1
        column += 1
    return total


def _compose(outer: Sequence[int], inner: Sequence[int]) -> List[int]:
    return [_apply(outer, column) for column in inner]


def _zero_bytes(count: int) -> List[int]:
    """The matrix of ``count`` zero bytes (square-and-multiply: ~2 log2(count) compositions)."""
    power = _ONE_ZERO_BIT
    for _ in range(3):
        power = _compose(power, power)  # 8 zero bits: one zero byte
    result = [1 << n for n in range(32)]
    while count:
        if count & 1:
            result = _compose(power, result)
        count >>= 1
        if count:
            power = _compose(power, power)
    return result


def combined_crc32(pieces: Sequence[Tuple[int, int]]) -> int:
    """CRC32 of consecutive pieces given as (CRC32, length) pairs, as ``zlib.crc32`` of their
    concatenation would be. One matrix per distinct length (parts are mostly one size)."""
    matrices: Dict[int, List[int]] = {}
    total = 0
    for crc, length in pieces:
        matrix = matrices.get(length)
        if matrix is None:
            matrix = matrices[length] = _zero_bytes(length)
        total = _apply(matrix, total) ^ crc
    return total
