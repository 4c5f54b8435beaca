"""Checksums sent on upload (issue 33), so that ``info``'s checksum describes the content end to
end: an S3 single PUT sends the full-object ``x-amz-checksum-crc32`` (with its Content-MD5), a
GCS single upload the CRC32C in its metadata. A body corrupted on the way (one bit, same length,
by the fault proxy) is refused by the store: MinIO (400 BadDigest; it checks the Content-MD5
and the CRC32) and fake-gcs-server (400, the CRC32C). A GCS resumable upload sends the CRC32C in
``x-goog-hash`` with its last chunk, which fake-gcs-server does not check: there the CRC32C of
its answer refuses it and the object is removed. Nothing is left under the name."""

from __future__ import annotations

import base64
import binascii
import os
import uuid
import zlib

import google_crc32c
import pytest

from pegasus_cloudio_testbed.proxy import Fault
from transfer import ChecksumMismatch, Session, Settings, TransferError, parse_url
from transfer.client import Client

pytest_plugins = ["fixtures_gcs"]
ONCE = dict(max_attempts=1)


def _crc32(data: bytes) -> str:
    return binascii.b2a_base64(zlib.crc32(data).to_bytes(4, "big"), newline=False).decode()


def _crc32c(data: bytes) -> str:
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode()


def test_s3_single_puts_store_the_full_object_crc32(minio) -> None:
    data = os.urandom(5000)
    with Client(endpoint_url=minio.endpoint, key=minio.access_key, secret=minio.secret_key, env={}) as client:
        where = f"s3://u-{uuid.uuid4().hex[:12]}"
        client.mkdir(where)
        client.write_bytes(f"{where}/a", data)
        assert client.info(f"{where}/a").checksum == f"crc32:{_crc32(data)}"


def test_s3_a_body_corrupted_on_the_way_is_refused_by_the_store(proxied, tmp_path) -> None:
    proxy, env = proxied
    data = os.urandom(200_000)
    (tmp_path / "f").write_bytes(data)
    bucket = f"u-{uuid.uuid4().hex[:12]}"
    url = parse_url(f"s3://test@minio/{bucket}/k")
    with Session(Settings(**ONCE), env) as session:
        backend = session.backend(url)
        backend.make_dirs(url)
        proxy.set_faults([Fault.corrupt(method="PUT", path="/k")])
        with pytest.raises(TransferError) as refused:
            backend.put(str(tmp_path / "f"), url)
        assert proxy.pending_faults() == 0 and getattr(refused.value, "status", None) == 400
        assert not list(backend.list(parse_url(f"s3://test@minio/{bucket}/")))
        backend.put(str(tmp_path / "f"), url)  # the same, uncorrupted, is stored
        assert backend.stat(url).size == len(data)


def test_gcs_single_uploads_carry_crc32c_and_a_corrupted_one_is_not_left(gcs_proxied, gcs_bucket, tmp_path) -> None:
    proxy, env = gcs_proxied
    data = os.urandom(200_000)
    (tmp_path / "f").write_bytes(data)
    url = parse_url(f"gs://{gcs_bucket}/k")
    with Session(Settings(**ONCE), env) as session:
        backend = session.backend(url)
        proxy.set_faults([Fault.corrupt(100_000, method="POST", path="/upload/")])  # in the file's bytes
        with pytest.raises(TransferError, match=f"gs://{gcs_bucket}/k: HTTP 400: provided CRC32C") as refused:
            backend.put(str(tmp_path / "f"), url)
        assert proxy.pending_faults() == 0 and getattr(refused.value, "status", None) == 400
        assert not list(backend.list(parse_url(f"gs://{gcs_bucket}/")))
        backend.put(str(tmp_path / "f"), url)
    with Client(env=env) as client:
        assert client.info(f"gs://{gcs_bucket}/k").checksum == f"crc32c:{_crc32c(data)}"


def test_gcs_resumable_uploads_send_crc32c_with_the_last_chunk_and_a_corrupted_one_is_not_left(
        gcs_proxied, gcs_bucket, tmp_path) -> None:
    proxy, env = gcs_proxied
    data = os.urandom(6 << 20)  # two chunks
    (tmp_path / "f").write_bytes(data)
    url = parse_url(f"gs://{gcs_bucket}/big")
    settings = Settings(multipart_threshold=5 << 20, multipart_part_size=5 << 20, **ONCE)
    with Session(settings, env) as session:
        backend = session.backend(url)
        proxy.set_faults([Fault.corrupt(1000, method="PUT", path="upload_id=")])
        # fake-gcs-server checks no x-goog-hash on a resumable upload (GCS refuses a mismatch):
        # it stores the bytes, and the crc32c it answers with is what refuses them here
        with pytest.raises(ChecksumMismatch, match=f"gs://{gcs_bucket}/big"):
            backend.put(str(tmp_path / "f"), url)
        assert proxy.pending_faults() == 0
        assert not list(backend.list(parse_url(f"gs://{gcs_bucket}/")))
        backend.put(str(tmp_path / "f"), url)
        assert backend.stat(url).attributes.checksum == f"crc32c:{_crc32c(data)}"
