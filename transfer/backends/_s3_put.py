"""One PUT of a small file: the checks it carries and what its answer must vouch for.

The single PUT (:meth:`S3Backend.put <transfer.backends.s3.S3Backend.put>`, its exclusive,
conditional and attributed kinds) and the pipelined PUTs of a batch
(:mod:`transfer.backends._s3_pipelined`) send the same checks: Content-MD5, which the store
verifies, then forgets but for the ETag, and the full-object ``x-amz-checksum-crc32``, which it
keeps with the object, so later reads' checksum describes the bytes end to end. An answer whose
echoed CRC32 or MD5 ETag differs from the file's is a :class:`~transfer.errors.ChecksumMismatch`
(the single PUT) or is not taken (the pipelined PUT, which also wants one of them shown: its
answer could be another request's). Imported by uploads only: a stage-in never loads it.
"""

from __future__ import annotations

import binascii

from transfer.atomic import local_error
from transfer.backends._s3_route import check_reply
from transfer.backends._s3_wire import _server_side_encrypted, md5_of_etag, split_url
from transfer.backends._sigv4 import UNSIGNED
from transfer.backends.base import ObjectInfo
from transfer.errors import AlreadyExists, ChecksumMismatch, InvalidInput, RemoteError
from transfer.http.connection import file_body_crc32

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple

    from transfer.backends._s3_route import Router
    from transfer.urls import Url

__all__ = ["put_checks", "put_file", "put_mismatch", "put_verified"]


def put_file(router: Router, path: str, url: Url, exclusive: bool, if_match: Optional[str] = None,
             extra: Sequence[Tuple[str, str]] = ()) -> ObjectInfo:
    """PUT the file ``path`` as ``url`` in one request with :func:`put_checks` and ``extra``
    headers; ``exclusive``: ``If-None-Match: *`` (an existing key: AlreadyExists); ``if_match``:
    only over that ETag (another, or none: RemoteError). The answer's checks must match the file's."""
    target = split_url(url)
    text = str(url)
    if not target.key:
        raise InvalidInput("S3 URL has no key to upload to", url=text, operation="put")
    try:
        size, md5, crc32, body = file_body_crc32(path)
    except OSError as err:
        raise local_error(err, path, "put") from err
    crc, headers = put_checks(md5, crc32)
    headers += extra
    if exclusive:
        headers.append(("If-None-Match", "*"))
    if if_match is not None:
        headers.append(("If-Match", f'"{if_match.strip(chr(34))}"'))
    with router.send("PUT", target, "", headers, body, UNSIGNED, text) as response:
        if exclusive and response.status == 412:
            response.read()
            raise AlreadyExists("an object of this name exists (exclusive create)", url=text,
                                operation="put", status=412)
        if if_match is not None and response.status in (404, 412):
            response.read()
            raise RemoteError(f"the object is no longer ETag {if_match} (If-Match): not replaced", url=text,
                              operation="put", status=412)
        check_reply(response, text, "put")
        etag = response.headers.get("etag", "")
    mismatch = put_mismatch(response.headers, md5, crc)
    if mismatch is not None:
        raise ChecksumMismatch(mismatch, url=text, operation="put")
    return ObjectInfo(url, size, etag.strip('"') or None)


def put_checks(md5: bytes, crc32: int) -> Tuple[str, List[Tuple[str, str]]]:
    """(the CRC32 as ``x-amz-checksum-crc32`` writes it, the headers) of a single PUT: the
    store checks Content-MD5, then forgets it but for the ETag, and keeps the full-object
    CRC32 with the object, so later reads' checksum describes the bytes end to end."""
    crc = binascii.b2a_base64(crc32.to_bytes(4, "big"), newline=False).decode()
    return crc, [("Content-MD5", binascii.b2a_base64(md5, newline=False).decode()), ("x-amz-checksum-crc32", crc)]


def put_mismatch(headers: Dict[str, str], md5: bytes, crc: str) -> Optional[str]:
    """Why a PUT's answer says the store holds other bytes than those sent (the CRC32 it
    echoed, or an MD5 ETag of an object not encrypted with a KMS key), or None."""
    echoed = headers.get("x-amz-checksum-crc32")
    if echoed is not None and echoed != crc:
        return f"CRC32 as stored ({echoed}) differs from the file's ({crc})"
    found = md5_of_etag(headers.get("etag", ""))
    if found and found.lower() != md5.hex() and not _server_side_encrypted(headers):
        return "ETag of stored object differs from local MD5"
    return None


def put_verified(headers: Dict[str, str], md5: bytes, crc: str) -> bool:
    """Whether a PUT's answer vouches for the bytes sent: no mismatch, and at least one of the
    CRC32 echoed or an MD5 ETag to show it (an answer with neither could be another request's)."""
    if put_mismatch(headers, md5, crc) is not None:
        return False
    return "x-amz-checksum-crc32" in headers or (md5_of_etag(headers.get("etag", "")) is not None
                                                 and not _server_side_encrypted(headers))
