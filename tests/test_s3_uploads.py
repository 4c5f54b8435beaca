"""Stale multipart uploads: the engine's aborts are retried, and ``lsup``/``rmup`` list and
remove what a killed client or server left (real MinIO)."""

import os
import subprocess
import sys

import boto3

from pegasus_cloudio.testbed.proxy import Fault
from transfer import Engine, RetryPolicy, Session, Settings, Transfer, parse_url

OURS = [sys.executable, "-m", "pegasus_cloudio.s3cli.main"]
MiB = 1 << 20


def client(minio):
    return boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                        aws_secret_access_key=minio.secret_key, region_name="us-east-1")


def uploads(s3, bucket):
    return sorted((u["Key"], u["UploadId"]) for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []))


def orphan(s3, bucket, key):
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"x" * 1024)
    return upload_id


def cli(args, s3_env, tmp_path):
    done = subprocess.run(OURS + args, env=dict(os.environ, **s3_env), cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


def test_lsup_lists_and_rmup_removes_stale_uploads(s3_env, bucket, minio, tmp_path):
    s3 = client(minio)
    first = orphan(s3, bucket, "run/a.dat")
    orphan(s3, bucket, "run/b.dat")
    orphan(s3, bucket, "other/c.dat")
    rc, out, err = cli(["lsup", f"s3://test@minio/{bucket}/run/"], s3_env, tmp_path)
    assert rc == 0, err
    assert first in out and "run/a.dat" in out and "run/b.dat" in out and "other/c.dat" not in out
    rc, _, err = cli(["rmup", f"s3://test@minio/{bucket}/run/a.dat"], s3_env, tmp_path)
    assert rc == 1 and "UPLOAD id, or -a" in err
    assert cli(["rmup", f"s3://test@minio/{bucket}/run/a.dat", first], s3_env, tmp_path)[0] == 0
    assert [key for key, _ in uploads(s3, bucket)] == ["other/c.dat", "run/b.dat"]
    assert cli(["rmup", "-a", f"s3://test@minio/{bucket}/run/"], s3_env, tmp_path)[0] == 0
    assert [key for key, _ in uploads(s3, bucket)] == ["other/c.dat"]
    assert cli(["rmup", "-a", f"s3://test@minio/{bucket}"], s3_env, tmp_path)[0] == 0
    assert uploads(s3, bucket) == []


def test_a_failed_multipart_upload_is_aborted_even_when_the_first_abort_fails(proxied, bucket, minio, tmp_path):
    proxy, env = proxied
    src = tmp_path / "big.dat"
    src.write_bytes(os.urandom(11 * MiB))
    denied = b"<Error><Code>AccessDenied</Code><Message>no</Message></Error>"
    proxy.set_faults([Fault.status(403, body=denied, method="PUT", path="partNumber=2", times=5),
                      Fault.status(503, method="DELETE", path="uploadId", times=2)])
    settings = Settings(threads=2, multipart_threshold=5 * MiB, multipart_part_size=5 * MiB)
    with Session(settings, env) as session:
        [result] = Engine(session, retry=RetryPolicy(1, 0.001, 0.01)).run(
            [Transfer((parse_url(str(src)),), parse_url(f"s3://test@minio/{bucket}/big.dat", site_label="minio"))])
    assert not result.ok
    assert proxy.requests_by_method.get("DELETE", 0) == 3  # two 503s, then the abort that worked
    assert uploads(client(minio), bucket) == []
