"""pegasus-cloudio-transfer with gs:// URLs, natively (no gsutil, no stock tool): real processes, real servers."""

import configparser
import json
import os
import subprocess
import sys
import uuid

import boto3
import botocore.exceptions
import pytest

from transfer import Session, Settings, parse_url

OURS = [sys.executable, "-m", "pegasus_cloudio.dropin"]


def run(entries, env, cwd):
    done = subprocess.run(OURS, input=json.dumps(entries),
                          env=dict(env, PATH=os.environ["PATH"], PYTHONPATH=os.environ.get("PYTHONPATH", "")),
                          cwd=cwd, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr


def transfer(src, dst, lfn, src_label="local", dst_label="gcs"):
    return {"type": "transfer", "lfn": lfn, "id": 1, "src_urls": [{"site_label": src_label, "url": src}],
            "dest_urls": [{"site_label": dst_label, "url": dst}]}


def listed(env, bucket):
    with Session(Settings(), env) as session:
        return sorted(i.url.path for i in session.backend(parse_url(f"gs://{bucket}/x")).list(
            parse_url(f"gs://{bucket}")))


def test_upload_mkdir_download_and_recursive_remove(gcs_env, tmp_path):
    bucket = f"new-{uuid.uuid4().hex[:12]}"  # made by the mkdir below
    for name in ("a.dat", "b.dat"):
        (tmp_path / name).write_bytes(os.urandom(1000))
    rc, err = run([{"type": "mkdir", "target": {"site_label": "gcs", "url": f"gs://{bucket}/run/dir"}}]
                  + [transfer(f"file://{tmp_path}/{n}", f"gs://{bucket}/run/dir/{n}", n) for n in ("a.dat", "b.dat")]
                  + [transfer(f"file://{tmp_path}/a.dat", f"gs://{bucket}/keep/a.dat", "a.dat")], gcs_env, tmp_path)
    assert rc == 0, err
    rc, err = run([transfer(f"gs://{bucket}/run/dir/{n}", f"file://{tmp_path}/back/{n}", n, "gcs", "local")
                   for n in ("a.dat", "b.dat")], gcs_env, tmp_path)
    assert rc == 0, err
    assert all((tmp_path / "back" / n).read_bytes() == (tmp_path / n).read_bytes() for n in ("a.dat", "b.dat"))
    rc, err = run([{"type": "remove", "target": {"site_label": "gcs", "url": f"gs://{bucket}/run",
                                                 "recursive": True}}], gcs_env, tmp_path)
    assert rc == 0, err
    assert listed(gcs_env, bucket) == ["/keep/a.dat"]


def test_failed_gs_download_exits_nonzero_and_leaves_no_file(gcs_env, gcs_bucket, tmp_path):
    """Regression for the stock GSHandler's missing ``continue`` (spec 7.1)."""
    (tmp_path / "out").mkdir()
    rc, err = run([transfer(f"gs://{gcs_bucket}/never/written.dat", f"file://{tmp_path}/out/written.dat",
                            "written.dat", "gcs", "local")], gcs_env, tmp_path)
    assert rc != 0 and "All transfers completed successfully" not in err
    assert os.listdir(tmp_path / "out") == []


def test_failed_first_hop_from_gs_creates_nothing_in_s3(gcs_env, s3_env, bucket, gcs_bucket, tmp_path):
    """The stock tool turns this into exit 0 and an empty destination (spec 7.1)."""
    env = {**s3_env, **gcs_env}
    rc, err = run([transfer(f"gs://{gcs_bucket}/missing", f"s3://test@minio/{bucket}/copied", "copied",
                            "gcs", "minio")], env, tmp_path)
    assert rc != 0 and "All transfers completed successfully" not in err
    with pytest.raises(botocore.exceptions.ClientError):
        _s3(s3_env).head_object(Bucket=bucket, Key="copied")


def test_two_hop_transfers_s3_to_gs_and_gs_to_s3(gcs_env, s3_env, bucket, gcs_bucket, tmp_path):
    env = {**s3_env, **gcs_env}
    data = os.urandom(70_000)
    (tmp_path / "orig").write_bytes(data)
    rc, err = run([transfer(f"file://{tmp_path}/orig", f"s3://test@minio/{bucket}/orig", "orig", "local", "minio")],
                  env, tmp_path)
    assert rc == 0, err
    rc, err = run([transfer(f"s3://test@minio/{bucket}/orig", f"gs://{gcs_bucket}/from-s3", "x", "minio", "gcs")],
                  env, tmp_path)
    assert rc == 0, err
    rc, err = run([transfer(f"gs://{gcs_bucket}/from-s3", f"s3://test@minio/{bucket}/round-trip", "y", "gcs",
                            "minio")], env, tmp_path)
    assert rc == 0, err
    assert _s3(s3_env).get_object(Bucket=bucket, Key="round-trip")["Body"].read() == data


def _s3(s3_env):
    """A boto3 client for the MinIO of ``s3_env`` (read from its Pegasus credentials file)."""
    parser = configparser.ConfigParser()
    parser.read(s3_env["PEGASUS_CREDENTIALS"])
    return boto3.client("s3", endpoint_url=parser["minio"]["endpoint"], region_name="us-east-1",
                        aws_access_key_id=parser["test@minio"]["access_key"],
                        aws_secret_access_key=parser["test@minio"]["secret_key"])
