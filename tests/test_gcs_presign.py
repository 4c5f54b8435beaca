"""GCS signed URLs V4 (issue 33): ours against google-cloud-storage's
``Blob.generate_signed_url(version="v4")``, the reference, for 200 random inputs (name from the
awkward-key corpus, endpoint, method, expiry, content type) with one service-account key made
here and the reference's clock fixed to ours: byte-identical URLs, no request sent by either.
Then through ``Client.presign`` on fake-gcs-server: a GET and a PUT through the URLs work with
no credentials. fake-gcs-server checks no signature (a tampered URL works as well), so what
proves the signatures is the differential test; bad input is one error naming the URL, and the
docs/library.md example runs."""

from __future__ import annotations

import datetime
import random
import re
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Optional

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.storage import _signing
from google.oauth2 import service_account

from pegasus_cloudio_testbed.keys import key_corpus
from transfer.backends._gcs_sign import signed_url
from transfer.client import Client
from transfer.errors import InvalidInput

ENDPOINTS = ("https://storage.googleapis.com", "http://127.0.0.1:4443", "https://gcs.example.org:8443")
TYPES = (None, "text/plain", "application/octet-stream", "text/html; charset=utf-8", "image/png")
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
pytest_plugins = ["fixtures_gcs"]


def _credentials() -> Any:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return service_account.Credentials.from_service_account_info({
        "type": "service_account", "project_id": "p", "private_key_id": "k1", "private_key": pem,
        "client_email": "signer@p.iam.gserviceaccount.com", "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token"})


def _theirs(credentials: Any, endpoint: str, bucket: str, key: str, method: str, expires: int,
            content_type: Optional[str]) -> str:
    client = storage.Client(project="p", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint})
    url: str = client.bucket(bucket).blob(key).generate_signed_url(
        version="v4", expiration=expires, method=method, content_type=content_type, credentials=credentials)
    return url


def test_signed_urls_are_byte_identical_to_google_cloud_storages_for_200_random_inputs(monkeypatch) -> None:
    rng = random.Random(33)
    keys = key_corpus(400)
    credentials = _credentials()
    for case in range(200):
        now = rng.randint(1_500_000_000, 2_000_000_000)
        # the reference reads its clock through _signing._NOW: set to ours (its only seam)
        monkeypatch.setattr(_signing, "_NOW", lambda tz=None, at=now: datetime.datetime.fromtimestamp(at, tz))
        endpoint, method, content_type = rng.choice(ENDPOINTS), rng.choice(("GET", "PUT")), rng.choice(TYPES)
        expires, key, bucket = rng.randint(1, 604800), rng.choice(keys), f"b-{rng.randint(0, 999)}"
        theirs = _theirs(credentials, endpoint, bucket, key, method, expires, content_type)
        ours = signed_url(endpoint, bucket, key, method, expires, credentials.signer_email, credentials.sign_bytes,
                          now=now, content_type=content_type)
        assert ours == theirs, (case, endpoint, method, key, content_type)


@pytest.fixture
def keyed(gcs_server, gcs_key, tmp_path) -> Any:
    env = {"HOME": str(tmp_path), "STORAGE_EMULATOR_HOST": gcs_server.endpoint,
           "GOOGLE_APPLICATION_CREDENTIALS": str(gcs_key.path)}
    with Client(env=env) as made:
        yield made


def _fetch(url: str, data: Optional[bytes] = None) -> bytes:
    request = urllib.request.Request(url, data=data, method="PUT" if data is not None else "GET")
    with urllib.request.urlopen(request, timeout=30) as answer:
        body: bytes = answer.read()
        return body


def test_signed_get_and_put_work_without_credentials_on_fake_gcs_server(keyed, gcs_server, gcs_bucket,
                                                                      gcs_key) -> None:
    keyed.write_bytes(f"gs://{gcs_bucket}/in/a b é.txt", b"signed read")
    url = keyed.presign(f"gs://{gcs_bucket}/in/a b é.txt", expires=600)
    assert url.startswith(f"{gcs_server.endpoint}/{gcs_bucket}/in/a%20b%20%C3%A9.txt?X-Goog-Algorithm=")
    assert f"X-Goog-Credential={gcs_key.client_email.replace('@', '%40')}%2F" in url
    assert _fetch(url) == b"signed read"
    _fetch(keyed.presign(f"gs://{gcs_bucket}/out/up.bin", "PUT", expires=600), b"signed write")
    assert keyed.read_bytes(f"gs://{gcs_bucket}/out/up.bin") == b"signed write"


@pytest.mark.parametrize("url,message", [("gs://b", "object URL"), ("gs://b/k", "service-account")])
def test_bad_input_is_one_error_naming_the_url(gcs_server, tmp_path, url, message) -> None:
    env = {"HOME": str(tmp_path), "STORAGE_EMULATOR_HOST": gcs_server.endpoint}  # anonymous: nothing to sign with
    with Client(env=env) as client, pytest.raises(InvalidInput, match=message) as caught:
        client.presign(url, "PUT", 60)
    assert url in str(caught.value)


def test_the_documented_gcs_example_runs(gcs_server, gcs_key, tmp_path) -> None:
    docs = (Path(__file__).parent.parent / "docs" / "library.md").read_text()
    [code] = [block for block in FENCE.findall(docs) if "gs://" in block and "presign" in block]
    documented = '{"GOOGLE_APPLICATION_CREDENTIALS": "/home/me/sa-key.json"}'
    assert documented in code
    code = code.replace("docs-signed", f"d-{uuid.uuid4().hex[:12]}").replace(documented, repr({
        "GOOGLE_APPLICATION_CREDENTIALS": str(gcs_key.path), "STORAGE_EMULATOR_HOST": gcs_server.endpoint,
        "HOME": str(tmp_path)}))
    exec(compile(code, "docs/library.md", "exec"), {})  # noqa: S102 - the documented example, as written
