"""The engine's pipelined first pass over small S3 uploads (transfer/batched.py, write_batched),
through a fault-injecting proxy in front of a real MinIO: every object is stored whole and
right, a fault costs a file nothing but the ordinary path's usual attempts, and an answer
vouches only for the bytes of its own request."""

import os

import boto3
import pytest

from pegasus_cloudio_testbed.proxy import Fault
from transfer import Engine, RetryPolicy, Session, Settings, Transfer, parse_url
from transfer.cache import CacheConfig, NodeCache
from transfer.errors import NotFound

FAST_RETRY = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05)
COUNT = 24


def s3(bucket, key):
    return parse_url(f"s3://test@minio/{bucket}/{key}", site_label="minio")


@pytest.fixture
def files(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    data = {f"f{i:02d}": os.urandom(100 + i) for i in range(COUNT)}
    for name, content in data.items():
        (src / name).write_bytes(content)
    return src, data


def upload(env, bucket, src, names, threads=3, settings=None, cache=None):
    with Session(settings or Settings(threads=threads), env) as session:
        return Engine(session, retry=FAST_RETRY, cache=cache).run(
            [Transfer((parse_url(str(src / n)),), s3(bucket, n)) for n in names])


def stored(minio, bucket):
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    return {k: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def test_a_batch_of_uploads_is_pipelined_over_few_connections_and_stored_whole(minio, proxied, bucket, files):
    proxy, env = proxied
    src, data = files
    results = upload(env, bucket, src, list(data))
    assert all(r.ok and r.attempts == 1 and len(r.history) == 1 for r in results), [r.error for r in results]
    assert [r.bytes for r in results] == [len(v) for v in data.values()]
    counts = proxy.snapshot()
    assert counts["requests_by_method"] == {"PUT": COUNT} and counts["connections"] <= 3
    assert stored(minio, bucket) == data


@pytest.mark.parametrize("fault", [
    Fault.reset(after_bytes=0, method="PUT"),
    Fault.reset(after_bytes=300, method="PUT"),
    Fault.truncate(after_bytes=100, method="PUT"),
    # every request head re-arms it: each connection is reset some answers into its pipeline
    Fault.reset(after_bytes=2000, method="PUT", times=10_000),
], ids=["reset-before-answer", "reset-mid-answer", "truncate-mid-answer", "reset-every-few-answers"])
def test_a_connection_lost_mid_pipeline_costs_no_file_an_attempt(minio, proxied, bucket, files, fault):
    proxy, env = proxied
    src, data = files
    proxy.set_faults([fault])
    results = upload(env, bucket, src, list(data))
    assert all(r.ok and r.attempts == 1 for r in results), [r.error for r in results if not r.ok]
    assert stored(minio, bucket) == data


def test_a_503_slow_down_mid_pass_ends_it_and_the_rest_go_one_by_one(minio, proxied, bucket, files):
    """The proxy answers one PUT 503 SlowDown itself, ahead of the store's answers to the
    requests pipelined before it: no answer is taken for another file, the pass ends, and the
    per-file path stores every file."""
    proxy, env = proxied
    src, data = files
    proxy.set_faults([Fault.status(503, method="PUT", path="/f10", times=1)])
    results = upload(env, bucket, src, list(data), threads=1)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert stored(minio, bucket) == data


def test_answers_out_of_step_vouch_for_no_other_file(minio, proxied, bucket, files):
    """A 500 the proxy answers ahead of the store shifts every later answer by one: each then
    names another request's bytes (ETag, CRC32), is not taken, and its file is sent again."""
    proxy, env = proxied
    src, data = files
    proxy.set_faults([Fault.status(500, body=b"<Error><Code>InternalError</Code></Error>", method="PUT",
                                   path="/f10", times=1)])
    results = upload(env, bucket, src, list(data), threads=1)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert stored(minio, bucket) == data
    assert proxy.snapshot()["requests_by_method"]["PUT"] > COUNT


def test_persistent_faults_fail_each_file_after_its_attempts(minio, proxied, bucket, files):
    proxy, env = proxied
    src, data = files
    proxy.set_faults([Fault.reset(after_bytes=0, method="PUT", times=10_000)])
    names = list(data)[:4]
    results = upload(env, bucket, src, names)
    # (the store took each PUT; only its answer was lost, each time)
    assert all(not r.ok and r.attempts == 3 for r in results), [(r.ok, r.error, r.attempts) for r in results]


def test_a_missing_local_file_fails_alone_as_the_ordinary_path_reports_it(minio, proxied, bucket, files):
    proxy, env = proxied
    src, data = files
    names = list(data)[:5] + ["absent"] + list(data)[5:10]
    results = upload(env, bucket, src, names)
    by_name = dict(zip(names, results))
    assert not by_name["absent"].ok and isinstance(by_name["absent"].error, NotFound)
    assert all(r.ok and r.attempts == 1 for n, r in by_name.items() if n != "absent")
    assert stored(minio, bucket) == {n: data[n] for n in names if n != "absent"}


def test_files_at_the_multipart_threshold_go_the_ordinary_way(minio, proxied, bucket, files):
    proxy, env = proxied
    src, data = files
    big = os.urandom(5 << 20)
    (src / "big").write_bytes(big)
    names = list(data)[:6] + ["big"]
    settings = Settings(threads=3, multipart_threshold=5 << 20, multipart_part_size=5 << 20)
    results = upload(env, bucket, src, names, settings=settings)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert stored(minio, bucket) == dict({n: data[n] for n in names[:6]}, big=big)
    assert proxy.snapshot()["requests_by_method"]["POST"] == 2  # its multipart upload: create, complete


def test_with_upload_write_through_each_pipelined_file_fills_the_node_cache(minio, proxied, bucket, files, tmp_path):
    proxy, env = proxied
    src, data = files
    cache = NodeCache(CacheConfig(str(tmp_path / "cache"), max_bytes=1 << 30, min_free_bytes=0, fsync=False,
                                  uploads=True))
    results = upload(env, bucket, src, list(data), cache=cache)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert proxy.snapshot()["requests_by_method"] == {"PUT": COUNT}
    proxy.reset_counters()
    out = tmp_path / "out"
    with Session(Settings(threads=3), env) as session:
        back = Engine(session, cache=cache).run(
            [Transfer((s3(bucket, n),), parse_url(f"file://{out}/{n}")) for n in data])
    assert all(r.ok for r in back)
    assert proxy.snapshot()["requests"] == 0
    assert {n: (out / n).read_bytes() for n in data} == data
