"""Bounded memory: peak RSS of a staging process, measured in a subprocess (real MinIO).

Members stream to their files, the gaps of merged ranges are never allocated, and an index
costs under 256 bytes per entry: every case stays within 64 MiB plus 256 B per index entry
(docs/bundles.md gives the measured figures)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys

import boto3
import pytest

from transfer.bundles.format import MAGIC

MiB = 1 << 20
EMPTY = hashlib.sha256(b"").hexdigest()
CHILD = r"""
import json, sys
from transfer import Engine, Session, Settings, Transfer, parse_url
def peak_rss():  # VmHWM starts afresh at exec; ru_maxrss would include the forking parent
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
plan = json.loads(sys.stdin.read())
with Session(Settings(threads=4, bundle=plan["bundle"]), plan["env"]) as session:
    results = Engine(session).run([Transfer((parse_url(s, site_label="minio"),), parse_url(d)) for s, d in plan["pairs"]])
print(json.dumps({"ok": [r.ok for r in results], "errors": [str(r.error) for r in results if not r.ok],
                  "peak": peak_rss()}))
"""


def write_bundle(path, rows, data_size, data_writer=None):
    """A bundle file of ``rows`` whose data area is ``data_size`` bytes (zeros unless written)."""
    index = json.dumps({"format": 1, "members": rows}, separators=(",", ":")).encode()
    with open(path, "wb") as out:
        out.write(MAGIC + struct.pack("<Q", len(index)) + index)
        if data_writer is not None:
            data_writer(out)
        else:
            out.truncate(16 + len(index) + data_size)
    return path


def zeros_sha(size):
    digest = hashlib.sha256()
    block = b"\0" * MiB
    for start in range(0, size, MiB):
        digest.update(block[:min(MiB, size - start)])
    return digest.hexdigest()


def stage(s3_env, bucket, names, dest, bundle=True):
    pairs = [(f"s3://test@minio/{bucket}/D/{n}", f"file://{dest}/{n}") for n in names]
    plan = {"env": s3_env, "bundle": bundle, "pairs": pairs}
    done = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(plan), capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PEGASUS_CLOUDIO_CACHE_DIR="off"))
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert all(found["ok"]), found["errors"]
    return found["peak"]


@pytest.fixture
def put(minio, bucket):
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")

    def upload(path, name):
        client.upload_file(str(path), bucket, f"D/.cloudio-bundles/{name}")
        os.unlink(path)

    return upload


def limit(entries):
    return 64 * MiB + 256 * entries


@pytest.mark.parametrize("bundle", [True, False])
def test_a_large_member_streams_to_its_file(s3_env, bucket, put, tmp_path, bundle):
    size = 100 * MiB
    put(write_bundle(tmp_path / "b.pcb", [["big", 0, size, zeros_sha(size)]], size), "b.pcb")
    peak = stage(s3_env, bucket, ["big"], tmp_path / "job", bundle=bundle)
    assert os.path.getsize(tmp_path / "job" / "big") == size
    print(f"one {size >> 20} MiB member, bundling {bundle}: peak RSS {peak / MiB:.1f} MiB")
    assert peak <= limit(1)


def test_members_at_both_ends_never_allocate_the_gap(s3_env, bucket, put, tmp_path):
    size = 100 * MiB
    rows = [["head", 0, 10, zeros_sha(10)], ["mid1", size // 2, 10, zeros_sha(10)],
            ["mid2", size // 2 + 60_000, 10, zeros_sha(10)], ["tail", size - 10, 10, zeros_sha(10)]]
    put(write_bundle(tmp_path / "b.pcb", rows, size), "b.pcb")
    peak = stage(s3_env, bucket, ["head", "mid1", "mid2", "tail"], tmp_path / "job")
    assert sorted(os.listdir(tmp_path / "job")) == ["head", "mid1", "mid2", "tail"]
    print(f"four 10-byte members spread over {size >> 20} MiB: peak RSS {peak / MiB:.1f} MiB")
    assert peak <= limit(4)


@pytest.mark.parametrize("bundles, per_bundle", [(1, 600_000), (4, 100_000)])
def test_large_indexes_cost_under_256_bytes_per_entry(s3_env, bucket, put, tmp_path, bundles, per_bundle):
    for b in range(bundles):
        rows = [[f"b{b}-member-{i:07d}.dat", 0, 0, EMPTY] for i in range(per_bundle)]
        put(write_bundle(tmp_path / f"{b}.pcb", rows, 0), f"{b:03d}.pcb")
    peak = stage(s3_env, bucket, ["b0-member-0000123.dat"], tmp_path / "job")
    assert (tmp_path / "job" / "b0-member-0000123.dat").read_bytes() == b""
    entries = bundles * per_bundle
    print(f"{bundles} x {per_bundle} members: peak RSS {peak / MiB:.1f} MiB ({peak / entries:.0f} B/entry)")
    assert peak <= limit(entries)
