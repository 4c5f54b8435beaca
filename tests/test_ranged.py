"""Large downloads as parallel ranged GETs (:mod:`transfer.ranged`) and the one part budget
that every large transfer of an engine shares, against a real MinIO (through the fault proxy
where requests are counted or cut)."""

import os

import boto3
from boto3.s3.transfer import TransferConfig

from pegasus_cloudio_testbed.proxy import Fault
from transfer import Engine, RetryPolicy, Session, Settings, Transfer, parse_url
from transfer.engine import InlineExecutor
from transfer.errors import RemoteError

PART = 64 << 10
FAST_RETRY = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05)


def s3(bucket, key):
    return parse_url(f"s3://test@minio/{bucket}/{key}", site_label="minio")


def client(minio):
    return boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                        aws_secret_access_key=minio.secret_key, region_name="us-east-1")


def put(minio, bucket, key, data, multipart=False):
    if not multipart:
        client(minio).put_object(Bucket=bucket, Key=key, Body=data)
        return
    import io
    config = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    client(minio).upload_fileobj(io.BytesIO(data), bucket, key, Config=config)


def download(env, bucket, dest, executor=None, threads=3):
    settings = Settings(threads=threads, download_part_size=PART)
    with Session(settings, env) as session:
        [result] = Engine(session, retry=FAST_RETRY, executor=executor).run(
            [Transfer((s3(bucket, "obj"),), parse_url(f"file://{dest}"))])
    return result


def no_leftovers(directory):
    return [n for n in os.listdir(directory) if n.startswith(".")] == []


def test_single_part_object_arrives_whole_through_ranged_gets(minio, proxied, bucket, tmp_path):
    """An MD5-ETag object of 17 parts: the MD5 is still checked over the whole file."""
    proxy, env = proxied
    data = os.urandom(16 * PART + 77)
    put(minio, bucket, "obj", data)
    result = download(env, bucket, tmp_path / "out")
    assert result.ok, result.error
    assert (tmp_path / "out").read_bytes() == data
    assert proxy.requests_by_method.get("GET", 0) >= 2  # the first GET and at least one range
    assert no_leftovers(tmp_path)


def test_multipart_object_arrives_whole_through_ranged_gets(minio, proxied, bucket, tmp_path):
    proxy, env = proxied
    data = os.urandom((10 << 20) + 3)
    put(minio, bucket, "obj", data, multipart=True)
    result = download(env, bucket, tmp_path / "out")
    assert result.ok, result.error
    assert (tmp_path / "out").read_bytes() == data
    assert proxy.requests_by_method.get("GET", 0) >= 2


def test_an_object_below_two_parts_is_one_get(minio, proxied, bucket, tmp_path):
    proxy, env = proxied
    data = os.urandom(2 * PART - 1)
    put(minio, bucket, "obj", data)
    result = download(env, bucket, tmp_path / "out")
    assert result.ok and (tmp_path / "out").read_bytes() == data
    assert proxy.requests_by_method.get("GET", 0) == 1


class _OverwriteBeforeFirstRange(InlineExecutor):
    """Runs tasks inline; just before the second task (the first range helper: the first is
    the file task, whose GET head has arrived by then) replaces the object."""

    def __init__(self, replace):
        self.calls = 0
        self._replace = replace

    def submit(self, fn, /, *args, **kwargs):
        self.calls += 1
        if self.calls == 2:
            self._replace()
        return super().submit(fn, *args, **kwargs)


def test_an_object_changed_between_ranges_fails_and_leaves_nothing(minio, s3_env, bucket, tmp_path):
    put(minio, bucket, "obj", os.urandom(8 * PART))
    executor = _OverwriteBeforeFirstRange(lambda: put(minio, bucket, "obj", os.urandom(8 * PART)))
    result = download(s3_env, bucket, tmp_path / "out", executor=executor)
    assert executor.calls >= 2
    assert not result.ok and isinstance(result.error, RemoteError), result.error
    assert result.attempts == 1  # the input changed under the job: not retried
    assert not (tmp_path / "out").exists() and no_leftovers(tmp_path)


def _second_get(fault):
    """The first GET (the full one) passes untouched; ``fault`` hits a later, ranged one."""
    return [Fault.truncate(after_bytes=1 << 40, method="GET"), fault]


def test_a_reset_range_is_resumed_within_the_attempt_and_the_file_is_whole(minio, proxied, bucket, tmp_path):
    proxy, env = proxied
    data = os.urandom(8 * PART)
    put(minio, bucket, "obj", data)
    proxy.set_faults(_second_get(Fault.reset(after_bytes=1000, method="GET")))
    result = download(env, bucket, tmp_path / "out")
    assert proxy.pending_faults() == 0
    assert result.ok and result.attempts == 1, result.error  # the range resumed from its byte
    assert (tmp_path / "out").read_bytes() == data and no_leftovers(tmp_path)


def test_ranges_cut_every_time_fail_cleanly_with_no_partial_file(minio, proxied, bucket, tmp_path):
    proxy, env = proxied
    put(minio, bucket, "obj", os.urandom(8 * PART))
    proxy.set_faults(_second_get(Fault.truncate(after_bytes=1000, method="GET", times=1000)))
    result = download(env, bucket, tmp_path / "out")
    assert not result.ok and result.attempts == FAST_RETRY.max_attempts
    assert not (tmp_path / "out").exists() and no_leftovers(tmp_path)


def test_parts_of_several_large_uploads_stay_within_the_connection_cap(minio, proxied, bucket, tmp_path):
    """Three multipart uploads at once share one part budget of ``threads``: counted at the
    proxy, never more connections at once than the per-endpoint cap (threads + 2)."""
    proxy, env = proxied
    settings = Settings(threads=2, multipart_threshold=5 << 20, multipart_part_size=5 << 20)
    ops = []
    for number in range(3):
        path = tmp_path / f"big{number}"
        path.write_bytes(os.urandom(15 << 20))
        ops.append(Transfer((parse_url(str(path)),), s3(bucket, f"big{number}")))
    with Session(settings, env) as session:
        results = Engine(session).run(ops)
    assert all(r.ok for r in results), [r.error for r in results]
    assert proxy.requests_by_method.get("PUT", 0) >= 9  # every part went through the proxy
    assert 1 <= proxy.peak_open_connections <= settings.threads + 2
