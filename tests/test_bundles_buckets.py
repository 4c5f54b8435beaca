"""Bundles of two buckets with the same directory path (real MinIO): a backend that serves
every bucket of an endpoint (plain ``s3://BUCKET/KEY`` URLs, ``gs://``) must not mix their
directory indexes nor pack one bucket's files into another's bundle."""

from __future__ import annotations

import uuid

import boto3

from transfer import Engine, RetryPolicy, Session, Settings, Transfer, parse_url

FAST = RetryPolicy(max_attempts=2, base_delay=0.001, max_delay=0.01)


def _aws_env(minio, tmp_path):
    """Plain ``s3://BUCKET/KEY`` URLs at MinIO through the AWS variables (one backend, all buckets)."""
    return {"AWS_ENDPOINT_URL": minio.endpoint, "AWS_ACCESS_KEY_ID": minio.access_key,
            "AWS_SECRET_ACCESS_KEY": minio.secret_key, "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true", "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": "/dev/null"}


def _buckets(minio, count):
    s3 = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                      aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    names = [f"t-{uuid.uuid4().hex[:16]}" for _ in range(count)]
    for name in names:
        s3.create_bucket(Bucket=name)
    return s3, names


def _run(env, pairs, **settings):
    """One engine run of ``(source, dest)`` URL pairs with bundles on; all must succeed."""
    with Session(Settings(threads=2, bundle=True, **settings), env) as session:
        results = Engine(session, retry=FAST).run([Transfer((parse_url(a),), parse_url(b)) for a, b in pairs])
    assert all(r.ok for r in results), [str(r.error) for r in results if not r.ok]


def _bundle_in(env, bucket, local, scheme="s3"):
    """``SCHEME://BUCKET/D/x0..x3`` uploaded as one bundle (bytes ``bundled in the first I``)."""
    local.mkdir()
    for i in range(4):
        (local / f"x{i}").write_bytes(f"bundled in the first {i}".encode())
    _run(env, [(f"file://{local}/x{i}", f"{scheme}://{bucket}/D/x{i}") for i in range(4)], bundle_min_files=4)


def test_uploads_to_two_buckets_land_in_their_own_bucket(minio, tmp_path):
    """Files bundled for ``s3://b1/D/`` and ``s3://b2/D/`` in one batch: each bucket gets its own
    bundle, and every file reads back from the bucket it was written to."""
    s3, (first, second) = _buckets(minio, 2)
    env = _aws_env(minio, tmp_path)
    local = tmp_path / "in"
    local.mkdir()
    ops = []
    for bucket in (first, second):
        for i in range(4):
            path = local / f"{bucket}-{i}"
            path.write_bytes(f"{bucket} {i}".encode())
            ops.append((f"file://{path}", f"s3://{bucket}/D/{bucket}-{i}"))
    _run(env, ops, bundle_min_files=4)
    for bucket in (first, second):
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="D/").get("Contents", [])]
        assert len(keys) == 1 and keys[0].startswith("D/.cloudio-bundles/"), (bucket, keys)
    out = tmp_path / "out"
    _run(env, [(f"s3://{bucket}/D/{bucket}-{i}", f"file://{out}/{bucket}-{i}") for bucket in (first, second)
               for i in range(4)])
    for bucket in (first, second):
        for i in range(4):
            assert (out / f"{bucket}-{i}").read_bytes() == f"{bucket} {i}".encode()


def test_downloads_from_two_buckets_read_their_own_bucket(minio, tmp_path):
    """``s3://b1/D/x`` is a bundle member, ``s3://b2/D/x`` a plain object of other bytes: one
    batch reads each from its own bucket."""
    s3, (first, second) = _buckets(minio, 2)
    env = _aws_env(minio, tmp_path)
    for i in range(4):
        s3.put_object(Bucket=second, Key=f"D/x{i}", Body=f"plain in the second {i}".encode())
    _bundle_in(env, first, tmp_path / "in")
    assert "Contents" in s3.list_objects_v2(Bucket=first, Prefix="D/.cloudio-bundles/")
    out = tmp_path / "out"
    _run(env, [(f"s3://{bucket}/D/x{i}", f"file://{out}/{bucket}/x{i}") for bucket in (first, second) for i in range(4)])
    for i in range(4):
        assert (out / first / f"x{i}").read_bytes() == f"bundled in the first {i}".encode()
        assert (out / second / f"x{i}").read_bytes() == f"plain in the second {i}".encode()


def test_a_remove_in_one_bucket_leaves_the_same_path_in_another_alone(minio, tmp_path):
    """A long-lived engine read ``s3://b1/D/``'s members (its index is loaded), then removes
    ``s3://b2/D/x0``: only b2's object goes; b1's member ``x0`` still reads back."""
    from transfer import Remove

    s3, (first, second) = _buckets(minio, 2)
    env = _aws_env(minio, tmp_path)
    _bundle_in(env, first, tmp_path / "in")
    s3.put_object(Bucket=second, Key="D/x0", Body=b"plain in the second")
    with Session(Settings(threads=2, bundle=True), env) as session:
        engine = Engine(session, retry=FAST)
        assert all(r.ok for r in engine.run([Transfer((parse_url(f"s3://{first}/D/x{i}"),),
                                                      parse_url(f"file://{tmp_path}/out/x{i}")) for i in range(4)]))
        [removed] = engine.run([Remove(parse_url(f"s3://{second}/D/x0"))])
    assert removed.ok, removed.error
    assert "Contents" not in s3.list_objects_v2(Bucket=second, Prefix="D/")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=first, Prefix="D/").get("Contents", [])
            if ".rm-" in o["Key"]] == []
    _run(env, [(f"s3://{first}/D/x0", f"file://{tmp_path}/again/x0")])
    assert (tmp_path / "again" / "x0").read_bytes() == b"bundled in the first 0"


def test_gcs_downloads_from_two_buckets_read_their_own_bucket(gcs_server, gcs_env, tmp_path):
    """The same on GCS (fake-gcs-server): one backend serves every ``gs://BUCKET``."""
    first, second = (f"t-{uuid.uuid4().hex[:16]}" for _ in range(2))
    for bucket in (first, second):
        gcs_server.create_bucket(bucket)
    _bundle_in(gcs_env, first, tmp_path / "in", "gs")
    plain = tmp_path / "plain"
    plain.mkdir()
    for i in range(4):  # fewer than bundle_min_files (8): plain objects
        (plain / f"x{i}").write_bytes(f"plain in the second {i}".encode())
    _run(gcs_env, [(f"file://{plain}/x{i}", f"gs://{second}/D/x{i}") for i in range(4)])
    out = tmp_path / "out"
    _run(gcs_env, [(f"gs://{bucket}/D/x{i}", f"file://{out}/{bucket}/x{i}") for bucket in (first, second)
                   for i in range(4)])
    for i in range(4):
        assert (out / first / f"x{i}").read_bytes() == f"bundled in the first {i}".encode()
        assert (out / second / f"x{i}").read_bytes() == f"plain in the second {i}".encode()
