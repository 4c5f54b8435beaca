"""Shared Key signing, proven against azure-storage-blob's own signer (``SharedKeyCredentialPolicy``).

Random requests (methods, standard and ``x-ms-*`` headers with mixed-case metadata names,
query parameters, unicode blob names, path-style emulator paths, body lengths) are signed by
``transfer.backends._azure_sign`` and by the reference; the ``Authorization`` values must be
byte-identical. The reference never fills the plain ``Range`` slot (it sends ``x-ms-range``),
and our backend never sends ``Range``: the random headers leave it out.
"""

from __future__ import annotations

import base64
import random
import string

import pytest
from azure.core.pipeline import PipelineContext, PipelineRequest
from azure.core.pipeline.transport import HttpRequest
from azure.storage.blob._shared.authentication import SharedKeyCredentialPolicy

from transfer.backends._azure_sign import X_MS_VERSION, SharedKey, ordered, string_to_sign
from transfer.backends._wire_common import canonical_query, uri_encode_path
from transfer.errors import ConfigError

_STANDARD = ("Content-Encoding", "Content-Language", "Content-MD5", "Content-Type", "Date", "If-Modified-Since",
             "If-Match", "If-None-Match", "If-Unmodified-Since")
_QUERY_NAMES = ("comp", "restype", "prefix", "marker", "delimiter", "maxresults", "blockid", "timeout", "include",
                "snapshot", "versionid")
_NAME_CHARS = string.ascii_letters + string.digits + "_-"
_UNICODE = "aé日本語ßü🙂 /%+&=?#~.-_'\"" + string.ascii_letters


def _text(rng: random.Random, alphabet: str, low: int, high: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))


def _request(rng: random.Random) -> tuple:
    account = _text(rng, string.ascii_lowercase + string.digits, 3, 24)
    blob = _text(rng, _UNICODE, 1, 30).strip("/") or "b"
    path = f"/{_text(rng, string.ascii_lowercase, 3, 12)}/{blob}"
    if rng.random() < 0.3:  # path-style, as an emulator is addressed: the account leads the path
        path = f"/{account}{path}"
    query = {name: _text(rng, _UNICODE, 0, 12) for name in rng.sample(_QUERY_NAMES, rng.randint(0, 4))}
    headers = [("x-ms-date", "Wed, 02 Dec 2026 05:00:00 GMT"), ("x-ms-version", X_MS_VERSION)]
    names = set()
    for _ in range(rng.randint(0, 5)):
        name = "x-ms-meta-" + _text(rng, _NAME_CHARS, 1, 10)
        if name.lower() not in names:
            names.add(name.lower())
            headers.append((name, _text(rng, string.printable[:94] + " ", 1, 20).strip() or "v"))
    for name in rng.sample(_STANDARD, rng.randint(0, 4)):
        headers.append((name, _text(rng, string.ascii_letters + string.digits + "=/+", 1, 24)))
    for name in rng.sample(["x-ms-range", "x-ms-blob-type", "x-ms-copy-source", "x-ms-client-request-id"], 2):
        headers.append((name, _text(rng, string.ascii_letters + "=-:/", 1, 24)))
    rng.shuffle(headers)
    return rng.choice(["GET", "PUT", "HEAD", "DELETE", "POST"]), account, uri_encode_path(path), \
        canonical_query(query), headers, rng.choice([0, 0, 1, 17, 4 << 20])


def _reference(key: str, method: str, account: str, path: str, query: str, headers: list, length: int) -> str:
    sent = dict(headers)
    if length or method in ("PUT", "POST"):
        sent["Content-Length"] = str(length)  # as transfer.http sends it
    request = HttpRequest(method, f"https://{account}.blob.core.windows.net{path}" + (f"?{query}" if query else ""),
                          headers=sent)
    SharedKeyCredentialPolicy(account, key).on_request(PipelineRequest(request, PipelineContext(None)))
    return str(request.headers["Authorization"])


def test_random_requests_sign_byte_identically_to_azure_storage_blob() -> None:
    rng = random.Random(35)
    for _ in range(1500):
        key = base64.b64encode(rng.randbytes(64)).decode()
        method, account, path, query, headers, length = _request(rng)
        ours = SharedKey(account, key).authorization(method, path, query, headers, length)
        assert ours == _reference(key, method, account, path, query, headers, length), \
            string_to_sign(account, method, path, query, headers, length)


def test_header_names_follow_the_service_collation_not_ascii() -> None:
    # "-" weighs nothing at the first level: a-b sorts with ab, after it
    assert ordered(["x-ms-meta-a-b", "x-ms-meta-ab", "x-ms-meta-aa"]) == \
        ("x-ms-meta-aa", "x-ms-meta-ab", "x-ms-meta-a-b")
    assert sorted(["x-ms-meta-a-b", "x-ms-meta-ab"]) == ["x-ms-meta-a-b", "x-ms-meta-ab"]


def test_a_key_that_is_not_base64_is_one_config_error_naming_the_account_not_the_key() -> None:
    with pytest.raises(ConfigError) as refused:
        SharedKey("acct1", "not*base64*at*all")
    assert "acct1" in str(refused.value) and "not*base64" not in str(refused.value)
    assert "KEY" not in repr(SharedKey("acct1", base64.b64encode(b"KEY-BYTES").decode()))
