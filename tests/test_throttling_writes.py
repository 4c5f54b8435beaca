"""Throttling is not failure for writes either (issue 37): removes and multipart upload parts
against MinIO behind the fault proxy answering ``503 SlowDown``. A batch delete that is
throttled is retried by the engine's one retry loop (no attempts, no budget spent, the store's
``Retry-After`` kept, failed only when the throttle time runs out) and cuts the prefix's pace;
an upload's parts wait for their tokens from that pace."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import List

import boto3
import pytest

from pegasus_cloudio_testbed.faults import Match
from pegasus_cloudio_testbed.proxy import SLOW_DOWN_BODY, Fault
from transfer import Engine, Remove, RetryPolicy, Session, Settings, Transfer, parse_url
from transfer.errors import Throttled
from transfer.pacing import Pacer

QUICK = RetryPolicy(base_delay=0.01, max_delay=0.05)
DELETES = Match("POST", "?delete")


def _client(minio):  # type: ignore[no-untyped-def]
    return boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                        aws_secret_access_key=minio.secret_key, region_name="us-east-1")


def _put(minio, bucket: str, keys: List[str]) -> None:  # type: ignore[no-untyped-def]
    client = _client(minio)
    for key in keys:
        client.put_object(Bucket=bucket, Key=key, Body=key.encode())


def _left(minio, bucket: str) -> List[str]:  # type: ignore[no-untyped-def]
    return [item["Key"] for item in _client(minio).list_objects_v2(Bucket=bucket).get("Contents", [])]


class Sleeps:
    """The engine's sleep: real, and recorded."""

    def __init__(self) -> None:
        self.waits: List[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        time.sleep(seconds)


def _removes(bucket: str, keys: List[str]) -> List[Remove]:
    return [Remove(parse_url(f"s3://test@minio/{bucket}/{key}", site_label="minio")) for key in keys]


@pytest.fixture
def keys(minio, bucket) -> List[str]:  # type: ignore[no-untyped-def]
    names = [f"run/f{n:02d}.dat" for n in range(5)]
    _put(minio, bucket, names)
    return names


def test_a_throttled_batch_delete_is_retried_past_the_attempts_and_the_budget(proxied, minio, bucket, keys):  # type: ignore[no-untyped-def]
    """30 'slow down' answers to the batch delete of 5 objects: 3 attempts, or the run's
    budget (20 + 5/10), would have given up; every object goes, and the prefix was cut."""
    proxy, env = proxied
    proxy.set_faults([Fault(kind="status", times=30, match=DELETES, code=503, body=SLOW_DOWN_BODY)])
    pacer = Pacer()
    with Session(Settings(), env) as session:
        results = Engine(session, retry=QUICK, pacer=pacer).run(_removes(bucket, keys))
    assert [r.ok for r in results] == [True] * 5, [r.error for r in results]
    assert proxy.pending_faults() == 0
    assert _left(minio, bucket) == []
    pace = pacer.pace(parse_url(f"s3://test@minio/{bucket}/{keys[0]}", site_label="minio"))
    assert pace.throttles == 30 and pace.requests == 31


def test_retry_after_is_the_wait_of_a_throttled_delete(proxied, minio, bucket, keys):  # type: ignore[no-untyped-def]
    """One answer with ``Retry-After: 2``: the engine's wait is those seconds (its own backoff
    is 0.05 s at most), then the objects go."""
    proxy, env = proxied
    proxy.set_faults([Fault(kind="status", times=1, match=DELETES, code=503, body=SLOW_DOWN_BODY,
                            headers=(("Retry-After", "2"),))])
    sleeps = Sleeps()
    with Session(Settings(), env) as session:
        results = Engine(session, retry=QUICK, sleep=sleeps).run(_removes(bucket, keys))
    assert all(r.ok for r in results), [r.error for r in results]
    assert proxy.pending_faults() == 0 and _left(minio, bucket) == []
    assert [wait for wait in sleeps.waits if wait >= 2.0], sleeps.waits


def test_a_delete_throttled_past_the_throttle_time_fails_saying_so(proxied, minio, bucket, keys):  # type: ignore[no-untyped-def]
    proxy, env = proxied
    proxy.set_faults([Fault(kind="status", times=100000, match=DELETES, code=503, body=SLOW_DOWN_BODY)])
    policy = RetryPolicy(base_delay=0.01, max_delay=0.05, throttle_timeout=1.0)
    with Session(Settings(), env) as session:
        results = Engine(session, retry=policy).run(_removes(bucket, keys))
    assert [r.ok for r in results] == [False] * 5
    for result in results:
        assert isinstance(result.error, Throttled), result.error
        assert "PEGASUS_CLOUDIO_THROTTLE_TIMEOUT (1 s) ran out" in str(result.error), result.error
        assert f"requests to s3://test@minio/{bucket}/run/ answered" in str(result.error), result.error
    assert sorted(_left(minio, bucket)) == keys  # nothing was deleted


MiB = 1 << 20


def test_multipart_parts_draw_tokens_from_the_prefix_pace(proxied, minio, bucket, tmp_path):  # type: ignore[no-untyped-def]
    """A 4-part upload whose second part is answered 'slow down': the answer cuts the pace of
    the destination's prefix, and every part of both tries, like the file's own request,
    drew its token from that pace (before, uploads were not paced at all)."""
    proxy, env = proxied
    src = tmp_path / "big.dat"
    src.write_bytes(os.urandom(20 * MiB))
    proxy.set_faults([Fault(kind="status", times=1, code=503, body=SLOW_DOWN_BODY,
                            match=Match("PUT", "partNumber=2"))])
    dest = parse_url(f"s3://test@minio/{bucket}/run/big.dat", site_label="minio")
    pacer = Pacer()
    settings = Settings(threads=2, multipart_threshold=5 * MiB, multipart_part_size=5 * MiB)
    with Session(settings, env) as session:
        [result] = Engine(session, retry=QUICK, pacer=pacer).run([Transfer((parse_url(str(src)),), dest)])
    assert result.ok, result.error
    assert proxy.pending_faults() == 0
    assert _client(minio).head_object(Bucket=bucket, Key="run/big.dat")["ContentLength"] == 20 * MiB
    pace = pacer.pace(dest)
    assert pace.throttles == 1
    assert pace.requests == 2 + 4 + 4, pace.requests  # the file's two tries and the parts of each


def test_a_copy_whose_closing_head_is_throttled_is_retried_past_the_attempts(proxied, minio, bucket, keys):  # type: ignore[no-untyped-def]
    """A server-side copy's closing HEAD answered 'slow down' 6 times, with no body (an answer to
    a HEAD has none, so S3 cannot name the code there): a throttle, retried past the 3 attempts
    (as a 503 without a code it failed the copy after 3; a Pegasus workflow's s3-to-s3 stage
    failed so behind a throttling store), and each try's HEAD drew its own token of the pace."""
    proxy, env = proxied
    proxy.set_faults([Fault(kind="status", times=6, code=503, body=SLOW_DOWN_BODY, match=Match("HEAD", "copy"))])
    source = parse_url(f"s3://test@minio/{bucket}/{keys[0]}", site_label="minio")
    dest = parse_url(f"s3://test@minio/{bucket}/run/copy.dat", site_label="minio")
    pacer = Pacer()
    with Session(Settings(), env) as session:
        [result] = Engine(session, retry=QUICK, pacer=pacer).run([Transfer((source,), dest)])
    assert result.ok and result.bytes == len(keys[0]), result.error
    assert proxy.pending_faults() == 0 and proxy.requests_by_method.get("HEAD") == 7
    assert _client(minio).get_object(Bucket=bucket, Key="run/copy.dat")["Body"].read() == keys[0].encode()
    pace = pacer.pace(dest)
    assert pace.throttles == 6 and pace.requests == 2 * 7, pace.requests  # the copy and its HEAD, 7 tries
