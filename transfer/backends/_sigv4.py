"""AWS Signature Version 4 for S3 requests, tuned for many small requests.

The signing key is derived once per (day, keys) and kept as the two HMAC hash states it
keys; the canonical request is built from pre-encoded parts. ``tests/test_s3_conformance.py`` proves it against botocore's signer. Payloads are sent as ``UNSIGNED-PAYLOAD`` with a ``Content-MD5`` header
where integrity matters, so a request is signed without hashing its body.
"""

from __future__ import annotations

import time

from transfer import _digests
from transfer._digests import hmac_sha256, hmac_sha256_states, sha256_hex
from transfer.backends._wire_common import canonical_query, quote_query

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Tuple, Union

    from transfer._digests import Hash as _Hash
    from transfer.credentials import Credentials

EMPTY_SHA256 = sha256_hex(b"")
UNSIGNED = "UNSIGNED-PAYLOAD"


def canonical_query_of(written: str) -> str:
    """A query as written (a redirect's ``Location``) in canonical form: every name and value
    decoded (``+`` as a space, as servers read it), URI-encoded again, the pairs sorted. Sent
    and signed as such, since a server checks the signature over the canonical form of what it
    received, not over the order and escapes the redirect happened to use."""
    from urllib.parse import unquote_plus  # a redirect's path only: kept off every job's start-up

    pairs = []
    for field in written.split("&"):
        if field:
            name, _, value = field.partition("=")
            pairs.append((quote_query(unquote_plus(name)), quote_query(unquote_plus(value))))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


class SigV4Signer:
    """Signs S3 requests for one set of credentials and one region."""

    def __init__(self, credentials: Union[Credentials, Callable[[], Credentials]], region: str,
                 service: str = "s3", clock: Callable[[], float] = time.time) -> None:
        """``credentials`` may be a source called before every signature (expiring keys)."""
        self._source = credentials if callable(credentials) else (lambda: credentials)
        self._clock = clock
        self._region = region
        self._service = service
        # (day, access key, secret, scope, Authorization up to SignedHeaders=, HMAC inner and
        # outer states of the signing key): derived once per day and key, replaced whole, and
        # again once OpenSSL serves SHA-256 (_digests.sha256_openssl: its states copy faster)
        self._state: Tuple[str, str, str, str, str, _Hash, _Hash] = ("", "", "", "", "", *hmac_sha256_states(b""))
        self._openssl = False
        self._clock_second = -1
        self._amz_date = ""
        self._last_tail: Tuple[object, str, str] = (None, "", "")

    def _signing_key(self, day: str, secret: str) -> bytes:
        key = ("AWS4" + secret).encode()
        for part in (day, self._region, self._service, "aws4_request"):
            key = hmac_sha256(key, part.encode())
        return key

    def _day_state(self, day: str, credentials: Credentials) -> Tuple[str, str, str, str, str, _Hash, _Hash]:
        """What every signature of ``day`` with these keys shares: the scope, the start of the
        Authorization value and HMAC-SHA256 keyed with the signing key, as hash states to copy
        (RFC 2104: H(K^opad, H(K^ipad, m)); the key is 32 bytes, under SHA-256's 64-byte block)."""
        state = self._state
        if state[0] == day and state[1] == credentials.access_key and state[2] == credentials.secret_key \
                and self._openssl is _digests.sha256_openssl:
            return state
        self._openssl = _digests.sha256_openssl
        inner, outer = hmac_sha256_states(self._signing_key(day, credentials.secret_key))
        scope = f"{day}/{self._region}/{self._service}/aws4_request"
        prefix = f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, SignedHeaders="
        state = (day, credentials.access_key, credentials.secret_key, scope, prefix, inner, outer)
        self._state = state
        return state

    def _now(self) -> str:
        second = int(self._clock())
        if second != self._clock_second:
            self._amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second))
            self._clock_second = second
        return self._amz_date

    def sign(
        self,
        method: str,
        host_header: str,
        encoded_path: str,
        query: str = "",
        payload_hash: str = EMPTY_SHA256,
        extra: Optional[List[Tuple[str, str]]] = None,
    ) -> List[Tuple[str, str]]:
        """Headers to send (``x-amz-*`` and Authorization), plus ``extra`` unchanged.

        Signed: host, x-amz-content-sha256, x-amz-date, the session token, and every
        ``x-amz-*`` and ``Content-MD5`` header of ``extra`` (S3 refuses unsigned ``x-amz-*``
        headers). Other ``extra`` headers (Range, Content-Type) are sent unsigned, as SigV4 allows.
        """
        credentials = self._source()
        amz_date = self._now()
        _, _, _, scope, prefix, inner_key, outer_key = self._day_state(amz_date[:8], credentials)
        headers = [("x-amz-content-sha256", payload_hash), ("x-amz-date", amz_date)]
        if credentials.session_token:
            headers.append(("x-amz-security-token", credentials.session_token))
        signed, tail = self._canonical_tail(method, host_header, payload_hash, headers, extra)
        canonical = f"{method}\n{encoded_path}\n{query}\n{tail}"
        inner = inner_key.copy()
        inner.update(f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{sha256_hex(canonical.encode())}"
                     .encode())
        outer = outer_key.copy()
        outer.update(inner.digest())
        headers.append(("Authorization", f"{prefix}{signed}, Signature={outer.hexdigest()}"))
        if extra:
            headers.extend(extra)
        return headers

    def presign(self, method: str, host_header: str, encoded_path: str, expires: int) -> str:
        """The query of a presigned URL (SigV4 query signing, as botocore's
        ``generate_presigned_url``): valid ``expires`` seconds from now for one ``method`` on
        ``host_header`` and ``encoded_path``; only ``host`` signed, the payload unsigned, a
        session token carried (and signed) in the query."""
        credentials = self._source()
        amz_date = self._now()
        _, _, _, scope, _, inner_key, outer_key = self._day_state(amz_date[:8], credentials)
        params = {"X-Amz-Algorithm": "AWS4-HMAC-SHA256", "X-Amz-Credential": f"{credentials.access_key}/{scope}",
                  "X-Amz-Date": amz_date, "X-Amz-Expires": str(expires), "X-Amz-SignedHeaders": "host"}
        if credentials.session_token:
            params["X-Amz-Security-Token"] = credentials.session_token
        query = canonical_query(params)
        canonical = f"{method}\n{encoded_path}\n{query}\nhost:{host_header}\n\nhost\n{UNSIGNED}"
        inner = inner_key.copy()
        inner.update(f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{sha256_hex(canonical.encode())}".encode())
        outer = outer_key.copy()
        outer.update(inner.digest())
        return f"{query}&X-Amz-Signature={outer.hexdigest()}"

    def _canonical_tail(self, method: str, host_header: str, payload_hash: str, headers: List[Tuple[str, str]],
                        extra: Optional[List[Tuple[str, str]]]) -> Tuple[str, str]:
        """(SignedHeaders, the canonical request after its path and query): the same for every
        request of one second with the same method, host and headers (a batch of GETs), so the
        last one is kept, replaced whole."""
        key = (method, host_header, payload_hash, tuple(headers), tuple(extra) if extra else ())  # sign() appends
        last = self._last_tail
        if last[0] == key:
            return last[1], last[2]
        signed, canonical = self.canonical_request(method, host_header, "", "", payload_hash,
                                                   headers + extra if extra else headers)
        tail = canonical[len(method) + 3:]  # after "METHOD\n" + "" + "\n" + "" + "\n"
        self._last_tail = (key, signed, tail)
        return signed, tail

    @staticmethod
    def canonical_request(method: str, host_header: str, encoded_path: str, query: str, payload_hash: str,
                          headers: List[Tuple[str, str]]) -> Tuple[str, str]:
        """(SignedHeaders, canonical request) over host and the signable ``headers``."""
        signed = [("host", host_header)]
        for name, value in headers:
            lower = name.lower()
            if lower.startswith("x-amz-") or lower == "content-md5":
                signed.append((lower, " ".join(value.split())))
        signed.sort()
        names = ";".join([name for name, _ in signed])
        canon_headers = "".join([f"{name}:{value}\n" for name, value in signed])
        return names, f"{method}\n{encoded_path}\n{query}\n{canon_headers}\n{names}\n{payload_hash}"
