"""Stale multipart uploads: the engine's aborts are retried, the next upload of a key aborts
what a killed store left open, and ``lsup``/``rmup`` list and remove what a killed client or
server left (real MinIO)."""

import contextlib
import os
import subprocess
import sys
import threading
import time
from urllib.parse import parse_qsl, unquote

import boto3

from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.ports import free_port
from pegasus_cloudio_testbed.proxy import Fault, Shaping, TcpProxy
from pegasus_cloudio_testbed.relay import RawRelay
from pegasus_cloudio_testbed.scripted import Reply, ScriptedServer
from transfer import Engine, RetryPolicy, Session, Settings, Transfer, parse_url
from transfer.uploads import ABORT_ATTEMPTS
from waiting import wait_for

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


# --------------------------------------------------------------------------- uploads a killed store left


@contextlib.contextmanager
def killable_store(tmp_path):
    """(store, relay, env, s3): a MinIO of its own (it is killed), reached through a relay the
    test points at the restarted store's new port, behind a proxy capped at 40 MB/s so that an
    upload is still sending when the store is killed."""
    with MinioServer() as store, RawRelay((store.host, store.port)) as relay, \
            TcpProxy(relay.address, shaping=Shaping(rate_bps=40e6)) as proxy:
        creds = store.write_pegasus_credentials(tmp_path / "killable.conf", site="minio", user="test",
                                                endpoint=proxy.url())
        env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
               "AWS_EC2_METADATA_DISABLED": "true"}
        client(store).create_bucket(Bucket="bkt")
        yield store, relay, env


def open_uploads(store, key):
    """The uploads of ``key`` (MinIO lists those it knew before a restart for the whole key only)."""
    found = client(store).list_multipart_uploads(Bucket="bkt", Prefix=key).get("Uploads", [])
    return sorted(u["UploadId"] for u in found if u["Key"] == key)


def upload_killing_the_store(store, relay, env, src, key, settings):
    """Run one upload of ``src`` in a thread; once the upload is open, cut its connections and
    kill the store (restart: new ports, same data), point the relay at the new store, and
    return the run's result.
    The engine's waits: the first ones (its retries of the abort, while the relay still points
    at the dead store) pass at once; the later ones (before the file's next attempts) last until
    the relay points at the new store, so a run with a few attempts to spare completes."""
    results, back, waits = [], threading.Event(), []

    def sleep(seconds):
        waits.append(seconds)
        if len(waits) >= ABORT_ATTEMPTS:
            assert back.wait(120)

    def run():
        with Session(settings, env) as session:
            results.extend(Engine(session, sleep=sleep).run(
                [Transfer((parse_url(str(src)),), parse_url(f"s3://test@minio/bkt/{key}", site_label="minio"))]))
    worker = threading.Thread(target=run)
    worker.start()
    wait_for(lambda: open_uploads(store, key), timeout=60, what="the upload to open")
    relay.target = ("127.0.0.1", free_port())  # nothing listens there: the store is gone ...
    assert relay.drop_connections() > 0  # ... in the middle of the upload, as a crash would
    store.restart()
    relay.target = (store.host, store.port)
    back.set()
    worker.join(120)
    assert not worker.is_alive()
    return results[0]


def test_an_upload_cut_by_a_store_crash_is_aborted_by_the_retry_that_succeeds(tmp_path):
    """The run's own upload, stranded while the store was down, is aborted by the file's next
    attempt (its age does not matter: this engine started it)."""
    src = tmp_path / "big.dat"
    src.write_bytes(os.urandom(120 * MiB))
    with killable_store(tmp_path) as (store, relay, env):
        settings = Settings(threads=2, multipart_threshold=8 * MiB, multipart_part_size=8 * MiB, max_attempts=6)
        result = upload_killing_the_store(store, relay, env, src, "run/big.dat", settings)
        assert result.ok, result.error
        left = client(store).list_multipart_uploads(Bucket="bkt", Prefix="run/big.dat").get("Uploads", [])
        assert left == [], (left, [(a.error, a.seconds) for a in result.history])
        assert client(store).head_object(Bucket="bkt", Key="run/big.dat")["ContentLength"] == 120 * MiB


def test_an_upload_a_failed_run_left_is_aborted_by_the_next_run_once_old_enough(tmp_path):
    """A run that failed while the store was down leaves its upload open; the next run of the
    same key leaves it alone while it may be another writer's (younger than the orphan age),
    and aborts it once it is older."""
    src = tmp_path / "big.dat"
    src.write_bytes(os.urandom(120 * MiB))
    with killable_store(tmp_path) as (store, relay, env):
        settings = Settings(threads=2, multipart_threshold=8 * MiB, multipart_part_size=8 * MiB,
                            max_attempts=1)
        result = upload_killing_the_store(store, relay, env, src, "run/big.dat", settings)
        assert not result.ok
        [left] = open_uploads(store, "run/big.dat")
        small = settings.replace(multipart_threshold=5 * MiB, multipart_part_size=5 * MiB, max_attempts=3)
        (tmp_path / "next.dat").write_bytes(os.urandom(6 * MiB))
        up = Transfer((parse_url(str(tmp_path / "next.dat")),),
                      parse_url("s3://test@minio/bkt/run/big.dat", site_label="minio"))
        with Session(small, env) as session:
            assert Engine(session).run([up])[0].ok
        assert open_uploads(store, "run/big.dat") == [left]  # young: maybe another writer's
        with Session(small.replace(multipart_orphan_age=0.0), env) as session:
            assert Engine(session).run([up])[0].ok
        assert open_uploads(store, "run/big.dat") == []


def test_rmup_older_than_spares_younger_uploads(s3_env, bucket, minio, tmp_path):
    s3 = client(minio)
    old = orphan(s3, bucket, "a/old.dat")
    wait_for(lambda: time.time() - s3.list_multipart_uploads(Bucket=bucket, Prefix="a/old.dat")["Uploads"][0][
        "Initiated"].timestamp() > 2.5, timeout=30, what="the first upload to be 3 s old")
    young = orphan(s3, bucket, "a/young.dat")
    rc, out, err = cli(["rmup", "-a", "--older-than", "2s", f"s3://test@minio/{bucket}/a/"], s3_env, tmp_path)
    assert rc == 0, err
    assert [u for _, u in uploads(s3, bucket)] == [young] and old != young
    rc, out, err = cli(["rmup", "-a", "--older-than", "soon", f"s3://test@minio/{bucket}/a/"], s3_env, tmp_path)
    assert rc != 0 and len(err.strip().splitlines()) == 1 and "--older-than 'soon'" in err
