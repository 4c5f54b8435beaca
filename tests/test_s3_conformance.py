"""Wire-level conformance of our S3 client against the reference implementation, botocore.

Every S3 operation the library uses is sent by our backend to a scripted local server that
records it byte for byte. For each captured request:

(a) botocore's ``S3SigV4Auth``, given exactly that request (its signed headers), must compute
    our signature: same canonical request, same string to sign, same key derivation;
(b) botocore's own client, asked for the same operation with the same inputs, must send the
    same method, path, query parameters and one identical Host (captured at ``before-send``,
    so botocore never touches the network).

The inputs cover 1,400 generated keys (see ``pegasus_cloudio_testbed.keys``), path-style and
virtual-hosted addressing, three regions, and credentials with and without a session token.
"""

from __future__ import annotations

import base64
import hashlib
import io
import itertools
from dataclasses import dataclass
from typing import Callable, List, Optional
from urllib.parse import parse_qsl, quote, urlsplit

import botocore.session
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials as BotoCredentials

from pegasus_cloudio_testbed.keys import key_corpus
from pegasus_cloudio_testbed.scripted import Captured, Reply, ScriptedServer
from transfer.backends.s3 import S3Backend, S3Path, default_endpoint, virtual_hosted
from transfer.config import Settings
from transfer.credentials import Credentials, S3SiteConfig
from transfer.http.connection import FileRegion
from transfer.http.pool import ConnectionPool
from transfer.urls import Url

KEYS = key_corpus(1400)
BODY = b"abc"
MD5 = hashlib.md5(BODY).hexdigest()
REGIONS = ("us-east-1", "us-west-2", "eu-central-1")


@dataclass(frozen=True)
class Case:
    """One configuration: where we send, how we address, whose credentials."""

    region: str
    virtual: bool
    token: Optional[str]

    @property
    def endpoint(self) -> str:
        # An Amazon host name makes both clients choose virtual-hosted addressing ("auto");
        # any other endpoint is path-style for us and, explicitly, for botocore.
        return default_endpoint(self.region, "http") if self.virtual else "http://minio.example:9000"

    @property
    def bucket(self) -> str:
        return f"conf-{self.region}"

    @property
    def credentials(self) -> Credentials:
        return Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", self.token)


CASES = [Case(region, virtual, token) for region, virtual, token in
         itertools.product(REGIONS, (True, False), (None, "FQoGZXIvYXdzEJr//token+with/slash="))]


def _reply(request: Captured) -> Reply:
    """Just enough of S3 for each operation our backend sends."""
    query = dict(parse_qsl(request.query, keep_blank_values=True))
    etag = {"ETag": f'"{MD5}"'}
    if request.method == "HEAD":
        return Reply(200, {**etag, "Content-Length": "3"})
    if request.method == "GET" and "list-type" in query:
        more = "continuation-token" not in query
        token = "<NextContinuationToken>tok/en+1=</NextContinuationToken>" if more else ""
        body = (f"<ListBucketResult><IsTruncated>{str(more).lower()}</IsTruncated>{token}"
                f"<Contents><Key>x</Key><Size>3</Size></Contents></ListBucketResult>")
        return Reply(200, {}, body.encode())
    if request.method == "GET" and request.header("range"):
        return Reply(206, {**etag, "Content-Range": "bytes 0-1/3"}, BODY[:2])
    if request.method == "GET":
        return Reply(200, etag, BODY)
    if request.method == "POST" and "uploads" in query:
        return Reply(200, {}, b"<InitiateMultipartUploadResult><UploadId>up/id+1=</UploadId>"
                              b"</InitiateMultipartUploadResult>")
    if request.method == "POST" and "delete" in query:
        return Reply(200, {}, b"<DeleteResult></DeleteResult>")
    if request.method == "POST":
        return Reply(200, {}, b"<CompleteMultipartUploadResult></CompleteMultipartUploadResult>")
    if request.method == "PUT" and request.header("x-amz-copy-source"):
        return Reply(200, {}, b"<CopyObjectResult></CopyObjectResult>")
    if request.method == "PUT" and request.header("content-md5"):
        return Reply(200, {"ETag": f'"{base64.b64decode(request.header("content-md5") or "").hex()}"'})
    return Reply(204 if request.method == "DELETE" else 200)


@pytest.fixture(scope="module")
def server():
    with ScriptedServer(_reply) as srv:
        yield srv


def _ours(server: ScriptedServer, case: Case) -> S3Backend:
    pool = ConnectionPool(case.endpoint, max_idle=2, connect_to=("127.0.0.1", server.port))
    config = S3SiteConfig(case.endpoint, case.region, case.credentials)
    return S3Backend(pool, config, case.region, Settings())


def _botocore(case: Case):  # type: ignore[no-untyped-def]
    session = botocore.session.Session()
    style = "auto" if case.virtual else "path"
    config = Config(s3={"addressing_style": style}, request_checksum_calculation="when_required",
                    retries={"max_attempts": 1}, signature_version="s3v4")
    # For Amazon, botocore is given no endpoint (it picks its own, as users run it).
    endpoint = None if case.virtual else case.endpoint
    return session.create_client("s3", region_name=case.region, endpoint_url=endpoint, use_ssl=False,
                                 aws_access_key_id=case.credentials.access_key,
                                 aws_secret_access_key=case.credentials.secret_key,
                                 aws_session_token=case.token, config=config)


class _Captured(Exception):
    def __init__(self, request: AWSRequest) -> None:
        super().__init__("captured")
        self.request = request


def _what_botocore_sends(client, call: Callable[[], object]) -> AWSRequest:  # type: ignore[no-untyped-def]
    def stop(request: AWSRequest, **_kw: object) -> None:
        raise _Captured(request)

    client.meta.events.register("before-send.s3", stop)
    try:
        call()
    except _Captured as captured:
        return captured.request
    finally:
        client.meta.events.unregister("before-send.s3", stop)
    raise AssertionError("botocore sent nothing")


# --------------------------------------------------------------------------- checks


def _check_signature(request: Captured, case: Case) -> None:
    """(a) botocore's signer, given our request, reproduces our canonical request and signature."""
    auth_header = request.header("authorization") or ""
    fields = dict(part.strip().split("=", 1) for part in auth_header.split(" ", 1)[1].split(","))
    signed = fields["SignedHeaders"].split(";")
    sent = {name.lower(): value for name, value in request.headers}
    for name in sent:  # S3 refuses unsigned x-amz-* headers; Host must be signed
        assert name == "authorization" or not (name.startswith("x-amz-") or name == "host") or name in signed
    assert sent["x-amz-content-sha256"] in ("UNSIGNED-PAYLOAD", hashlib.sha256(request.body).hexdigest())
    host = sent["host"]
    aws_request = AWSRequest(method=request.method, url=f"http://{host}{request.path}",
                             headers={name: sent[name] for name in signed},
                             params=dict(parse_qsl(request.query, keep_blank_values=True)))
    aws_request.context["timestamp"] = sent["x-amz-date"]
    boto_credentials = BotoCredentials(case.credentials.access_key, case.credentials.secret_key, case.token)
    auth = S3SigV4Auth(boto_credentials, "s3", case.region)
    canonical = auth.canonical_request(aws_request)
    from transfer.backends._sigv4 import SigV4Signer
    our_signed, our_canonical = SigV4Signer.canonical_request(
        request.method, host, request.path, request.query, sent["x-amz-content-sha256"],
        [(n, v) for n, v in request.headers if n.lower() not in ("host", "authorization")])
    assert our_canonical == canonical
    assert our_signed == fields["SignedHeaders"] == auth.signed_headers(auth.headers_to_sign(aws_request))
    signature = auth.signature(auth.string_to_sign(aws_request, canonical), aws_request)
    assert fields["Signature"] == signature
    assert fields["Credential"] == f"{case.credentials.access_key}/{auth.credential_scope(aws_request)}"


def _check_same_as_botocore(ours: Captured, theirs: AWSRequest) -> None:
    """(b) method, path, query parameters and the one Host match botocore's request."""
    parts = urlsplit(theirs.url)
    assert ours.method == theirs.method
    assert ours.path == parts.path
    assert sorted(parse_qsl(ours.query, keep_blank_values=True)) == \
        sorted(parse_qsl(parts.query, keep_blank_values=True))
    assert ours.all("host") == [parts.netloc]
    copy_source = theirs.headers.get("x-amz-copy-source")
    if copy_source is not None:
        expected = copy_source.decode() if isinstance(copy_source, bytes) else copy_source
        assert ours.header("x-amz-copy-source") == expected


def _conforms(server: ScriptedServer, case: Case, client, ours: Callable[[], object],  # type: ignore[no-untyped-def]
              theirs: Callable[[], object], count: int = 1) -> None:
    before = len(server.requests)
    ours()
    captured = server.requests[before:]
    assert len(captured) >= count
    for request in captured:
        _check_signature(request, case)
    _check_same_as_botocore(captured[0], _what_botocore_sends(client, theirs))


# --------------------------------------------------------------------------- the operations


def _case_for(index: int) -> Case:
    return CASES[index % len(CASES)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.region}-{'virtual' if c.virtual else 'path'}"
                         f"-{'token' if c.token else 'keys'}")
def test_get_head_and_ranged_get_of_every_key(server, case):
    """GET, HEAD and ranged GET of the whole key corpus, spread over the configurations."""
    ours, client = _ours(server, case), _botocore(case)
    index = CASES.index(case)
    for key in KEYS[index::len(CASES)]:
        url = Url("s3", case.bucket, "/" + key)
        _conforms(server, case, client, lambda: ours.get(url, io.BytesIO()),
                  lambda: client.get_object(Bucket=case.bucket, Key=key))
        _conforms(server, case, client, lambda: ours.stat(url),
                  lambda: client.head_object(Bucket=case.bucket, Key=key))
        _conforms(server, case, client, lambda: ours.get(url, io.BytesIO(), byte_range=(0, 2)),
                  lambda: client.get_object(Bucket=case.bucket, Key=key, Range="bytes=0-1"))


@pytest.mark.parametrize("index", range(len(CASES)))
def test_put_copy_and_multipart(server, tmp_path, index):
    case = _case_for(index)
    ours, client = _ours(server, case), _botocore(case)
    source = tmp_path / "body"
    source.write_bytes(BODY)
    for key in KEYS[index::len(CASES) * 4]:
        url = Url("s3", case.bucket, "/" + key)
        _conforms(server, case, client, lambda: ours.put(str(source), url),
                  lambda: client.put_object(Bucket=case.bucket, Key=key, Body=BODY))
        other = Url("s3", case.bucket, "/copy/" + key)
        _conforms(server, case, client, lambda: ours.copy(url, other),
                  lambda: client.copy_object(Bucket=case.bucket, Key="copy/" + key,
                                             CopySource={"Bucket": case.bucket, "Key": key}))
        _conforms(server, case, client, lambda: ours.start_upload(url),
                  lambda: client.create_multipart_upload(Bucket=case.bucket, Key=key, ChecksumAlgorithm="CRC32",
                                                         ChecksumType="FULL_OBJECT"))
        region = FileRegion(str(source), 0, len(BODY))
        _conforms(server, case, client, lambda: ours.upload_part(url, "up/id+1=", 2, region),
                  lambda: client.upload_part(Bucket=case.bucket, Key=key, UploadId="up/id+1=",
                                             PartNumber=2, Body=BODY, ChecksumAlgorithm="CRC32"))
        _conforms(server, case, client, lambda: ours.complete_upload(url, "up/id+1=", ['"e1"', '"e2"']),
                  lambda: client.complete_multipart_upload(
                      Bucket=case.bucket, Key=key, UploadId="up/id+1=",
                      MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"e1"'},
                                                 {"PartNumber": 2, "ETag": '"e2"'}]}))
        _conforms(server, case, client, lambda: ours.abort_upload(url, "up/id+1="),
                  lambda: client.abort_multipart_upload(Bucket=case.bucket, Key=key, UploadId="up/id+1="))


@pytest.mark.parametrize("index", range(len(CASES)))
def test_list_with_prefix_and_continuation(server, index):
    case = _case_for(index)
    ours, client = _ours(server, case), _botocore(case)
    for key in KEYS[index::len(CASES) * 8]:
        prefix = key.rstrip("/") + "/"
        url = Url("s3", case.bucket, "/" + key)
        before = len(server.requests)
        assert len(list(ours.list(url))) == 2  # two pages: the second asked with the token
        first, second = server.requests[before:before + 2]
        for request in (first, second):
            _check_signature(request, case)
        _check_same_as_botocore(first, _what_botocore_sends(
            client, lambda: client.list_objects_v2(Bucket=case.bucket, Prefix=prefix)))
        _check_same_as_botocore(second, _what_botocore_sends(
            client, lambda: client.list_objects_v2(Bucket=case.bucket, Prefix=prefix,
                                                   ContinuationToken="tok/en+1=")))


@pytest.mark.parametrize("index", range(len(CASES)))
def test_batch_delete_create_bucket_and_list_buckets(server, index):
    case = _case_for(index)
    ours, client = _ours(server, case), _botocore(case)
    keys = KEYS[index::len(CASES)][:50]
    before = len(server.requests)
    assert ours.delete([Url("s3", case.bucket, "/" + k) for k in keys]) == [None] * len(keys)
    request = server.requests[before]
    _check_signature(request, case)
    _check_same_as_botocore(request, _what_botocore_sends(client, lambda: client.delete_objects(
        Bucket=case.bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})))
    assert request.body.count(b"<Key>") == len(keys)

    server.handler = lambda req: Reply(404) if req.method == "HEAD" else _reply(req)
    try:
        before = len(server.requests)
        ours.make_dirs(Url("s3", case.bucket, "/"))
    finally:
        server.handler = _reply
    head, create = server.requests[before:before + 2]
    for request in (head, create):
        _check_signature(request, case)
    _check_same_as_botocore(head, _what_botocore_sends(client, lambda: client.head_bucket(Bucket=case.bucket)))
    location = {} if case.region == "us-east-1" else {
        "CreateBucketConfiguration": {"LocationConstraint": case.region}}
    _check_same_as_botocore(create, _what_botocore_sends(
        client, lambda: client.create_bucket(Bucket=case.bucket, **location)))
    assert (case.region in create.body.decode()) == (case.region != "us-east-1")

    server.handler = lambda req: Reply(200, {}, b"<ListAllMyBucketsResult><Buckets><Bucket><Name>b1</Name>"
                                               b"</Bucket></Buckets></ListAllMyBucketsResult>")
    try:
        before = len(server.requests)
        assert ours.list_buckets() == ["b1"]
    finally:
        server.handler = _reply
    _check_signature(server.requests[before], case)


@pytest.mark.parametrize("bucket,virtual", [
    ("plain-name", True),
    ("dotted.name", False),   # *.s3.REGION.amazonaws.com would not cover it
    ("Legacy_Name", False),
])
@pytest.mark.parametrize("use_ssl", [True, False])
def test_addressing_style_matches_botocore_auto(bucket, virtual, use_ssl):
    assert virtual_hosted("s3.us-west-2.amazonaws.com", bucket) is virtual
    assert virtual_hosted("minio.example", bucket) is False
    client = botocore.session.Session().create_client(
        "s3", region_name="us-west-2", use_ssl=use_ssl, aws_access_key_id="a", aws_secret_access_key="b",
        config=Config(s3={"addressing_style": "auto"}, request_checksum_calculation="when_required"))
    sent = _what_botocore_sends(client, lambda: client.head_object(Bucket=bucket, Key="k"))
    assert urlsplit(sent.url).netloc.startswith(bucket) is virtual


def test_dotted_bucket_stays_path_style_over_https(tmp_path):
    """Through the backend: the request goes to the endpoint's own host, bucket in the path."""
    pool = ConnectionPool("https://s3.us-west-2.amazonaws.com", max_idle=1)
    backend = S3Backend(pool, S3SiteConfig(None, "us-west-2", None), "us-west-2", Settings())
    assert backend._target(S3Path("dotted.name", "k")) == ("s3.us-west-2.amazonaws.com", "/dotted.name/k")
    assert backend._target(S3Path("plain", "k")) == ("plain.s3.us-west-2.amazonaws.com", "/k")


def test_the_corpus_has_what_the_issue_asks_for():
    assert len(KEYS) >= 1000 and len(set(KEYS)) == len(KEYS)
    joined = "".join(KEYS)
    for needle in (" ", "+", "~", "%", "=", "&", "?", "#", "//", "🚀", "日"):
        assert needle in joined
    assert any(k.endswith("/") for k in KEYS)
    assert sum(len(k.encode()) == 1024 for k in KEYS) >= 4
    assert quote("🚀") in "".join(quote(k) for k in KEYS)
