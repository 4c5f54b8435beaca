"""Amazon's behaviours that a client must act on, played by a scripted local server: wrong
region, 307, clock skew, SlowDown/500 backoff, x-amz-checksum-* verification. Every Amazon
host name is dialled at 127.0.0.1 (``connect_to``); the Host header is what Amazon would see."""

import base64
import calendar
import hashlib
import io
import time
import zlib

import pytest

from pegasus_cloudio_testbed.scripted import Reply, ScriptedServer
from transfer import Session, Settings, parse_url
from transfer.backends._s3_checksum import _crt
from transfer.backends.s3 import S3Backend
from transfer.credentials import Credentials, S3SiteConfig
from transfer.engine import Engine
from transfer.errors import ChecksumMismatch, RemoteError
from transfer.http.pool import ConnectionPool
from transfer.ops import Transfer
from transfer.retry import RetryPolicy
from transfer.urls import Url

BODY = b"hello amazon"
MD5 = hashlib.md5(BODY).hexdigest()


def _region(request):
    return (request.header("authorization") or "").split("/")[2]


def _backend(server, endpoint="http://s3.amazonaws.com", region="us-east-1"):
    def pool_for(base):
        return ConnectionPool(base, max_idle=2, connect_to=("127.0.0.1", server.port))
    config = S3SiteConfig(None if "amazonaws" in endpoint else endpoint, region, Credentials("AK", "SK"))
    return S3Backend(pool_for(endpoint), config, region, Settings(), pool_for=pool_for)


def _get(backend, url):
    sink = io.BytesIO()
    backend.get(url, sink)
    return sink.getvalue()


def _ok(request):
    return Reply(200, {"ETag": f'"{MD5}"'}, BODY)


def _xml_error(status, code, **fields):
    inner = "".join(f"<{k}>{v}</{k}>" for k, v in fields.items())
    return Reply(status, {"Content-Type": "application/xml"},
                 f"<Error><Code>{code}</Code><Message>m</Message>{inner}</Error>".encode())


def test_permanent_redirect_is_followed_once_then_remembered():
    def handler(request):
        if _region(request) != "eu-west-1":
            return Reply(301, {"x-amz-bucket-region": "eu-west-1"},
                         b"<Error><Code>PermanentRedirect</Code></Error>")
        return _ok(request)

    with ScriptedServer(handler) as server:
        backend = _backend(server)
        url = Url("s3", "eu-bucket", "/k")
        assert _get(backend, url) == BODY
        assert _get(backend, url) == BODY
        hosts = [r.header("host") for r in server.requests]
    assert hosts == ["eu-bucket.s3.amazonaws.com", "eu-bucket.s3.eu-west-1.amazonaws.com",
                     "eu-bucket.s3.eu-west-1.amazonaws.com"]  # the second GET went straight there


def test_authorization_header_malformed_names_the_region_in_the_body_on_a_custom_endpoint():
    def handler(request):
        if _region(request) != "ap-south-1":
            return _xml_error(400, "AuthorizationHeaderMalformed", Region="ap-south-1")
        return _ok(request)

    with ScriptedServer(handler) as server:
        backend = _backend(server, endpoint=f"http://127.0.0.1:{server.port}", region="us-east-1")
        assert _get(backend, Url("s3", "b-1", "/k")) == BODY
        assert [_region(r) for r in server.requests] == ["us-east-1", "ap-south-1"]
        assert {r.header("host") for r in server.requests} == {f"127.0.0.1:{server.port}"}


def test_head_gets_a_bare_400_with_the_region_header():
    def handler(request):
        if _region(request) != "us-west-2":
            return Reply(400, {"x-amz-bucket-region": "us-west-2"})
        return Reply(200, {"ETag": '"e"', "Content-Length": "3"})

    with ScriptedServer(handler) as server:
        info = _backend(server).stat(Url("s3", "west", "/k"))
    assert info.size == 3


def test_a_region_that_keeps_failing_is_an_error_after_one_retry():
    with ScriptedServer(lambda r: _xml_error(301, "PermanentRedirect", Region="eu-west-1")) as server:
        with pytest.raises(RemoteError) as info:
            _get(_backend(server), Url("s3", "lost", "/k"))
        assert len(server.requests) == 2
    message = str(info.value)
    assert "PermanentRedirect" in message and "s3://lost/k" in message and "\n" not in message


def test_temporary_redirect_goes_to_location_once():
    def handler(request):
        if request.header("host") == "tmp.s3.amazonaws.com":
            return Reply(307, {"Location": "http://tmp.s3-external-2.amazonaws.com/k"})
        return _ok(request)

    with ScriptedServer(handler) as server:
        assert _get(_backend(server), Url("s3", "tmp", "/k")) == BODY
        assert [r.header("host") for r in server.requests] == ["tmp.s3.amazonaws.com",
                                                                "tmp.s3-external-2.amazonaws.com"]


def test_temporary_redirect_naming_a_region_goes_to_that_regions_endpoint():
    """botocore's way: a 307 with ``x-amz-bucket-region`` is re-routed by region, not by Location."""
    def handler(request):
        if _region(request) != "us-west-2":
            return Reply(307, {"x-amz-bucket-region": "us-west-2",
                               "Location": "http://tmp.s3-us-west-2.amazonaws.com.attacker.example/k"})
        return _ok(request)

    with ScriptedServer(handler) as server:
        assert _get(_backend(server), Url("s3", "tmp", "/k")) == BODY
        assert [r.header("host") for r in server.requests] == ["tmp.s3.amazonaws.com",
                                                                "tmp.s3.us-west-2.amazonaws.com"]


@pytest.mark.parametrize("location", [
    "http://tmp.s3.amazonaws.com.attacker.example/k",  # not Amazon's domain
    "http://attacker.example/k",
    "http://tmp.s3.amazonaws.com:8080/k",  # another port
    "http://other.s3.amazonaws.com/k",  # another bucket's host
    "http://s3.amazonaws.com/other/k",  # another bucket's path
    "https://tmp.s3.amazonaws.com/k",  # another scheme
])
def test_temporary_redirect_elsewhere_is_refused_and_nothing_is_sent(location):
    with ScriptedServer(lambda r: Reply(307, {"Location": location})) as server:
        with pytest.raises(RemoteError) as info:
            _get(_backend(server), Url("s3", "tmp", "/k"))
        assert len(server.requests) == 1
    assert "307 redirect to" in str(info.value) and "not followed" in str(info.value)


def test_a_custom_endpoint_follows_a_307_only_on_its_own_origin():
    def handler(request):
        if not request.query:
            return Reply(307, {"Location": f"http://127.0.0.1:{server.port}/b-1/k?moved=1"})
        return _ok(request)

    with ScriptedServer(handler) as server:
        backend = _backend(server, endpoint=f"http://127.0.0.1:{server.port}")
        assert _get(backend, Url("s3", "b-1", "/k")) == BODY
        assert [r.target for r in server.requests] == ["/b-1/k", "/b-1/k?moved=1"]
        assert all(r.header("authorization") for r in server.requests)


def test_request_time_too_skewed_corrects_the_clock_and_retries_once():
    server_clock = time.time() + 3600  # the server is an hour ahead of us

    def handler(request):
        sent = calendar.timegm(time.strptime(request.header("x-amz-date"), "%Y%m%dT%H%M%SZ"))
        if abs(sent - server_clock) > 900:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(server_clock))
            return _xml_error(403, "RequestTimeTooSkewed", ServerTime=stamp)
        return _ok(request)

    with ScriptedServer(handler) as server:
        backend = _backend(server)
        assert _get(backend, Url("s3", "skew", "/a")) == BODY
        assert _get(backend, Url("s3", "skew", "/b")) == BODY
        assert len(server.requests) == 3  # one refusal, then the corrected clock for both


@pytest.mark.parametrize("status,code", [(503, "SlowDown"), (500, "InternalError")])
def test_slowdown_and_500_are_retried_with_backoff_by_the_engine(tmp_path, status, code):
    answers = iter([_xml_error(status, code), _xml_error(status, code)])

    def handler(request):
        return next(answers, None) or _ok(request)

    with ScriptedServer(handler) as server:
        creds = tmp_path / "c.conf"
        creds.write_text(f"[fake]\nendpoint = {server.endpoint}\n[u@fake]\naccess_key = a\nsecret_key = b\n")
        creds.chmod(0o600)
        sleeps = []
        env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path)}
        with Session(Settings(), env) as session:  # a node rate file of its own: no prefix paced before
            engine = Engine(session, retry=RetryPolicy(max_attempts=3, base_delay=1.0), sleep=sleeps.append)
            [result] = engine.run([Transfer((parse_url("s3://u@fake/bkt/k"),), parse_url(str(tmp_path / "out")))])
    assert result.ok and (tmp_path / "out").read_bytes() == BODY
    assert result.attempts == 3
    if code == "SlowDown":
        # the ordinary backoff before each retry, then the wait of the prefix's pace, which the
        # throttle answer cut (docs/throttling.md): the pace, not a longer backoff, slows the job
        assert len(sleeps) == 4, sleeps
        assert sleeps[0] <= 1.0 and sleeps[2] <= 2.0 and sleeps[1] > 0 and sleeps[3] > 0, sleeps
    else:
        assert len(sleeps) == 2 and sleeps[0] <= 1.0 and sleeps[1] <= 2.0, sleeps


def _b64(value: int, width: int) -> str:
    return base64.b64encode(value.to_bytes(width, "big")).decode()


CHECKSUMS = {
    "crc32": _b64(zlib.crc32(BODY), 4),
    "sha256": base64.b64encode(hashlib.sha256(BODY).digest()).decode(),
    "sha1": base64.b64encode(hashlib.sha1(BODY).digest()).decode(),
}
if _crt("crc64nvme") is not None:
    from awscrt import checksums

    CHECKSUMS["crc64nvme"] = _b64(checksums.crc64nvme(BODY), 8)
    CHECKSUMS["crc32c"] = _b64(checksums.crc32c(BODY), 4)


def test_awscrt_is_installed_in_the_test_environment():
    """The [aws] extra's C checksums are part of what is tested, not skipped."""
    assert {"crc64nvme", "crc32c"} <= set(CHECKSUMS)


@pytest.mark.parametrize("name", sorted(CHECKSUMS))
def test_checksum_headers_are_verified(name):
    good = {f"x-amz-checksum-{name}": CHECKSUMS[name], "ETag": '"0123456789abcdef0123456789abcdef-2"'}

    def handler(request):
        assert request.header("x-amz-checksum-mode") == "ENABLED"
        body = BODY if request.path.endswith("/good") else BODY[:-1] + b"X"
        return Reply(200, good, body)

    with ScriptedServer(handler) as server:
        backend = _backend(server)
        assert _get(backend, Url("s3", "sums", "/good")) == BODY
        with pytest.raises(ChecksumMismatch) as info:
            _get(backend, Url("s3", "sums", "/bad"))
    assert name.upper() in str(info.value) and "s3://sums/bad" in str(info.value)


def test_composite_checksums_are_not_mistaken_for_the_objects():
    headers = {"x-amz-checksum-crc32": "AAAAAA==-3", "ETag": '"abc-3"'}
    with ScriptedServer(lambda r: Reply(200, headers, BODY)) as server:
        assert _get(_backend(server), Url("s3", "comp", "/k")) == BODY


def test_multipart_parts_are_checked_by_crc32_and_the_assembled_object_by_etag(tmp_path):
    """Parts carry x-amz-checksum-crc32 (declared at CreateMultipartUpload); a store that
    echoes another CRC32 fails the part; Complete lists each part's CRC32; the assembled
    object's ETag must combine the parts' ETags."""
    part = tmp_path / "part"
    part.write_bytes(b"p" * 100)
    part_md5 = hashlib.md5(b"p" * 100).hexdigest()
    crc = base64.b64encode(zlib.crc32(b"p" * 100).to_bytes(4, "big")).decode()
    assembled = [f"{hashlib.md5(bytes.fromhex(part_md5) * 2).hexdigest()}-2"]

    def handler(request):
        if request.method == "PUT":
            sent = request.header("x-amz-checksum-crc32") or ""
            echoed = sent if "partNumber=1" in request.query else "AAAAAA=="
            return Reply(200, {"ETag": f'"{part_md5}"', "x-amz-checksum-crc32": echoed})
        if request.method == "POST" and "uploads" in request.query:
            return Reply(200, {}, b"<InitiateMultipartUploadResult><UploadId>id</UploadId>"
                                  b"</InitiateMultipartUploadResult>")
        if request.method == "POST":
            return Reply(200, {}, b"<CompleteMultipartUploadResult/>")
        return Reply(200, {"ETag": f'"{assembled[0]}"', "Content-Length": "200"})

    from transfer.http.connection import FileRegion
    with ScriptedServer(handler) as server:
        backend, url = _backend(server), Url("s3", "multi", "/k")
        assert backend.start_upload(url) == "id"
        assert server.requests[-1].header("x-amz-checksum-algorithm") == "CRC32"
        region = FileRegion(str(part), 0, 100)
        receipt = backend.upload_part(url, "id", 1, region)
        assert receipt == f'"{part_md5}"\n{crc}\n100' and server.requests[-1].header("content-md5") is None
        with pytest.raises(ChecksumMismatch, match="part 2"):
            backend.upload_part(url, "id", 2, region)  # the store reports another CRC32
        assert backend.complete_upload(url, "id", [receipt, receipt]).size == 200
        complete = next(r for r in reversed(server.requests) if r.method == "POST")
        assert complete.body.count(f"<ChecksumCRC32>{crc}</ChecksumCRC32>".encode()) == 2
        assert complete.header("x-amz-checksum-crc32") is None  # the store did not take FULL_OBJECT
        assembled[0] = "f" * 32 + "-2"
        with pytest.raises(ChecksumMismatch, match="assembled"):
            backend.complete_upload(url, "id", [receipt, receipt])


def test_a_full_object_upload_sends_the_whole_crc32_and_checks_the_one_stored(tmp_path):
    """A store that takes FULL_OBJECT (echoed at CreateMultipartUpload) gets the whole
    object's CRC32, combined from the parts', at CompleteMultipartUpload; a HEAD giving another
    full-object CRC32 fails the upload."""
    data = b"q" * 70 + b"r" * 30
    crc = base64.b64encode(zlib.crc32(data[:70]).to_bytes(4, "big")).decode()
    whole = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    stored = [whole]

    def handler(request):
        if request.method == "POST" and "uploads" in request.query:
            assert request.header("x-amz-checksum-type") == "FULL_OBJECT"
            return Reply(200, {"x-amz-checksum-type": "FULL_OBJECT"},
                         b"<InitiateMultipartUploadResult><UploadId>id</UploadId></InitiateMultipartUploadResult>")
        if request.method == "POST":
            return Reply(200, {}, b"<CompleteMultipartUploadResult/>")
        if request.method == "PUT":
            return Reply(200, {"ETag": '"p"'})
        return Reply(200, {"ETag": '"x-2"', "Content-Length": "100", "x-amz-checksum-crc32": stored[0],
                           "x-amz-checksum-type": "FULL_OBJECT"})

    with ScriptedServer(handler) as server:
        backend, url = _backend(server), Url("s3", "multi", "/k")
        for lie in (False, True):
            upload_id = backend.start_upload(url)
            receipts = [backend.upload_part(url, upload_id, n, part) for n, part in ((1, data[:70]), (2, data[70:]))]
            assert receipts[0] == f'"p"\n{crc}\n70'
            stored[0] = "AAAAAA==" if lie else whole
            if lie:
                with pytest.raises(ChecksumMismatch, match="CRC32 of the assembled object"):
                    backend.complete_upload(url, upload_id, receipts)
            else:
                assert backend.complete_upload(url, upload_id, receipts).size == 100
            complete = next(r for r in reversed(server.requests) if r.method == "POST")
            assert complete.header("x-amz-checksum-crc32") == whole
            assert complete.header("x-amz-checksum-type") == "FULL_OBJECT"
