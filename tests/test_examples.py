"""The examples: the Montage-shaped workflow generates (small scale), loads through the Pegasus
API and merges into a catalog set that still passes the checks; the custom-engine script
stages a task's data through real MinIO."""

import os
import subprocess
import sys
from pathlib import Path

import boto3
from Pegasus import replica_catalog, transformation_catalog, workflow

from pegasus_cloudio.sites import cli
from pegasus_cloudio.sites.check import check_set
from pegasus_cloudio.sites.templates import argv_for

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def catalog_set(name, out):
    args = cli._parser().parse_args(argv_for(name, str(out)))
    assert cli.main(args) == 0
    return cli.options_from_args(args)


def test_montage_like_workflow_at_small_scale(tmp_path):
    opts = catalog_set("s3-cloud-storage", tmp_path)
    done = subprocess.run([sys.executable, str(EXAMPLES / "montage_like" / "workflow.py"), "--catalogs", str(tmp_path),
                           "--producers", "3", "--files", "4", "--cluster-size", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "workflow.yml") as fh:
        wf = workflow.load(fh)
    producers = [j for j in wf.jobs.values() if j.transformation == "project"]
    [concat] = [j for j in wf.jobs.values() if j.transformation == "concat"]
    assert len(producers) == 3 and len(concat.get_inputs()) == 12
    assert {f.lfn for j in producers for f in j.get_outputs()} == {f.lfn for f in concat.get_inputs()}
    with open(tmp_path / "transformations.yml") as fh:
        tc = transformation_catalog.load(fh)
    assert tc.transformations["montage::project::None"].profiles["pegasus"]["clusters.size"] == "2"
    assert "pegasus::transfer::None" in tc.transformations
    with open(tmp_path / "replicas.yml") as fh:
        assert ("region.hdr", False) in replica_catalog.load(fh).entries
    assert check_set(str(tmp_path), opts) == []


def test_producer_script_writes_exactly_the_declared_outputs(tmp_path):
    (tmp_path / "region.hdr").write_text("SIMPLE = T\n")
    subprocess.run([str(EXAMPLES / "montage_like" / "bin" / "project.sh"), "region.hdr", "p0001", "3"],
                   cwd=tmp_path, check=True, timeout=60)
    assert sorted(p.name for p in tmp_path.glob("*.fits")) == ["p0001_000.fits", "p0001_001.fits", "p0001_002.fits"]
    subprocess.run([str(EXAMPLES / "montage_like" / "bin" / "concat.sh"), "fits.tbl"], cwd=tmp_path, check=True,
                   timeout=60)
    assert (tmp_path / "fits.tbl").read_text().count("p0001 ") == 3


def test_custom_engine_stages_a_task_on_minio(s3_env, bucket, minio, tmp_path):
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    for i in range(5):
        client.put_object(Bucket=bucket, Key=f"task/in/{i:03d}.txt", Body=b"w " * (i + 1))
    env = dict(s3_env, PATH=os.environ["PATH"])
    done = subprocess.run([sys.executable, str(EXAMPLES / "custom_engine" / "stage_task.py"), "--store",
                           f"s3://test@minio/{bucket}/task", "--work", str(tmp_path / "work"), "--count", "5"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    counts = client.get_object(Bucket=bucket, Key="task/counts.txt")["Body"].read().decode()
    assert counts.splitlines() == [f"{i:03d}.txt {i + 1}" for i in range(5)]
    missing = subprocess.run([sys.executable, str(EXAMPLES / "custom_engine" / "stage_task.py"), "--store",
                              f"s3://test@minio/{bucket}/task", "--work", str(tmp_path / "w2"), "--count", "6"],
                             env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "in/005.txt" in missing.stderr
    assert not (tmp_path / "w2" / "in" / "005.txt").exists() and not (tmp_path / "w2" / "counts.txt").exists()


def test_custom_engine_demo_runs_on_its_own_minio():
    done = subprocess.run([sys.executable, str(EXAMPLES / "custom_engine" / "stage_task.py"), "--demo", "--count", "3"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "uploaded s3://test@minio/demo-bucket/task1/counts.txt" in done.stdout


def test_p2p_library_example_shares_a_result_between_two_nodes(s3_env, bucket, tmp_path):
    from pegasus_cloudio_testbed.redis import RedisServer
    with RedisServer() as redis_server:
        env = dict(s3_env, PATH=os.environ["PATH"], PYTHONPATH=os.environ.get("PYTHONPATH", ""))
        done = subprocess.run([sys.executable, str(EXAMPLES / "p2p_library.py"), "--redis", redis_server.url,
                               "--store", f"s3://test@minio/{bucket}/p2p", "--work", str(tmp_path / "w")],
                              env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "node b: peer hits: 1, bytes from peers: 1048576" in done.stdout
    assert "holders: a/example\n" in done.stdout  # b registered its copy too, but runs no daemon: not alive
    assert "direct fetch: 1048576 bytes, sha256 verified: True" in done.stdout
    assert (tmp_path / "w" / "b" / "result.dat").read_bytes() == (tmp_path / "w" / "a" / "result.dat").read_bytes()
