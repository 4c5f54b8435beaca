"""Faults at the socket level, injected by a proxy between the client and a real MinIO:
retries recover transient failures, permanent ones fail fast, and no partial file is left."""

import os

import pytest

from pegasus_cloudio_testbed.proxy import Fault
from transfer.http.resume import RESUMES
from transfer import Engine, NotFound, RetryPolicy, Session, Settings, Throttled, Transfer, TransientError, parse_url

FAST_RETRY = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05)
SIZE = 1 << 20


def s3(bucket, key):
    return parse_url(f"s3://test@minio/{bucket}/{key}", site_label="minio")


@pytest.fixture
def stored(proxied, bucket, tmp_path):
    """A 1 MiB object uploaded through the proxy (no fault); returns (proxy, env, data)."""
    proxy, env = proxied
    data = os.urandom(SIZE)
    (tmp_path / "orig").write_bytes(data)
    with Session(Settings(threads=2), env) as session:
        assert Engine(session).run([Transfer((parse_url(str(tmp_path / "orig")),), s3(bucket, "obj"))])[0].ok
    return proxy, env, data


def download(env, bucket, dest, read_timeout=5.0):
    with Session(Settings(threads=2, read_timeout=read_timeout), env) as session:
        [result] = Engine(session, retry=FAST_RETRY).run([Transfer((s3(bucket, "obj"),), parse_url(f"file://{dest}"))])
    return result


def no_leftovers(directory):
    return [n for n in os.listdir(directory) if n.startswith(".")] == []


@pytest.mark.parametrize("fault", [
    Fault.reset(after_bytes=SIZE // 2, method="GET"),
    Fault.truncate(after_bytes=SIZE // 2, method="GET"),
    Fault.reset(after_bytes=0, method="GET"),
    Fault.status(503, method="GET"),
    Fault.status(500, body=b"<Error><Code>InternalError</Code></Error>", method="GET"),
], ids=["reset-mid-body", "truncate-mid-body", "reset-before-response", "503-slowdown", "500"])
def test_one_transient_fault_is_retried_and_the_file_is_complete(stored, bucket, tmp_path, fault):
    proxy, env, data = stored
    proxy.set_faults([fault])
    dest = tmp_path / "out" / "obj"
    result = download(env, bucket, dest)
    assert result.ok, result.error
    # a cut connection is made whole inside the attempt (transfer/http/resume.py); an error
    # answer is the engine's to retry, after its backoff
    assert result.attempts == (2 if fault.kind == "status" else 1)
    assert dest.read_bytes() == data
    assert no_leftovers(dest.parent)


def test_stall_hits_the_read_timeout_and_is_resumed(stored, bucket, tmp_path):
    proxy, env, data = stored
    proxy.set_faults([Fault.stall(seconds=5, after_bytes=1000, method="GET")])
    dest = tmp_path / "stall" / "obj"
    result = download(env, bucket, dest, read_timeout=0.5)
    assert result.ok and result.attempts == 1
    assert dest.read_bytes() == data


def test_persistent_fault_fails_after_max_attempts_leaving_nothing(stored, bucket, tmp_path):
    proxy, env, _ = stored
    proxy.reset_counters()
    proxy.set_faults([Fault.truncate(after_bytes=1000, method="GET", times=100)])  # each answer: 1 KB more
    dest = tmp_path / "fail" / "obj"
    result = download(env, bucket, dest)
    assert not result.ok and isinstance(result.error, TransientError)
    assert result.attempts == 3 and result.error.attempts == 3
    assert proxy.requests_by_method.get("GET") == 3 * (1 + RESUMES)  # each attempt: a GET and its resumes
    assert not dest.exists() and no_leftovers(dest.parent)


def test_throttling_spends_no_attempts(stored, bucket, tmp_path):
    """Ten 503 SlowDown answers to a file allowed 3 attempts: it arrives on the 11th."""
    proxy, env, data = stored
    proxy.set_faults([Fault.status(503, method="GET", times=10)])
    result = download(env, bucket, tmp_path / "thr" / "obj")
    assert result.ok, result.error
    assert result.attempts == 11 and all(isinstance(a.error, Throttled) for a in result.history[:10])
    assert (tmp_path / "thr" / "obj").read_bytes() == data


def test_throttling_until_the_time_runs_out_is_a_throttled_failure(stored, bucket, tmp_path):
    proxy, env, _ = stored
    proxy.set_faults([Fault.status(503, method="GET", times=100000)])
    dest = tmp_path / "thr" / "obj"
    with Session(Settings(threads=2), env) as session:
        retry = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05, throttle_timeout=1.0)
        [result] = Engine(session, retry=retry).run([Transfer((s3(bucket, "obj"),), parse_url(f"file://{dest}"))])
    assert not result.ok and isinstance(result.error, Throttled) and result.attempts > 3
    assert "the store throttled it for" in str(result.error) and "ran out" in str(result.error)
    assert isinstance(result.error.__cause__, Throttled)
    assert not dest.exists() and no_leftovers(dest.parent)


def test_not_found_is_not_retried(proxied, bucket, tmp_path):
    proxy, env = proxied
    proxy.reset_counters()
    with Session(Settings(threads=1), env) as session:
        [result] = Engine(session, retry=FAST_RETRY).run(
            [Transfer((s3(bucket, "absent"),), parse_url(f"file://{tmp_path}/absent"))])
    assert isinstance(result.error, NotFound) and result.attempts == 1
    assert proxy.snapshot()["requests_by_method"] == {"GET": 2}  # the object, then its directory's bundles


def test_upload_recovers_from_503_and_reset(proxied, bucket, tmp_path):
    proxy, env = proxied
    src = tmp_path / "up"
    src.write_bytes(os.urandom(200_000))
    proxy.set_faults([Fault.status(503, method="PUT"), Fault.reset(after_bytes=0, method="PUT")])
    with Session(Settings(threads=1), env) as session:
        engine = Engine(session, retry=FAST_RETRY)
        [up] = engine.run([Transfer((parse_url(str(src)),), s3(bucket, "up"))])
        # the 503 costs an attempt; the reset hits a kept-alive connection and is absorbed
        # by one resend on a fresh connection (PUT is idempotent)
        assert up.ok and up.attempts == 2
        [back] = engine.run([Transfer((s3(bucket, "up"),), parse_url(f"file://{tmp_path}/back"))])
    assert back.ok and (tmp_path / "back").read_bytes() == src.read_bytes()


def test_stale_keepalive_connection_is_replaced_transparently(proxied, bucket, tmp_path):
    """The server closing idle connections must not cost a file an attempt."""
    proxy, env = proxied
    (tmp_path / "a").write_bytes(b"a")
    with Session(Settings(threads=1), env) as session:
        engine = Engine(session, retry=FAST_RETRY)
        assert engine.run([Transfer((parse_url(str(tmp_path / "a")),), s3(bucket, "a"))])[0].ok
        proxy.set_faults([Fault.reset(after_bytes=0, method="GET")])  # kills the kept-alive connection
        [result] = engine.run([Transfer((s3(bucket, "a"),), parse_url(f"file://{tmp_path}/a2"))])
    assert result.ok and result.attempts == 1
