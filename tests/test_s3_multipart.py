"""Multipart uploads verified end to end (real MinIO): the upload is declared FULL_OBJECT, the
whole object's CRC32 (combined from the parts') goes with CompleteMultipartUpload, the store
keeps it, refuses a wrong one, and a download is checked against it as a single PUT's is."""

import base64
import os
import random
import zlib

import boto3
import pytest

from transfer import Engine, Session, Settings, Transfer, parse_url
from transfer.backends._s3_multipart import combined_crc32
from transfer.errors import ChecksumMismatch, TransferError
from transfer.fsspec_streams import PartStream

MiB = 1 << 20
SETTINGS = Settings(threads=3, multipart_threshold=5 * MiB, multipart_part_size=5 * MiB, max_attempts=1)


def s3(bucket, key):
    return parse_url(f"s3://test@minio/{bucket}/{key}", site_label="minio")


def b64_crc32(data):
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def client(minio):
    return boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                        aws_secret_access_key=minio.secret_key, region_name="us-east-1")


def test_combined_crc32_is_zlibs_crc32_of_the_concatenation():
    rng = random.Random(33)
    for _ in range(50):
        pieces = [rng.randbytes(rng.choice([0, 1, 7, 64, 1000, 4099])) for _ in range(rng.randint(1, 6))]
        assert combined_crc32([(zlib.crc32(p), len(p)) for p in pieces]) == zlib.crc32(b"".join(pieces))


def test_a_multipart_upload_stores_the_whole_objects_crc32(s3_env, bucket, tmp_path, minio):
    data = os.urandom(12 * MiB + 5)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    with Session(SETTINGS, s3_env) as session:
        engine = Engine(session)
        [up] = engine.run([Transfer((parse_url(str(src)),), s3(bucket, "big.bin"))])
        assert up.ok, up.error
        backend = session.backend(s3(bucket, "big.bin"))
        assert backend.stat(s3(bucket, "big.bin")).attributes.checksum == f"crc32:{b64_crc32(data)}"
        stream = backend.open_read(s3(bucket, "big.bin"))  # a download is checked by the CRC32
        try:
            assert stream.check is not None and stream.check.name == "crc32"
        finally:
            stream.close()
        [down] = engine.run([Transfer((s3(bucket, "big.bin"),), parse_url(f"file://{tmp_path}/back.bin"))])
        assert down.ok, down.error
    assert (tmp_path / "back.bin").read_bytes() == data
    head = client(minio).head_object(Bucket=bucket, Key="big.bin", ChecksumMode="ENABLED")
    assert head["ChecksumType"] == "FULL_OBJECT" and head["ChecksumCRC32"] == b64_crc32(data)
    assert head["ETag"].strip('"').endswith("-3")


def test_a_streamed_upload_stores_the_whole_objects_crc32(s3_env, bucket, minio):
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(123)]
    with Session(SETTINGS, s3_env) as session:
        url = s3(bucket, "streamed.bin")
        stream = PartStream(session.backend(url), url, in_flight=2)
        for part in parts:
            stream.send(part)
        stream.finish()
    head = client(minio).head_object(Bucket=bucket, Key="streamed.bin", ChecksumMode="ENABLED")
    assert head["ChecksumType"] == "FULL_OBJECT" and head["ChecksumCRC32"] == b64_crc32(b"".join(parts))


def test_the_store_refuses_a_whole_object_crc32_its_parts_do_not_make(s3_env, bucket, minio):
    """A receipt naming another length makes another whole-object CRC32: the store's own
    combination of the parts it checked differs, and it refuses to assemble them."""
    part = os.urandom(5 * MiB)
    with Session(SETTINGS, s3_env) as session:
        url = s3(bucket, "wrong.bin")
        backend = session.backend(url)
        upload_id = backend.start_upload(url)
        receipts = [backend.upload_part(url, upload_id, n, part) for n in (1, 2)]
        etag, crc, length = receipts[1].split("\n")
        with pytest.raises(TransferError) as refused:
            backend.complete_upload(url, upload_id, [receipts[0], f"{etag}\n{crc}\n{int(length) - 1}"])
        assert not isinstance(refused.value, ChecksumMismatch)  # the store's refusal, not our HEAD's check
        backend.abort_upload(url, upload_id)
    assert "Contents" not in client(minio).list_objects_v2(Bucket=bucket, Prefix="wrong.bin")
