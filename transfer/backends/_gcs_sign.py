"""GCS signed URLs, V4 (``GOOG4-RSA-SHA256``), as google-cloud-storage's
``Blob.generate_signed_url(version="v4")`` builds them, byte for byte
(``tests/test_gcs_presign.py`` proves it for 200 random inputs).

Pure: the RSA signature comes from a callable (the service-account credentials'
``sign_bytes``, google-auth's, which signs with ``cryptography``), the clock is a parameter.
Path-style URLs on the backend's endpoint: ``ENDPOINT/BUCKET/KEY?X-Goog-...``. The payload is
``UNSIGNED-PAYLOAD``: who holds the URL chooses the bytes, as with S3's presigned PUT.
"""

from __future__ import annotations

import hashlib
import time
from typing import Callable, Dict, Optional
from urllib.parse import quote, urlsplit

ALGORITHM = "GOOG4-RSA-SHA256"
MAX_EXPIRES = 604800  # seven days, V4's limit (as SigV4's)


def signed_url(endpoint: str, bucket: str, key: str, method: str, expires: int, email: str,
               sign: Callable[[bytes], bytes], now: Optional[float] = None,
               content_type: Optional[str] = None) -> str:
    """The URL that lets anyone ``method`` (GET, PUT) ``gs://bucket/key`` for ``expires``
    seconds from ``now`` (seconds since the epoch, default the clock), signed for the
    service account ``email`` by ``sign`` (RSA PKCS#1 v1.5 over SHA-256 of its argument).
    With ``content_type``, the request must send that ``Content-Type`` header."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    scope = f"{stamp[:8]}/auto/storage/goog4_request"
    headers = {"host": urlsplit(endpoint).netloc}
    if content_type is not None:
        headers["content-type"] = " ".join(content_type.split())
    names = sorted(headers)
    signed_headers = ";".join(names)
    query = _encode({"X-Goog-Algorithm": ALGORITHM, "X-Goog-Credential": f"{email}/{scope}",
                     "X-Goog-Date": stamp, "X-Goog-Expires": str(expires), "X-Goog-SignedHeaders": signed_headers})
    resource = f"/{bucket}/{quote(key.encode('utf-8'), safe=b'/~')}"
    canonical = "\n".join((method, resource, query, "".join(f"{n}:{headers[n]}\n" for n in names),
                           signed_headers, "UNSIGNED-PAYLOAD"))
    to_sign = "\n".join((ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode("utf-8")).hexdigest()))
    return f"{endpoint}{resource}?{query}&X-Goog-Signature={sign(to_sign.encode('ascii')).hex()}"


def _encode(params: Dict[str, str]) -> str:
    """The canonical query: each name and value quoted (only ``~`` kept besides unreserved
    characters), the pairs sorted as strings (as the reference sorts them)."""
    return "&".join(sorted(f"{quote(name, safe='~')}={quote(value, safe='~')}" for name, value in params.items()))
