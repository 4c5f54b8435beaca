"""Virtual-hosted S3 addressing end to end, as users run it: the installed drop-in, as a
subprocess, against MinIO routing ``Host: BUCKET.s3.us-west-2.amazonaws.com`` (MINIO_DOMAIN),
over http and over https with a wildcard certificate from a test CA.

The Amazon host names resolve to 127.0.0.1 through a hosts file bind-mounted over
/etc/hosts inside a private mount namespace (``unshare --mount``) that only the drop-in
process sees; the machine's own /etc/hosts is never touched. Every key of the corpus that
MinIO can store goes up and comes back byte-identical under its exact name.
"""

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest

from pegasus_cloudio_testbed.keys import key_corpus, minio_subset
from pegasus_cloudio_testbed.minio import MinioServer

DOMAIN = "s3.us-west-2.amazonaws.com"
DROPIN = [str(Path(sys.executable).with_name("pegasus-cloudio-transfer"))]
# A URL's trailing blanks are trimmed (pegasus-s3 strips them as well), so such keys are
# covered only by the conformance suite.
KEYS = minio_subset([k for k in key_corpus(1400) if k == k.rstrip()])


@pytest.fixture(scope="module", params=["http", "https"])
def server(request):
    with MinioServer(domain=DOMAIN, tls=request.param == "https") as minio:
        yield minio


def _in_namespace(hosts: Path, argv):
    """argv run with ``hosts`` as its /etc/hosts, in a mount namespace of its own."""
    assert shutil.which("unshare"), "unshare (util-linux) is needed for this test"
    return ["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts), *argv]


def _run(server, tmp_path, bucket, entries):
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost {DOMAIN} {bucket}.{DOMAIN}\n")
    scheme = "https" if server.tls else "http"
    creds = tmp_path / "credentials.conf"
    creds.write_text(f"[aws]\nendpoint = {scheme}://{DOMAIN}:{server.port}\nregion = us-west-2\n"
                     f"[test@aws]\naccess_key = {server.access_key}\nsecret_key = {server.secret_key}\n")
    creds.chmod(0o600)
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"], "PEGASUS_CREDENTIALS": str(creds),
           "PEGASUS_CLOUDIO_CONFIG": os.devnull, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    if server.ca_file:
        env["PEGASUS_CLOUDIO_CA_BUNDLE"] = str(server.ca_file)
    done = subprocess.run(_in_namespace(hosts, DROPIN), input=json.dumps(entries), env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _entry(number, src, dst, src_label, dst_label):
    return {"type": "transfer", "lfn": f"f{number}", "id": number,
            "src_urls": [{"site_label": src_label, "url": src}], "dest_urls": [{"site_label": dst_label, "url": dst}]}


def test_key_corpus_round_trips_through_virtual_hosted_addressing(server, tmp_path):
    bucket = f"vh-{uuid.uuid4().hex[:12]}"
    admin = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=server.access_key,
                         aws_secret_access_key=server.secret_key, region_name="us-east-1",
                         verify=str(server.ca_file) if server.ca_file else None)
    admin.create_bucket(Bucket=bucket)
    up, down = tmp_path / "up", tmp_path / "down"
    up.mkdir()
    down.mkdir()
    for number, key in enumerate(KEYS):
        (up / str(number)).write_bytes(f"{number}:{key}".encode())
    base = f"s3://test@aws/{bucket}/"
    _run(server, tmp_path, bucket, [_entry(n, f"file://{up}/{n}", base + key, "local", "aws")
                                    for n, key in enumerate(KEYS)])
    stored = {item["Key"] for page in admin.get_paginator("list_objects_v2").paginate(Bucket=bucket)
              for item in page.get("Contents", ())}
    assert stored == set(KEYS)  # exact names: nothing re-encoded, collapsed or cut
    _run(server, tmp_path, bucket, [_entry(n, base + key, f"file://{down}/{n}", "aws", "local")
                                    for n, key in enumerate(KEYS)])
    for number, key in enumerate(KEYS):
        assert (down / str(number)).read_bytes() == f"{number}:{key}".encode()


def test_corpus_is_mostly_storable_by_minio():
    assert len(KEYS) > 1000
