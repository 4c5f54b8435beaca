"""Which checksum an S3 download is verified with, computed while the bytes stream past.

S3 answers a GET that asked ``x-amz-checksum-mode: ENABLED`` with the object's full-object
checksum when it has one (``x-amz-checksum-crc64nvme`` is Amazon's default for new objects,
multipart ones included), base64 of the big-endian value. In order of preference:

1. SHA-256, SHA-1 or CRC32 headers: the standard library computes them (CRC32 through zlib);
2. the ETag when it is an MD5 (single-part objects without SSE-KMS);
3. CRC64NVME or CRC32C headers, when ``awscrt`` (Amazon's C runtime, in the ``[aws]`` extra)
   is installed: about 6 GB/s, where MD5 manages about 0.4 GB/s. It is imported only when
   such a header arrives (the import costs ~0.1 s).

Composite checksums (``COMPOSITE`` type, or values ending ``-N``) describe parts, not the
object, and are not checked; the byte count always is.
"""

from __future__ import annotations

import binascii
import zlib

from transfer import _digests
from transfer.backends._wire_common import StreamCheck, digest_check

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Optional

__all__ = ["response_check", "stored_checksum", "CHECKSUM_HEADERS", "CHECKSUM_MODE"]

CHECKSUM_MODE = ("x-amz-checksum-mode", "ENABLED")
_HEADERS = tuple((name, f"x-amz-checksum-{name}") for name in ("sha256", "sha1", "crc32", "crc64nvme", "crc32c"))
CHECKSUM_HEADERS = tuple(header for _, header in _HEADERS)  # an answer without any: size and MD5 ETag only
if TYPE_CHECKING:
    _Crc = Callable[[bytes, int], int]
else:
    _Crc = object  # the alias above is for type checkers; typing is not imported at run time


def stored_checksum(headers: Dict[str, str]) -> Optional[str]:
    """``NAME:VALUE`` of the full-object checksum an answer to ``x-amz-checksum-mode: ENABLED``
    carries (the first of sha256, sha1, crc32, crc64nvme, crc32c), as S3 gives it (base64);
    None when it has none, or only a composite one (which describes parts, not the bytes)."""
    if headers.get("x-amz-checksum-type", "").upper() == "COMPOSITE":
        return None
    for name, header in _HEADERS:
        value = headers.get(header)
        if value and "-" not in value:
            return f"{name}:{value}"
    return None


def response_check(headers: Dict[str, str], etag_md5: Optional[str], size: Optional[int] = None) -> Optional[StreamCheck]:
    """The check for a full-object GET of ``size`` bytes (None: unknown) answered with ``headers``
    (None: size only)."""
    composite = headers.get("x-amz-checksum-type", "").upper() == "COMPOSITE"
    found = {} if composite else {
        name: value for name, header in _HEADERS if (value := headers.get(header)) and "-" not in value}
    for name in ("sha256", "sha1"):
        if name in found:
            return digest_check(name, _digests.new(name, size), found[name], base64_digest=True)
    if "crc32" in found:
        return _crc_check("crc32", zlib.crc32, 4, found["crc32"])
    if etag_md5:
        return digest_check("md5", _digests.new("md5", size), etag_md5.lower(), base64_digest=False)
    for name, width in (("crc64nvme", 8), ("crc32c", 4)):
        crc = _crt(name) if name in found else None
        if crc is not None:
            return _crc_check(name, crc, width, found[name])
    return None


def _crc_check(name: str, crc: _Crc, width: int, expected: str) -> StreamCheck:
    state = [0]

    def update(data: bytes) -> None:
        state[0] = crc(data, state[0])

    def final() -> str:
        return binascii.b2a_base64(state[0].to_bytes(width, "big"), newline=False).decode()
    return StreamCheck(name, expected, update, final)


def _crt(name: str) -> Optional[_Crc]:
    try:
        from awscrt import checksums  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        return None
    functions: Dict[str, _Crc] = {"crc64nvme": checksums.crc64nvme, "crc32c": checksums.crc32c}
    return functions[name]
