"""The JSON each staging mode's jobs hand to pegasus-transfer (from the spec and the planner
samples in shared/specs/planner-samples), run through the drop-in against real servers:
stage-in with ``generate_checksum`` and priorities, create-dir, PegasusLite ``file://$PWD``
inputs/outputs with ``checkpoint`` keys, stage-out with ``verify_checksum_remote``, per-file
cleanup and remove-dir ``recursive: "True"`` (also through the generated ``pegasus-transfer``
shim, the way create-dir/remove-dir jobs call it by name)."""

import hashlib
import json
import os
import subprocess
import sys
import uuid

import boto3

from pegasus_cloudio.sites import cli
from pegasus_cloudio.sites.templates import argv_for

OURS = [sys.executable, "-m", "pegasus_cloudio.dropin"]
RUN = "user/pegasus/pp/run0001"


def run(argv, spec, env, cwd, *args):
    done = subprocess.run(list(argv) + list(args), input=json.dumps(spec), env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def transfer(lfn, src, dst, *, linkage="input", **extra):
    return {"type": "transfer", "linkage": linkage, "lfn": lfn, "id": 1, **extra,
            "src_urls": src if isinstance(src, list) else [src], "dest_urls": [dst]}


def url(site, u, **extra):
    return {"site_label": site, "url": u, **extra}


def target(kind, site, u, **extra):
    return {"id": 1, "type": kind, "target": {"site_label": site, "url": u, **extra}}


def shim(tmp_path):
    """The `bin/pegasus-transfer` of a generated set whose drop-in is this checkout's."""
    out = tmp_path / "set"
    args = cli._parser().parse_args(argv_for("vm-storage", str(out)) + ["--install-bin", os.path.dirname(sys.executable)])
    assert cli.main(args) == 0
    return [str(out / "bin" / "pegasus-transfer")]


def meta_for(job_dir, lfn, data):
    (job_dir / f"{lfn}.job.meta").write_text(json.dumps([{"_id": lfn, "_type": "file", "_attributes": {
        "checksum.type": "sha256", "checksum.value": hashlib.sha256(data).hexdigest()}}]))


def test_cloud_storage_s3_job_sequence(s3_env, bucket, minio, tmp_path):
    env = dict(s3_env, PATH=os.environ["PATH"])
    scratch = f"s3://test@minio/{bucket}-scratch/scratch/{RUN}"
    inputs, job, outputs = tmp_path / "input", tmp_path / "job", tmp_path / "output"
    for d in (inputs, job, outputs):
        d.mkdir()
    (inputs / "f.a").write_bytes(b"raw input f.a\n")
    ks = tmp_path / "ks.yml"
    # create_dir_pp_0_s3staging: one mkdir, run by name (the shim) as the planner does
    run(shim(tmp_path), [target("mkdir", "s3staging", scratch)], env, tmp_path)
    # stage_in_local_s3staging_0_0: priorities, a missing higher-priority replica fails over
    stage_in = [transfer("f.a", [url("local", f"file://{inputs}/missing", priority=200),
                                 url("local", f"file://{inputs}/f.a", priority=100)],
                         url("s3staging", f"{scratch}/00/00/f.a"), generate_checksum=True)]
    run(OURS, stage_in, dict(env, KICKSTART_INTEGRITY_DATA=str(ks)), tmp_path, "--threads", "2")
    assert hashlib.sha256(b"raw input f.a\n").hexdigest() in ks.read_text()
    # preprocess_preprocess.sh: PegasusLite heredoc, $PWD destinations, checkpoint keys
    lite_in = [transfer("f.a", url("s3staging", f"{scratch}/00/00/f.a", checkpoint="false"),
                        url("condorpool", "file://$PWD/f.a"))]
    run(OURS, lite_in, dict(env, PWD=str(job)), job, "--threads", "1")
    (job / "f.b").write_bytes((job / "f.a").read_bytes().upper())
    lite_out = [transfer("f.b", url("condorpool", "file://$PWD/f.b", checkpoint="false"),
                         url("s3staging", f"{scratch}/00/00/f.b"), linkage="output")]
    run(OURS, lite_out, dict(env, PWD=str(job)), job, "--threads", "1")
    # stage_out_local_s3staging_0_0: verified against the job's .meta in the current directory
    meta_for(tmp_path, "f.b", b"RAW INPUT F.A\n")
    stage_out = [transfer("f.b", url("s3staging", f"{scratch}/00/00/f.b"), url("local", f"file://{outputs}/f.b"),
                          linkage="output", verify_checksum_remote=True)]
    err = run(OURS, stage_out, env, tmp_path, "--threads", "2")
    assert (outputs / "f.b").read_bytes() == b"RAW INPUT F.A\n" and '"succeeded": 1' in err
    # clean_up_s3staging_level_3_0, then cleanup_pp_0_s3staging (remove-dir, by name)
    run(OURS, [target("remove", "s3staging", f"{scratch}/00/00/f.a", recursive="False")], env, tmp_path)
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    listed = client.list_objects_v2(Bucket=f"{bucket}-scratch").get("Contents", [])
    assert [o["Key"] for o in listed] == [f"scratch/{RUN}/00/00/f.b"]
    run(shim(tmp_path), [target("remove", "s3staging", scratch, recursive="True")], env, tmp_path)
    assert client.list_objects_v2(Bucket=f"{bucket}-scratch").get("KeyCount") == 0


def test_vm_storage_sharedfs_job_sequence(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull}
    scratch = tmp_path / "shared" / "scratch" / RUN
    inputs, outputs = tmp_path / "input", tmp_path / "output"
    inputs.mkdir()
    (inputs / "f.a").write_bytes(b"vm input")
    run(OURS, [target("mkdir", "condorpool", f"file://{scratch}")], env, tmp_path)
    assert scratch.is_dir()
    stage_in = [transfer("f.a", url("local", f"file://{inputs}/f.a", priority=100),
                         url("condorpool", f"file://{scratch}/./f.a"), generate_checksum=True)]
    run(OURS, stage_in, dict(env, KICKSTART_INTEGRITY_DATA=str(tmp_path / "ks.yml")), tmp_path, "--threads", "2")
    assert (scratch / "f.a").read_bytes() == b"vm input"
    # pegasus.transfer.links=true: PegasusLite-style symlink:// destination on the same site
    run(OURS, [transfer("f.a", url("condorpool", f"file://{scratch}/f.a"), url("condorpool", f"symlink://{scratch}/l.a"))],
        env, tmp_path)
    assert os.readlink(scratch / "l.a") == f"{scratch}/f.a"
    (scratch / "f.b").write_bytes(b"vm output")
    run(OURS, [transfer("f.b", url("condorpool", f"file://{scratch}/./f.b"), url("local", f"file://{outputs}/f.b"),
                        linkage="output")], env, tmp_path, "--threads", "2")
    assert (outputs / "f.b").read_bytes() == b"vm output"
    run(OURS, [target("remove", "condorpool", f"file://{scratch}/./f.a", recursive="False")], env, tmp_path)
    assert not (scratch / "f.a").exists() and (scratch / "f.b").exists()
    run(shim(tmp_path), [target("remove", "condorpool", f"file://{scratch}", recursive="True")], env, tmp_path)
    assert not scratch.exists()


def _gs_keys(env, bucket, prefix):
    from transfer import Session, parse_url

    with Session(env=env) as session:
        base = parse_url(f"gs://{bucket}/{prefix}")
        return sorted(info.url.path.lstrip("/") for info in session.backend(base).list(base))


def test_cloud_storage_gcs_job_sequence(gcs_env, gcs_bucket, tmp_path):
    env = dict(gcs_env, PATH=os.environ["PATH"])
    scratch = f"gs://{gcs_bucket}-scratch/scratch/{RUN}"
    job, outputs = tmp_path / "job", tmp_path / "output"
    job.mkdir()
    (tmp_path / "f.a").write_bytes(b"gcs input")
    run(shim(tmp_path), [target("mkdir", "gcsstaging", scratch)], env, tmp_path)
    run(OURS, [transfer("f.a", url("local", f"file://{tmp_path}/f.a", priority=100), url("gcsstaging", f"{scratch}/00/00/f.a"),
                        generate_checksum=True)], dict(env, KICKSTART_INTEGRITY_DATA=str(tmp_path / "ks.yml")), tmp_path)
    run(OURS, [transfer("f.a", url("gcsstaging", f"{scratch}/00/00/f.a", checkpoint="false"), url("condorpool", "file://$PWD/f.a"))],
        dict(env, PWD=str(job)), job, "--threads", "1")
    (job / "f.b").write_bytes((job / "f.a").read_bytes() + b"!")
    run(OURS, [transfer("f.b", url("condorpool", "file://$PWD/f.b", checkpoint="false"), url("gcsstaging", f"{scratch}/00/00/f.b"),
                        linkage="output")], dict(env, PWD=str(job)), job, "--threads", "1")
    meta_for(tmp_path, "f.b", b"gcs input!")
    err = run(OURS, [transfer("f.b", url("gcsstaging", f"{scratch}/00/00/f.b"), url("local", f"file://{outputs}/f.b"),
                              linkage="output", verify_checksum_remote=True)], env, tmp_path)
    assert (outputs / "f.b").read_bytes() == b"gcs input!" and '"succeeded": 1' in err
    run(OURS, [target("remove", "gcsstaging", f"{scratch}/00/00/f.a", recursive="False")], env, tmp_path)
    assert _gs_keys(env, f"{gcs_bucket}-scratch", "scratch") == [f"scratch/{RUN}/00/00/f.b"]
    run(shim(tmp_path), [target("remove", "gcsstaging", scratch, recursive="True")], env, tmp_path)
    assert _gs_keys(env, f"{gcs_bucket}-scratch", "scratch") == []


def test_submit_host_scp_job_sequence(ssh_env, ssh_base, ssh_remote_dir, tmp_path):
    env = dict(ssh_env, PATH=os.environ["PATH"])
    scratch, remote = f"{ssh_base}/scratch/{RUN}", os.path.join(ssh_remote_dir, "scratch", RUN)
    job, outputs = tmp_path / "job", tmp_path / "output"
    job.mkdir()
    (tmp_path / "f.a").write_bytes(b"scp input")
    (tmp_path / "worker.tar.gz").write_bytes(b"worker package")
    run(shim(tmp_path), [target("mkdir", "local", scratch)], env, tmp_path)
    assert os.path.isdir(remote)
    # stage_worker_local_*: the planner writes scp://user@host//abs/path (double slash)
    host = ssh_base.split("/")[2]
    run(shim(tmp_path), [transfer("pegasus::worker", url("local", f"file://{tmp_path}/worker.tar.gz"),
                                  url("local", f"scp://{host}/{remote}/worker.tar.gz"))], env, tmp_path, "--threads", "2")
    # stage_in_remote_local_0_0: both ends are site "local"
    run(OURS, [transfer("f.a", url("local", f"file://{tmp_path}/f.a", priority=100), url("local", f"{scratch}/00/00/f.a"),
                        generate_checksum=True)], dict(env, KICKSTART_INTEGRITY_DATA=str(tmp_path / "ks.yml")), tmp_path)
    run(OURS, [transfer("f.a", url("local", f"{scratch}/00/00/f.a", checkpoint="false"), url("condorpool", "file://$PWD/f.a"))],
        dict(env, PWD=str(job)), job, "--threads", "1")
    (job / "f.b").write_bytes((job / "f.a").read_bytes()[::-1])
    run(OURS, [transfer("f.b", url("condorpool", "file://$PWD/f.b", checkpoint="false"), url("local", f"{scratch}/00/00/f.b"),
                        linkage="output")], dict(env, PWD=str(job)), job, "--threads", "1")
    meta_for(tmp_path, "f.b", b"scp input"[::-1])
    err = run(OURS, [transfer("f.b", url("local", f"{scratch}/00/00/f.b"), url("local", f"file://{outputs}/f.b"),
                              linkage="output", verify_checksum_remote=True)], env, tmp_path)
    assert (outputs / "f.b").read_bytes() == b"scp input"[::-1] and '"succeeded": 1' in err
    run(OURS, [target("remove", "local", f"{scratch}/00/00/f.a", recursive="False")], env, tmp_path)
    assert sorted(os.listdir(os.path.join(remote, "00", "00"))) == ["f.b"]
    assert open(os.path.join(remote, "worker.tar.gz"), "rb").read() == b"worker package"
    run(shim(tmp_path), [target("remove", "local", scratch, recursive="True")], env, tmp_path)
    # Every file is gone. (Empty directories may stay while the engine expands recursive removes
    # of non-local backends into file deletes; the stock tool runs `rm -rf` here.)
    assert [f for _root, _dirs, files in os.walk(remote) for f in files] == []


def test_pegasus_030_pegasuslite_s3_over_plain_http(minio, tmp_path):
    """Pegasus's test/core/030-pegasuslite-s3: its scratch is ``s3s://test@amazon/...`` and its
    outputs ``s3://``, with input ``f.a`` = "Hello world!"; on a site whose endpoint is plain
    http both stock tools send ``s3s://`` over http, and so do we, with one warning line."""
    creds = minio.write_pegasus_credentials(tmp_path / "credentials-s3.conf", site="amazon", user="test")
    env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
           "AWS_EC2_METADATA_DISABLED": "true", "PATH": os.environ["PATH"]}
    root = f"b030-{uuid.uuid4().hex[:12]}"
    scratch = f"s3s://test@amazon/{root}/bamboo-030-pegasuslite-s3/scratch/{RUN}"
    outputs = f"s3://test@amazon/{root}/bamboo-030-pegasuslite-s3/outputs"
    (tmp_path / "f.a").write_text("Hello world!\n")
    job = tmp_path / "job"
    job.mkdir()
    said = run(OURS, [target("mkdir", "staging_site", scratch)], env, tmp_path)  # create_dir
    warned = [line for line in said.splitlines() if "plain http" in line]
    assert len(warned) == 1 and warned[0].startswith("s3s:// test@amazon: the endpoint http://"), said
    run(OURS, [transfer("f.a", url("local", f"file://{tmp_path}/f.a"), url("staging_site", f"{scratch}/f.a"))],
        env, tmp_path)  # stage_in_local_staging_site
    run(OURS, [transfer("f.a", url("staging_site", f"{scratch}/f.a"), url("condor_pool", f"file://{job}/f.a"))],
        env, job)  # PegasusLite stage-in of preprocess
    assert (job / "f.a").read_text() == "Hello world!\n"
    (job / "f.b1").write_text("preprocess output\n")
    run(OURS, [transfer("f.b1", url("condor_pool", f"file://{job}/f.b1"), url("staging_site", f"{scratch}/f.b1"),
                        linkage="output")], env, job)
    run(OURS, [transfer("f.b1", url("staging_site", f"{scratch}/f.b1"), url("staging_site", f"{outputs}/f.b1"))],
        env, tmp_path)  # stage-out to the staging site's outputs (s3s:// to s3://, one endpoint)
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    got = client.get_object(Bucket=root, Key="bamboo-030-pegasuslite-s3/outputs/f.b1")["Body"].read()
    assert got == b"preprocess output\n"
