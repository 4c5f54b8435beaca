"""Presigned URLs (issue 33): our SigV4 query signing against botocore's
``generate_presigned_url``, the reference, for 200 random inputs (key from the awkward-key
corpus, region, addressing, method, expiry, session token): the same host, path and query, so
byte-identical signatures. No request is sent for either. Then the URLs on a real MinIO: GET and
PUT work with no keys, a tampered or expired one is refused, and bad input names the URL."""

from __future__ import annotations

import calendar
import functools
import random
import time
import urllib.error
import urllib.request
import uuid
from typing import Any, Dict, Optional, Tuple
from urllib.parse import parse_qsl, urlsplit

import botocore.session
import pytest
from botocore.config import Config

from pegasus_cloudio_testbed.keys import key_corpus
from transfer.backends.s3 import S3Backend, default_endpoint
from transfer.client import Client
from transfer.config import Settings
from transfer.credentials import Credentials, S3SiteConfig
from transfer.errors import InvalidInput
from transfer.http.pool import ConnectionPool
from transfer.urls import parse_url

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
TOKEN = "FQoGZXIvYXdzEJr//token+with/slash="
REGIONS = ("us-east-1", "us-west-2", "eu-central-1", "ap-southeast-2")


def _ours(endpoint: str, region: str, token: Optional[str]) -> S3Backend:
    config = S3SiteConfig(endpoint, region, Credentials("AKIDEXAMPLE", SECRET, token))
    return S3Backend(ConnectionPool(endpoint, max_idle=1), config, region, Settings())


@functools.lru_cache(maxsize=None)  # one per configuration: making a botocore client costs ~0.5 s
def _botocore(endpoint: Optional[str], region: str, virtual: bool, token: Optional[str]) -> Any:
    session = botocore.session.Session()
    session.set_credentials("AKIDEXAMPLE", SECRET, token)
    return session.create_client("s3", region_name=region, endpoint_url=endpoint, config=Config(
        signature_version="s3v4", s3={"addressing_style": "virtual" if virtual else "path"}))


def _botocore_url(endpoint: Optional[str], region: str, virtual: bool, token: Optional[str], method: str,
                  bucket: str, key: str, expires: int) -> str:
    client = _botocore(endpoint, region, virtual, token)
    operation = "get_object" if method == "GET" else "put_object"
    url: str = client.generate_presigned_url(operation, Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires)
    return url


def _parts(url: str) -> Tuple[str, str, str, Dict[str, str]]:
    split = urlsplit(url)
    return split.scheme, split.netloc, split.path, dict(parse_qsl(split.query, keep_blank_values=True))


def _signed_at(ours: S3Backend, when: str) -> None:
    """Our router's clock set to botocore's X-Amz-Date (its own clock is not ours to set)."""
    ours._router.clock.offset = calendar.timegm(time.strptime(when, "%Y%m%dT%H%M%SZ")) - time.time()


def test_presigned_urls_are_byte_identical_to_botocores_for_200_random_inputs() -> None:
    rng = random.Random(33)
    keys = key_corpus(400)
    for case in range(200):
        region, virtual, token = rng.choice(REGIONS), rng.random() < 0.5, rng.choice((None, TOKEN))
        method, expires, key = rng.choice(("GET", "PUT")), rng.randint(1, 604800), rng.choice(keys)
        bucket = f"conf-{region}"
        # Amazon's host: both choose virtual-hosted addressing; any other: path-style for both
        endpoint = default_endpoint(region, "https") if virtual else "http://minio.example:9000"
        theirs = _botocore_url(None if virtual else endpoint, region, virtual, token, method, bucket, key, expires)
        ours_backend = _ours(endpoint, region, token)
        _signed_at(ours_backend, _parts(theirs)[3]["X-Amz-Date"])
        ours = ours_backend.presign(parse_url(f"s3://{bucket}/{key}", trailing_blanks=True), method, expires)
        assert _parts(ours) == _parts(theirs), (case, region, virtual, method, key, ours, theirs)
        assert _parts(ours)[3]["X-Amz-Signature"] == _parts(theirs)[3]["X-Amz-Signature"]
        ours_backend.close()


@pytest.fixture
def client(minio):
    with Client(endpoint_url=minio.endpoint, key=minio.access_key, secret=minio.secret_key, env={}) as made:
        yield made


def _fetch(url: str, data: Optional[bytes] = None) -> Tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, method="PUT" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_presigned_get_and_put_work_without_keys_and_tampering_or_expiry_is_refused(client) -> None:
    where = f"s3://p-{uuid.uuid4().hex[:12]}"
    client.mkdir(where)
    client.write_bytes(f"{where}/in/a b.txt", b"signed read")
    assert _fetch(client.presign(f"{where}/in/a b.txt")) == (200, b"signed read")
    put = client.presign(f"{where}/out/up.txt", "PUT", expires=60)
    assert _fetch(put, b"signed write")[0] == 200
    assert client.read_bytes(f"{where}/out/up.txt") == b"signed write"
    tampered = client.presign(f"{where}/in/a b.txt").replace("/in/a%20b.txt", "/out/up.txt")
    assert _fetch(tampered)[0] == 403
    short = client.presign(f"{where}/in/a b.txt", expires=1)
    signed = calendar.timegm(time.strptime(_parts(short)[3]["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
    while time.time() < signed + 2.5:  # the clock past its expiry (whole seconds)
        time.sleep(0.1)
    assert _fetch(short)[0] == 403


@pytest.mark.parametrize("args,message", [
    (("s3://b/k", "DELETE", 60), "GET or PUT"), (("s3://b/k", "GET", 0), "604800"),
    (("s3://b/k", "GET", 604801), "604800"), (("s3://b", "GET", 60), "object URL"),
    (("/tmp/local", "GET", 60), "object URL")])
def test_bad_presign_input_is_one_error_naming_the_url(client, args, message) -> None:
    with pytest.raises(InvalidInput, match=message) as caught:
        client.presign(*args)
    assert args[0] in str(caught.value)


def test_fsspec_sign_gives_a_url_that_reads_without_keys(minio) -> None:
    from transfer.fsspec_fs import CloudioFileSystem

    fs = CloudioFileSystem(skip_instance_cache=True, endpoint_url=minio.endpoint, key=minio.access_key,
                           secret=minio.secret_key, env={})
    bucket = f"ps-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    fs.pipe_file(f"{bucket}/k", b"through fsspec")
    assert _fetch(fs.sign(f"{bucket}/k", expiration=60)) == (200, b"through fsspec")
    assert _fetch(fs.sign(f"{bucket}/new", expiration=60, method="PUT"), b"put")[0] == 200
    assert fs.cat_file(f"{bucket}/new") == b"put"
    fs.client.close()
