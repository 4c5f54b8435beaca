"""Messages name what the user asked for: a body cut mid-way names the object, not only the endpoint."""

import os

import boto3

from pegasus_cloudio_testbed.proxy import Fault
from transfer import Engine, RetryPolicy, Session, Settings, Transfer, parse_url
from transfer.http.resume import RESUMES


def test_a_truncated_body_names_the_object(proxied, bucket, minio, tmp_path):
    proxy, env = proxied
    boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                 aws_secret_access_key=minio.secret_key, region_name="us-east-1").put_object(
        Bucket=bucket, Key="data/obj.bin", Body=os.urandom(1 << 20))
    # the body and each of its resumes cut (a body cut once resumes inside its attempt)
    proxy.set_faults([Fault.truncate(after_bytes=200_000, times=1 + RESUMES, method="GET")])  # 4 x 200 kB < 1 MiB
    url = f"s3://test@minio/{bucket}/data/obj.bin"
    with Session(Settings(threads=1), env) as session:
        [result] = Engine(session, retry=RetryPolicy(1, 0.001, 0.01)).run(
            [Transfer((parse_url(url, site_label="minio"),), parse_url(f"file://{tmp_path}/obj.bin"))])
    assert not result.ok
    assert url in str(result.error) and "body bytes" in str(result.error), result.error
    assert not (tmp_path / "obj.bin").exists()
