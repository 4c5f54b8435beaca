"""Stale multipart uploads: the engine's aborts are retried, and ``lsup``/``rmup`` list and
remove what a killed client or server left (real MinIO)."""

import os
import subprocess
import sys
from urllib.parse import parse_qsl, unquote

import boto3

from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import Fault
from pegasus_cloudio_testbed.scripted import Reply, ScriptedServer
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


def test_uploads_left_by_a_store_restart_are_listed_and_removed_by_key(tmp_path):
    """MinIO lists an upload it knew before a restart only when asked with its whole key as
    ``prefix`` (boto3's ``list_multipart_uploads(Prefix=key)``); before, ``lsup``/``rmup -a``
    never sent one and found nothing. A MinIO of its own: the shared one must not restart."""
    with MinioServer() as store:
        s3 = client(store)
        s3.create_bucket(Bucket="bkt")
        stale = orphan(s3, "bkt", "run/big.dat")
        store.restart()
        s3 = client(store)
        assert s3.list_multipart_uploads(Bucket="bkt").get("Uploads", []) == []  # what the old lsup asked
        env = {"PEGASUS_CREDENTIALS": str(store.write_pegasus_credentials(tmp_path / "c.conf", site="minio",
                                                                           user="test")),
               "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"}
        rc, out, err = cli(["lsup", "s3://test@minio/bkt/run/big.dat"], env, tmp_path)
        assert rc == 0 and stale in out and "run/big.dat" in out, (out, err)
        assert cli(["rmup", "-a", "s3://test@minio/bkt/run/big.dat"], env, tmp_path)[0] == 0
        assert s3.list_multipart_uploads(Bucket="bkt", Prefix="run/big.dat").get("Uploads", []) == []


def test_lsup_and_rmup_against_amazons_prefix_semantics(tmp_path):
    """The scripted Amazon: ``prefix`` is a key prefix, listings page by key and upload-id
    markers, and every upload under the URL is listed once though two listings are merged."""
    uploads = {("run/a.dat", f"id-a{i}") for i in range(3)} | {("run/b.dat", "id-b"), ("other/c.dat", "id-c")}

    def handler(request):
        query = dict(parse_qsl(request.query, keep_blank_values=True))
        if request.method == "DELETE":
            uploads.discard((unquote(request.path.split("/", 2)[2]), query["uploadId"]))
            return Reply(204)
        found = sorted((k, u) for k, u in uploads if k.startswith(query.get("prefix", "")))
        marker = (query.get("key-marker", ""), query.get("upload-id-marker", ""))
        page = [item for item in found if item > marker][:2]  # two per page, as max-uploads=2 would
        more = len([item for item in found if item > marker]) > 2
        body = "".join(f"<Upload><Key>{k}</Key><UploadId>{u}</UploadId><Initiated>2026-11-25T00:00:00Z</Initiated>"
                       f"</Upload>" for k, u in page)
        tail = (f"<NextKeyMarker>{page[-1][0]}</NextKeyMarker><NextUploadIdMarker>{page[-1][1]}"
                f"</NextUploadIdMarker>") if more else ""
        return Reply(200, {"Content-Type": "application/xml"},
                     f"<ListMultipartUploadsResult><IsTruncated>{str(more).lower()}</IsTruncated>{tail}{body}"
                     f"</ListMultipartUploadsResult>".encode())

    with ScriptedServer(handler) as server:
        creds = tmp_path / "c.conf"
        creds.write_text(f"[amazon]\nendpoint = {server.endpoint}\n\n[test@amazon]\naccess_key = AK\n"
                         "secret_key = SK\n")
        creds.chmod(0o600)
        env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
               "AWS_EC2_METADATA_DISABLED": "true"}
        rc, out, err = cli(["lsup", "s3://test@amazon/bkt/run/"], env, tmp_path)
        assert rc == 0, err
        listed = sorted(line.split("\t")[2:4] for line in out.splitlines())
        assert listed == [["id-a0", "run/a.dat"], ["id-a1", "run/a.dat"], ["id-a2", "run/a.dat"], ["id-b", "run/b.dat"]]
        assert any("prefix=run%2F" in r.query or "prefix=run/" in r.query for r in server.requests)
        assert cli(["rmup", "-a", "s3://test@amazon/bkt/run/a.dat"], env, tmp_path)[0] == 0
        assert uploads == {("run/b.dat", "id-b"), ("other/c.dat", "id-c")}
