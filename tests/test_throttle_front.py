"""The rate-limiting front (bench/pegasus_cloudio_testbed/throttle.py) against real MinIO and fake-gcs-server.

Token buckets run on a clock the tests advance by hand, so which request is throttled is
exact, never a matter of timing.
"""

from __future__ import annotations

import json
import socket
import uuid
from typing import Dict, List, Tuple

import boto3
import botocore.config
import pytest
from botocore.exceptions import ClientError

from pegasus_cloudio_testbed.fakegcs import FakeGcsServer
from pegasus_cloudio_testbed.httpframe import RequestHead
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import TcpProxy
from pegasus_cloudio_testbed.throttle import ThrottleFront
from pegasus_cloudio_testbed.throttle_policy import PrefixLimiter, TokenBucket, prefix_of, throttle_answer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

# --------------------------------------------------------------------------- arithmetic


def test_bucket_starts_full_refills_at_rate_and_caps_at_burst() -> None:
    bucket = TokenBucket(rate=10, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(0.05) is False          # half a token
    assert bucket.take(0.1) is True            # a whole one
    assert bucket.take(0.1) is False
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]  # capped at burst


def test_refused_requests_spend_nothing_and_time_never_runs_back() -> None:
    bucket = TokenBucket(rate=1, burst=1, now=5.0)
    assert bucket.take(5.0) and not bucket.take(5.5) and not bucket.take(5.9)
    assert bucket.take(6.0)
    assert not bucket.take(4.0)                # an earlier stamp adds no tokens


def test_throttled_answers_are_counted_per_second_from_the_first_request() -> None:
    clock = Clock()
    limiter = PrefixLimiter(rate=1, burst=1, clock=clock)
    assert limiter.admit("b/a/")                                  # t = 0: the timeline's zero, passed
    assert not limiter.admit("b/a/") and limiter.admit("b/c/")   # one refused; a new prefix has its own bucket
    clock.now += 2.5
    assert limiter.admit("b/a/") and not limiter.admit("b/a/")    # t = 2.5: one refused
    stats = limiter.stats()
    assert stats["throttled_by_second"] == [1, 0, 1] and stats["throttled"] == 2
    limiter.reset()
    clock.now += 10
    assert limiter.admit("b/c/") and not limiter.admit("b/c/")    # the timeline starts again at the reset
    assert limiter.stats()["throttled_by_second"] == [1]


@pytest.mark.parametrize("rate,burst", [(0, 1), (-1, 5), (10, 0.5)])
def test_bucket_refuses_meaningless_settings(rate: float, burst: float) -> None:
    with pytest.raises(ValueError, match="rate > 0 and burst >= 1"):
        TokenBucket(rate, burst, 0.0)


@pytest.mark.parametrize("target,depth,prefix", [
    ("/b/run1/f0001", 1, "b/run1/"),
    ("/b/run1/sub/f0001", 2, "b/run1/sub/"),
    ("/b/run1/sub/f0001", 0, "b/"),
    ("/b/f0001", 1, "b/"),
    ("/b?list-type=2&prefix=run1%2F", 1, "b/run1/"),
    ("/b?list-type=2&prefix=ru", 1, "b/"),
    ("/b/run%201/f?x-id=GetObject", 1, "b/run 1/"),
    ("http://127.0.0.1:9/b/run1/f", 1, "b/run1/"),
    ("/storage/v1/b/g/o/run1%2Ff0001", 1, "g/run1/"),
    ("/download/storage/v1/b/g/o/run1%2Ff0001?alt=media", 1, "g/run1/"),
    ("/upload/storage/v1/b/g/o?uploadType=media&name=run1/f", 1, "g/run1/"),
    ("/storage/v1/b/g/o?prefix=run1/", 1, "g/run1/"),
    ("/storage/v1/b/g", 1, "g/"),
    ("/", 1, "/"),
    ("/batch/storage/v1", 1, "/"),
])
def test_prefix_of_names_bucket_and_whole_directories(target: str, depth: int, prefix: str) -> None:
    assert prefix_of(target, depth) == prefix


def _head(method: str = "GET", expect: bool = False) -> RequestHead:
    return RequestHead(method, "/b/k", 0, False, expect)


def test_answers_are_shaped_like_each_store() -> None:
    s3 = throttle_answer("s3", 503, None, _head(), close=False)
    assert s3.startswith(b"HTTP/1.1 503 ") and b"<Code>SlowDown</Code>" in s3
    assert b"Retry-After" not in s3 and b"Connection: close" not in s3
    gcs = throttle_answer("gcs", 429, 2, _head(), close=True)
    head, _, body = gcs.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429 ") and b"\r\nRetry-After: 2" in head and b"Connection: close" in head
    assert json.loads(body)["error"]["errors"][0]["reason"] == "rateLimitExceeded"
    assert throttle_answer("s3", 503, None, _head("HEAD"), False).endswith(b"\r\n\r\n")  # no body


def test_front_refuses_unknown_shape() -> None:
    with pytest.raises(ValueError, match="shape must be one of s3, gcs, azure"):
        ThrottleFront("127.0.0.1", 9, rate=1, shape="swift")

# --------------------------------------------------------------------------- MinIO through the front


def _s3(minio: MinioServer, endpoint: str):  # type: ignore[no-untyped-def]
    config = botocore.config.Config(retries={"total_max_attempts": 1, "mode": "standard"})
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=minio.access_key,
                        aws_secret_access_key=minio.secret_key, region_name="us-east-1", config=config)


@pytest.fixture
def filled(minio: MinioServer) -> Tuple[str, Dict[str, bytes]]:
    """A bucket with one object in each of the prefixes a/ and b/."""
    name = f"t-{uuid.uuid4().hex[:16]}"
    client = _s3(minio, minio.endpoint)
    client.create_bucket(Bucket=name)
    objects = {"a/x": b"object x " * 100, "b/y": b"object y"}
    for key, data in objects.items():
        client.put_object(Bucket=name, Key=key, Body=data)
    return name, objects


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_sigv4_clients_pass_within_the_rate_and_get_slowdown_beyond(
        minio: MinioServer, filled: Tuple[str, Dict[str, bytes]], clock: Clock) -> None:
    bucket, objects = filled
    with ThrottleFront(minio.host, minio.port, rate=1, burst=2, clock=clock) as front:
        client = _s3(minio, front.endpoint)
        assert [client.get_object(Bucket=bucket, Key="a/x")["Body"].read() for _ in range(2)] \
            == [objects["a/x"]] * 2
        with pytest.raises(ClientError) as refused:
            client.get_object(Bucket=bucket, Key="a/x")
        assert refused.value.response["Error"]["Code"] == "SlowDown"
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        assert client.get_object(Bucket=bucket, Key="b/y")["Body"].read() == objects["b/y"]  # own prefix
        clock.now += 1.0                                  # one token back: recovering
        assert client.head_object(Bucket=bucket, Key="a/x")["ContentLength"] == len(objects["a/x"])
        stats = front.stats()
    assert stats["requests"] == 5 and stats["throttled"] == 1, stats
    assert stats["prefixes"] == {f"{bucket}/a/": {"requests": 4, "throttled": 1},
                                 f"{bucket}/b/": {"requests": 1, "throttled": 0}}


def test_retry_after_is_sent_when_asked(minio: MinioServer, filled: Tuple[str, Dict[str, bytes]],
                                        clock: Clock) -> None:
    bucket, _ = filled
    with ThrottleFront(minio.host, minio.port, rate=1, burst=1, retry_after=3, clock=clock) as front:
        client = _s3(minio, front.endpoint)
        client.head_object(Bucket=bucket, Key="a/x")
        with pytest.raises(ClientError) as refused:
            client.get_object(Bucket=bucket, Key="a/x")
    assert refused.value.response["ResponseMetadata"]["HTTPHeaders"]["retry-after"] == "3"

# --------------------------------------------------------------------------- pipelining, bodies, upstream


def _presigned(minio: MinioServer, front: ThrottleFront, method: str, bucket: str, key: str) -> str:
    client = _s3(minio, front.endpoint)
    url = client.generate_presigned_url({"GET": "get_object", "HEAD": "head_object", "PUT": "put_object"}[method],
                                        Params={"Bucket": bucket, "Key": key}, ExpiresIn=600)
    return url[len(front.endpoint):]


def _request(front: ThrottleFront, method: str, target: str, body: bytes = b"") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{front.port}"]
    if method == "PUT":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _responses(sock: socket.socket, methods: List[str]) -> List[Tuple[int, bytes]]:
    """Read one response per method (Content-Length framed, as MinIO and the front answer)."""
    buf, out = b"", []
    for method in methods:
        while b"\r\n\r\n" not in buf:
            data = sock.recv(65536)
            assert data, f"connection closed after {len(out)} responses"
            buf += data
        head, _, buf = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        size = 0 if method == "HEAD" else int(fields.get("content-length", "0"))
        while len(buf) < size:
            buf += sock.recv(65536)
        out.append((int(lines[0].split()[1]), buf[:size]))
        buf = buf[size:]
    return out


def test_pipelined_requests_are_answered_in_order_and_a_throttled_body_is_dropped(
        minio: MinioServer, filled: Tuple[str, Dict[str, bytes]], clock: Clock) -> None:
    bucket, objects = filled
    with TcpProxy((minio.host, minio.port)) as counter, \
            ThrottleFront(counter.host, counter.port, rate=1, burst=2, clock=clock) as front:
        get_a, get_b = (_presigned(minio, front, "GET", bucket, k) for k in ("a/x", "b/y"))
        head_b = _presigned(minio, front, "HEAD", bucket, "b/y")
        put_a = _presigned(minio, front, "PUT", bucket, "a/new")
        wire = [("GET", get_a), ("GET", get_a), ("PUT", put_a), ("GET", get_b), ("GET", get_a), ("HEAD", head_b)]
        with socket.create_connection(("127.0.0.1", front.port), timeout=30) as sock:
            sock.sendall(b"".join(_request(front, m, t, b"dropped body " * 500 if m == "PUT" else b"")
                                  for m, t in wire))
            answers = _responses(sock, [m for m, _ in wire])
            clock.now += 1.0
            sock.sendall(_request(front, "GET", get_a))   # the same connection, recovered
            answers += _responses(sock, ["GET"])
        requests_upstream, connections_upstream = counter.requests, counter.connections
    assert [code for code, _ in answers] == [200, 200, 503, 200, 503, 200, 200]
    assert [answers[i][1] for i in (0, 1, 3, 6)] == [objects["a/x"], objects["a/x"], objects["b/y"], objects["a/x"]]
    assert b"<Code>SlowDown</Code>" in answers[2][1] and b"<Code>SlowDown</Code>" in answers[4][1]
    assert requests_upstream == 5 and connections_upstream == 1   # one upstream connection, kept alive
    with pytest.raises(ClientError):
        _s3(minio, minio.endpoint).head_object(Bucket=bucket, Key="a/new")  # the refused PUT never landed


def test_a_refused_request_that_expects_100_continue_closes_the_connection(
        minio: MinioServer, filled: Tuple[str, Dict[str, bytes]], clock: Clock) -> None:
    bucket, _ = filled
    with ThrottleFront(minio.host, minio.port, rate=1, burst=1, clock=clock) as front:
        put = _presigned(minio, front, "PUT", bucket, "a/never")
        with socket.create_connection(("127.0.0.1", front.port), timeout=30) as sock:
            sock.sendall(_request(front, "GET", _presigned(minio, front, "GET", bucket, "a/x")))
            assert _responses(sock, ["GET"])[0][0] == 200
            sock.sendall(f"PUT {put} HTTP/1.1\r\nHost: 127.0.0.1:{front.port}\r\n"
                         "Content-Length: 5\r\nExpect: 100-continue\r\n\r\n".encode())
            assert _responses(sock, ["PUT"])[0][0] == 503
            assert sock.recv(100) == b""                   # closed: the body it held back is not awaited

# --------------------------------------------------------------------------- fake-gcs-server through the front


def test_gcs_json_requests_are_limited_per_bucket_and_answered_like_gcs(
        gcs_server: FakeGcsServer, clock: Clock) -> None:
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    gcs_server.create_bucket(bucket)
    host, port = gcs_server.endpoint.split("//", 1)[1].rsplit(":", 1)
    with ThrottleFront(host, int(port), rate=1, burst=2, shape="gcs", retry_after=1, depth=0,
                       clock=clock) as front:
        with socket.create_connection(("127.0.0.1", front.port), timeout=30) as sock:
            put = f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name=d/o1"
            sock.sendall(_request(front, "PUT", put, b"hello").replace(b"PUT ", b"POST ", 1))
            get = f"/download/storage/v1/b/{bucket}/o/d%2Fo1?alt=media"
            sock.sendall(_request(front, "GET", get) * 2)
            answers = _responses(sock, ["POST", "GET", "GET"])
        stats = front.stats()
    assert [code for code, _ in answers] == [200, 200, 429]
    assert answers[1][1] == b"hello"
    assert json.loads(answers[2][1])["error"]["errors"][0]["reason"] == "rateLimitExceeded"
    assert stats["prefixes"] == {f"{bucket}/": {"requests": 3, "throttled": 1}}
