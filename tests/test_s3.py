"""S3 specifics on a real MinIO: one GET per download, pooled connections, batch deletes,
multipart, server-side copy, TLS, credentials errors."""

import base64
import hashlib
import os
import subprocess
import sys
import zlib

import boto3
import pytest

from transfer import AuthError, Engine, Mkdir, RemoteError, Remove, Session, Settings, Transfer, parse_url
from local_files import files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def s3(bucket, key=""):
    return parse_url(f"s3://test@minio/{bucket}/{key}".rstrip("/"), site_label="minio")


def make_files(directory, count, size=300):
    return files(directory, count, size, name="f{:04d}")


def test_import_transfer_loads_no_sdk():
    code = "import sys, transfer; print(sorted(m for m in sys.modules if m.split('.')[0] in ('boto3','botocore','google')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_batch_uses_one_pool_one_get_per_file(s3_env, bucket, tmp_path):
    files = make_files(tmp_path / "src", 120)
    with Session(Settings(threads=5), s3_env) as session:
        engine = Engine(session)
        up = engine.run([Transfer((parse_url(str(p)),), s3(bucket, f"run/{p.name}")) for p in files])
        assert all(r.ok for r in up)
        before = session.stats.requests_sent
        down = engine.run([Transfer((s3(bucket, f"run/{p.name}"),), parse_url(f"file://{tmp_path}/dst/{p.name}"))
                           for p in files])
        assert all(r.ok for r in down)
        assert session.stats.requests_sent - before == len(files)  # no HEAD before GET
        assert session.stats.connections_opened <= 5 + 2
    for p in files:
        assert (tmp_path / "dst" / p.name).read_bytes() == p.read_bytes()


def test_recursive_remove_deletes_in_batches_of_1000(s3_env, bucket, tmp_path, minio):
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    for i in range(1050):
        client.put_object(Bucket=bucket, Key=f"scratch/run1/f{i}", Body=b"x")
    client.put_object(Bucket=bucket, Key="keep/me", Body=b"x")
    with Session(Settings(threads=4), s3_env) as session:
        before = session.stats.requests_sent
        [result] = Engine(session).run([Remove(s3(bucket, "scratch/run1"), recursive=True)])
        assert result.ok, result.error
        sent = session.stats.requests_sent - before
    assert sent == 2 + 2  # two list pages (1,000 keys each) and two delete batches
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys == ["keep/me"]


def test_multipart_upload_above_threshold_round_trips(s3_env, bucket, tmp_path, minio):
    data = os.urandom(12 << 20)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    settings = Settings(threads=3, multipart_threshold=5 << 20, multipart_part_size=5 << 20)
    with Session(settings, s3_env) as session:
        engine = Engine(session)
        [up] = engine.run([Transfer((parse_url(str(src)),), s3(bucket, "big.bin"))])
        assert up.ok, up.error
        [down] = engine.run([Transfer((s3(bucket, "big.bin"),), parse_url(f"file://{tmp_path}/back.bin"))])
        assert down.ok, down.error
    assert hashlib.sha256((tmp_path / "back.bin").read_bytes()).digest() == hashlib.sha256(data).digest()
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    assert client.head_object(Bucket=bucket, Key="big.bin")["ETag"].strip('"').endswith("-3")


def test_multipart_parts_carry_crc32_that_the_store_checks(s3_env, bucket, tmp_path, minio, monkeypatch):
    """Parts go up with x-amz-checksum-crc32 (the upload declared CRC32): the store keeps each
    part's checksum, and refuses a part whose bytes do not match the one sent."""
    import transfer.backends._s3_multipart as s3_multipart

    data = os.urandom(11 << 20)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    settings = Settings(threads=2, multipart_threshold=5 << 20, multipart_part_size=5 << 20, max_attempts=1)
    with Session(settings, s3_env) as session:
        [up] = Engine(session).run([Transfer((parse_url(str(src)),), s3(bucket, "crc.bin"))])
    assert up.ok, up.error
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    part = client.head_object(Bucket=bucket, Key="crc.bin", PartNumber=1, ChecksumMode="ENABLED")
    assert part["ChecksumCRC32"] == base64.b64encode(zlib.crc32(data[:5 << 20]).to_bytes(4, "big")).decode()

    real = s3_multipart.crc32_of
    monkeypatch.setattr(s3_multipart, "crc32_of",
                        lambda region: "AAAAAA==" if region.offset else real(region))  # part 2 lies
    with Session(settings, s3_env) as session:
        [bad] = Engine(session).run([Transfer((parse_url(str(src)),), s3(bucket, "lie.bin"))])
    assert not bad.ok and bad.error is not None and "lie.bin" in (bad.error.url or "")
    assert "Contents" not in client.list_objects_v2(Bucket=bucket, Prefix="lie.bin")
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []  # aborted


def test_server_side_copy_between_keys(s3_env, bucket, tmp_path):
    src = tmp_path / "a"
    src.write_bytes(b"copy me")
    with Session(Settings(threads=2), s3_env) as session:
        engine = Engine(session)
        assert engine.run([Transfer((parse_url(str(src)),), s3(bucket, "a"))])[0].ok
        before = session.stats.requests_sent
        [copied] = engine.run([Transfer((s3(bucket, "a"),), s3(bucket, "b"))])
        assert copied.ok, copied.error
        assert session.stats.requests_sent - before == 2  # PUT with x-amz-copy-source, HEAD
        [back] = engine.run([Transfer((s3(bucket, "b"),), parse_url(f"file://{tmp_path}/b"))])
    assert back.ok and (tmp_path / "b").read_bytes() == b"copy me"


def test_bad_secret_is_an_auth_error_not_retried_and_not_printed(minio, tmp_path, bucket):
    creds = tmp_path / "bad.conf"
    creds.write_text(f"[minio]\nendpoint = {minio.endpoint}\n[test@minio]\naccess_key = {minio.access_key}\n"
                     "secret_key = totally-wrong-secret-value\n")
    creds.chmod(0o600)
    env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path)}
    with Session(Settings(threads=1, max_attempts=3), env) as session:
        [result] = Engine(session).run([Transfer((s3(bucket, "x"),), parse_url(f"file://{tmp_path}/x"))])
    assert not result.ok and isinstance(result.error, AuthError)
    assert result.attempts == 1
    assert "totally-wrong-secret-value" not in str(result.error)
    assert not (tmp_path / "x").exists()


def test_tls_endpoint_verified_against_the_configured_ca(minio_tls, tmp_path):
    creds = minio_tls.write_pegasus_credentials(tmp_path / "tls.conf", site="minio", user="test")
    env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path)}
    with Session(Settings(threads=2, ca_bundle=str(minio_tls.ca_file)), env) as session:
        [made] = Engine(session).run([Mkdir(parse_url("s3s://test@minio/tlsbucket", site_label="minio"))])
        assert made.ok, made.error
    with Session(Settings(threads=2, max_attempts=1), env) as session:  # system CAs only
        [refused] = Engine(session).run([Mkdir(parse_url("s3://test@minio/tlsbucket2", site_label="minio"))])
    assert not refused.ok and isinstance(refused.error, RemoteError)
    assert "certificate verification failed" in str(refused.error)


def test_s3s_follows_a_plain_http_endpoint_with_one_warning(s3_env, bucket, caplog):
    """Both stock tools let the endpoint's scheme decide the transport; s3s:// warns once."""
    with Session(Settings(threads=1), s3_env) as session:
        results = Engine(session).run([Mkdir(parse_url(f"s3s://test@minio/{bucket}/d{i}", site_label="minio"))
                                       for i in range(3)])
    assert all(result.ok for result in results), [result.error for result in results]
    said = [r.getMessage() for r in caplog.records if "plain http" in r.getMessage()]
    assert len(said) == 1 and "s3s://" in said[0] and "http://" in said[0], said
