"""pegasus-cloudio-transfer as PegasusLite and stage-in jobs run it: real processes, real MinIO."""

import hashlib
import json
import os
import stat
import subprocess
import sys

from inotify_support import stats_opens
from pegasus_cloudio.dropin.main import effective_threads

OURS = [sys.executable, "-m", "pegasus_cloudio.dropin"]


def run(spec, env, cwd, *args):
    """Run the drop-in on ``spec``: the code under test is found as in this process (its
    PYTHONPATH, e.g. a worktree's), unless ``env`` sets a PYTHONPATH of its own (a shim)."""
    env = dict(env, PATH=os.environ["PATH"])
    env.setdefault("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(OURS + list(args), input=spec, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    return done.returncode, done.stderr


def transfer(src, dst, lfn, src_label="local", dst_label="minio", **extra):
    return {"type": "transfer", "lfn": lfn, "id": 1, "src_urls": [{"site_label": src_label, "url": src}],
            "dest_urls": [{"site_label": dst_label, "url": dst}], **extra}


def test_empty_input_succeeds(tmp_path):
    rc, err = run("[]", {"HOME": str(tmp_path)}, tmp_path)
    assert rc == 0 and "All transfers completed successfully." in err


def test_group_readable_credentials_abort_with_the_fix(tmp_path):
    creds = tmp_path / "c.conf"
    creds.write_text("[x]\n")
    creds.chmod(0o644)
    rc, err = run("[]", {"HOME": str(tmp_path), "PEGASUS_CREDENTIALS": str(creds)}, tmp_path)
    assert rc == 1 and f"chmod 600 {creds}" in err


def test_thread_precedence():
    assert effective_threads(1, {"PEGASUS_CLOUDIO_THREADS": "16"}) == 16
    assert effective_threads(4, {"PEGASUS_TRANSFER_THREADS": "2"}) == 4
    assert effective_threads(0, {"PEGASUS_TRANSFER_THREADS": "2"}) == 2
    assert effective_threads(0, {}) == 8


def test_stage_in_with_generate_checksum_writes_integrity_data(s3_env, bucket, tmp_path):
    (tmp_path / "f.a").write_bytes(b"raw input")
    kickstart = tmp_path / "ks.yml"
    multipart = tmp_path / "multipart"
    multipart.mkdir()
    env = dict(s3_env, KICKSTART_INTEGRITY_DATA=str(kickstart), PEGASUS_MULTIPART_DIR=str(multipart))
    spec = json.dumps([transfer(f"file://{tmp_path}/f.a", f"s3://test@minio/{bucket}/run/f.a", "f.a",
                                generate_checksum=True, linkage="input")])
    rc, err = run(spec, env, tmp_path)
    assert rc == 0, err
    text = kickstart.read_text()
    assert '"f.a":' in text and hashlib.sha256(b"raw input").hexdigest() in text
    [record] = os.listdir(multipart)
    assert 'lfn: "f.a"' in (multipart / record).read_text()


def test_stage_out_verifies_against_meta_and_reports_the_metric(s3_env, bucket, tmp_path):
    (tmp_path / "out.dat").write_bytes(b"job output")
    good = hashlib.sha256(b"job output").hexdigest()
    put = json.dumps([transfer(f"file://{tmp_path}/out.dat", f"s3://test@minio/{bucket}/out.dat", "out.dat")])
    assert run(put, s3_env, tmp_path)[0] == 0
    get = json.dumps([transfer(f"s3://test@minio/{bucket}/out.dat", f"file://{tmp_path}/final/out.dat", "out.dat",
                               src_label="minio", dst_label="local", verify_checksum_remote=True, linkage="output")])
    meta = tmp_path / "job.meta"
    meta.write_text(json.dumps([{"_id": "out.dat", "_type": "file",
                                 "_attributes": {"checksum.type": "sha256", "checksum.value": good}}]))
    rc, err = run(get, s3_env, tmp_path)
    assert rc == 0, err
    assert '"succeeded": 1' in err and "@@@MONITORING_PAYLOAD - START@@@" in err
    meta.write_text(json.dumps([{"_id": "out.dat", "_type": "file",
                                 "_attributes": {"checksum.type": "sha256", "checksum.value": "0" * 64}}]))
    rc, err = run(get, s3_env, tmp_path, "-m", "2")
    assert rc == 1 and '"succeeded": 0, "failed": 2' in err, err  # stock counts every attempt's check


def test_unsupported_scheme_without_stock_tool_fails_clearly_but_runs_the_rest(tmp_path):
    (tmp_path / "a").write_bytes(b"a")
    spec = json.dumps([transfer(f"file://{tmp_path}/a", f"file://{tmp_path}/b", "a", dst_label="local"),
                       transfer("gsiftp://host/data/x", f"file://{tmp_path}/x", "x", dst_label="local")])
    rc, err = run(spec, {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, tmp_path)
    assert rc == 1 and "gsiftp" in err and "PEGASUS_CLOUDIO_STOCK_TRANSFER" in err
    assert (tmp_path / "b").read_bytes() == b"a"


def test_unsupported_entries_go_to_the_stock_tool_in_one_call(tmp_path):
    log = tmp_path / "calls.log"
    fake = tmp_path / "stock-transfer"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\ncat \"$2\" >> {log}\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    spec = json.dumps([transfer("gsiftp://host/x", f"file://{tmp_path}/x", "x", dst_label="local"),
                       transfer("webdavs://host/y", f"file://{tmp_path}/y", "y", dst_label="local")])
    rc, err = run(spec, {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_STOCK_TRANSFER": str(fake)}, tmp_path,
                  "--threads", "3")
    assert rc == 0, err
    args, payload = log.read_text().split("\n", 1)
    assert args.startswith("-f ") and "--threads 3" in args
    assert [e["lfn"] for e in json.loads(payload)] == ["x", "y"]


def test_mixed_list_mkdir_transfer_remove(s3_env, bucket, tmp_path):
    (tmp_path / "in").write_bytes(b"1")
    spec = json.dumps([
        {"type": "mkdir", "target": {"site_label": "minio", "url": f"s3://test@minio/{bucket}-new/run"}},
        transfer(f"file://{tmp_path}/in", f"s3://test@minio/{bucket}-new/run/in", "in"),
        {"type": "remove", "target": {"site_label": "local", "url": f"file://{tmp_path}/in", "recursive": "False"}}])
    rc, err = run(spec, s3_env, tmp_path)
    assert rc == 0, err
    assert not (tmp_path / "in").exists()


def test_a_local_destination_failing_its_checksum_is_not_left_under_its_name(tmp_path):
    (tmp_path / "out.dat").write_bytes(b"job output")
    (tmp_path / "job.meta").write_text(json.dumps([{"_id": "out.dat", "_type": "file", "_attributes": {
        "checksum.type": "sha256", "checksum.value": "0" * 64}}]))
    env = {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CACHE_DIR": "off", "PEGASUS_CLOUDIO_CONFIG": os.devnull}
    for dest, kept in (("final/out.dat", False), ("out.dat", True)):  # the second is the source itself
        spec = json.dumps([transfer(f"file://{tmp_path}/out.dat", f"file://{tmp_path}/{dest}", "out.dat",
                                    dst_label="local", verify_checksum_remote=True, linkage="output")])
        rc, err = run(spec, env, tmp_path, "-m", "2")
        assert rc == 1 and '"succeeded": 0, "failed": 2' in err, err  # one failed check per attempt
        assert (tmp_path / dest).exists() is kept, dest
    assert (tmp_path / "out.dat").read_bytes() == b"job output"


def test_every_attempt_of_a_transfer_failing_its_checksum_is_recorded(tmp_path):
    """Each re-run after a failed check is an attempt in the transfer_attempts record monitord
    reads, as in stock pegasus-transfer (two attempts with -m 2), not only the last one."""
    (tmp_path / "out.dat").write_bytes(b"job output")
    (tmp_path / "job.meta").write_text(json.dumps([{"_id": "out.dat", "_type": "file", "_attributes": {
        "checksum.type": "sha256", "checksum.value": "0" * 64}}]))
    (tmp_path / "multipart").mkdir()
    env = {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CACHE_DIR": "off", "PEGASUS_CLOUDIO_CONFIG": os.devnull,
           "PEGASUS_MULTIPART_DIR": str(tmp_path / "multipart")}
    spec = json.dumps([transfer(f"file://{tmp_path}/out.dat", f"file://{tmp_path}/final/out.dat", "out.dat",
                                dst_label="local", verify_checksum_remote=True, linkage="output")])
    rc, err = run(spec, env, tmp_path, "-m", "2")
    assert rc == 1, err
    [record] = os.listdir(tmp_path / "multipart")
    assert (tmp_path / "multipart" / record).read_text().count("  - src_url: ") == 2


def test_a_space_or_non_ascii_letter_in_an_http_url_is_sent_percent_encoded_like_wget(tmp_path):
    """Stock pegasus-transfer runs wget, which sends ``/a b/ü.txt`` as ``/a%20b/%C3%BC.txt`` and a
    ``%`` that starts no escape as ``%25``; an existing escape (``%25``) goes out unchanged."""
    from pegasus_cloudio_testbed.scripted import Reply, ScriptedServer
    env = {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CACHE_DIR": "off", "PEGASUS_CLOUDIO_CONFIG": os.devnull}
    with ScriptedServer(lambda req: Reply(200, {}, b"data")) as server:
        spec = json.dumps([transfer(f"{server.endpoint}/{name}", f"file://{tmp_path}/out{i}", f"out{i}",
                                    src_label="web", dst_label="local")
                           for i, name in enumerate(("a b/ü.txt", "p%25q.txt", "100%.txt"))])
        rc, err = run(spec, env, tmp_path)
        assert rc == 0, err
        assert sorted(r.target for r in server.requests if r.method == "GET") == [
            "/100%25.txt", "/a%20b/%C3%BC.txt", "/p%25q.txt"]
    assert (tmp_path / "out0").read_bytes() == b"data"


def test_stage_out_verification_pulls_the_object_back_from_the_store_even_when_uploads_are_cached(
        proxied, bucket, tmp_path):
    """With uploads written through to the node cache, the pull-back must still read the store:
    reading the cache entry (the uploaded file itself) would verify nothing."""
    proxy, env = proxied
    (tmp_path / "out.dat").write_bytes(b"job output")
    (tmp_path / "job.meta").write_text(json.dumps([{"_id": "out.dat", "_type": "file", "_attributes": {
        "checksum.type": "sha256", "checksum.value": hashlib.sha256(b"job output").hexdigest()}}]))
    env = dict(env, AWS_EC2_METADATA_DISABLED="true", PEGASUS_CLOUDIO_CACHE_DIR=str(tmp_path / "cache"),
               PEGASUS_CLOUDIO_CACHE_UPLOADS="on")
    spec = json.dumps([transfer(f"file://{tmp_path}/out.dat", f"s3://test@minio/{bucket}/out.dat", "out.dat",
                                verify_checksum_remote=True, linkage="output")])
    rc, err = run(spec, env, tmp_path)
    assert rc == 0 and '"succeeded": 1' in err, err
    assert proxy.requests_by_method.get("GET", 0) >= 1, proxy.requests_by_method


def test_an_upload_that_keeps_failing_its_check_is_removed_from_the_store(s3_env, minio, bucket, tmp_path):
    """Stock leaves the object that failed its last check in the store, where a later job or a
    rescue run reads it without a word; ours removes it (and counts each attempt's check)."""
    import boto3
    (tmp_path / "out.dat").write_bytes(b"job output")
    (tmp_path / "job.meta").write_text(json.dumps([{"_id": "out.dat", "_type": "file", "_attributes": {
        "checksum.type": "sha256", "checksum.value": hashlib.sha256(b"other output").hexdigest()}}]))
    spec = json.dumps([transfer(f"file://{tmp_path}/out.dat", f"s3://test@minio/{bucket}/run/out.dat", "out.dat",
                                verify_checksum_remote=True, linkage="output")])
    rc, err = run(spec, s3_env, tmp_path, "-m", "2")
    assert rc == 1, err
    assert '"file_type": "output", "succeeded": 0, "failed": 2' in err, err
    assert f"Removed s3://test@minio/{bucket}/run/out.dat: it failed its integrity check" in err, err
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    assert (tmp_path / "out.dat").read_bytes() == b"job output"  # the source stays


def test_remote_verification_without_an_lfn_is_refused_before_any_transfer(s3_env, bucket, tmp_path):
    """Stock copies, then fails every attempt ("lfn is required when enabling checksumming"); an
    entry that can never be verified is refused up front, naming it."""
    (tmp_path / "out.dat").write_bytes(b"job output")
    entry = transfer(f"file://{tmp_path}/out.dat", f"s3://test@minio/{bucket}/out.dat", "", verify_checksum_remote=True)
    rc, err = run(json.dumps([entry]), s3_env, tmp_path)
    assert rc == 1 and "entry 0: verify_checksum_remote needs an 'lfn'" in err, err
    assert len([line for line in err.splitlines() if "CRITICAL" in line]) == 1, err


def test_checks_without_a_linkage_are_counted_on_one_unknown_line_like_stock(tmp_path):
    """Stock's add_integrity_verify files both a missing and an empty linkage under "unknown"."""
    (tmp_path / "a").write_bytes(b"A")
    (tmp_path / "b").write_bytes(b"B")
    (tmp_path / "job.meta").write_text(json.dumps([
        {"_id": n, "_type": "file", "_attributes": {"checksum.type": "sha256",
                                                   "checksum.value": hashlib.sha256(n.upper().encode()).hexdigest()}}
        for n in ("a", "b")]))
    env = {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CACHE_DIR": "off", "PEGASUS_CLOUDIO_CONFIG": os.devnull}
    spec = json.dumps([transfer(f"file://{tmp_path}/a", f"file://{tmp_path}/out/a", "a", dst_label="local",
                                verify_checksum_remote=True, linkage=""),
                       transfer(f"file://{tmp_path}/b", f"file://{tmp_path}/out/b", "b", dst_label="local",
                                verify_checksum_remote=True)])
    rc, err = run(spec, env, tmp_path)
    assert rc == 0, err
    lines = [line for line in err.splitlines() if "int.metric" in line]
    assert len(lines) == 1 and '"file_type": "unknown", "succeeded": 2, "failed": 0' in lines[0], err


def test_a_log_its_stderr_cannot_take_costs_its_lines_and_status_not_the_transfers(tmp_path):
    """The job's stderr without a reader, or on a full disk: the transfers run (as with the
    stock tool, whose ``logging`` drops a line its stream refuses), the lines are lost, and the
    exit is what Python's gives for a standard stream it cannot flush (120)."""
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
           "PEGASUS_CLOUDIO_CONFIG": os.devnull}  # no PYTHONUNBUFFERED: stderr buffered, as a job has it
    (tmp_path / "in.dat").write_bytes(b"payload")
    reader, no_reader = os.pipe()
    os.close(reader)
    try:
        with open("/dev/full", "w") as full:
            for where, stderr in (("no reader", no_reader), ("a full disk", full.fileno())):
                out = tmp_path / f"{where.replace(' ', '-')}.dat"
                spec = json.dumps([transfer(f"file://{tmp_path}/in.dat", f"file://{out}", "x", dst_label="local")])
                done = subprocess.run(OURS, input=spec.encode(), stdout=subprocess.PIPE, stderr=stderr, env=env,
                                      cwd=tmp_path, timeout=120)
                assert (where, done.returncode, done.stdout) == (where, 120, b"")
                assert out.read_bytes() == b"payload", where
    finally:
        os.close(no_reader)


def test_stats_count_the_bytes_a_failed_attempt_left_as_stock_does(proxied, minio, bucket, tmp_path):
    """Stock pegasus-transfer 5.1.x counts every attempt, with the size of its local end as it
    was when the attempt ended (``Stats.add_stats`` stats it then). A download whose first
    attempt failed left no file (s3transfer's temp file, our atomic write), so one 3-byte file
    fetched on the second attempt is "2 transfers, 3.0 B", not the file counted twice. (A body
    cut once resumes inside its attempt: the first attempt fails only when its resumes do.)"""
    import boto3

    from pegasus_cloudio_testbed.proxy import Fault
    proxy, env = proxied
    boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                 aws_secret_access_key=minio.secret_key, region_name="us-east-1").put_object(
        Bucket=bucket, Key="three.dat", Body=b"abc")
    from transfer.http.resume import RESUMES
    # the first GET and every resume of its body cut: the first attempt fails, the second succeeds
    proxy.set_faults([Fault.truncate(after_bytes=1, times=1 + RESUMES, method="GET", path="three.dat")])
    spec = json.dumps([transfer(f"s3://test@minio/{bucket}/three.dat", f"file://{tmp_path}/job/three.dat", "three",
                                src_label="minio", dst_label="local")])
    rc, err = run(spec, dict(env, PEGASUS_CLOUDIO_CACHE_DIR="off"), tmp_path)
    assert rc == 0, err
    assert proxy.pending_faults() == 0 and proxy.requests_by_method.get("GET") == 2 + RESUMES, err
    assert (tmp_path / "job" / "three.dat").read_bytes() == b"abc"
    assert "Stats: Total 2 transfers, 3.0 B transferred" in err, err
    assert "Between sites minio->local : 2 transfers, 3.0 B transferred" in err, err


def test_d_tells_the_story_of_a_run_and_never_a_secret(s3_env, minio, bucket, tmp_path):
    """``-d``: every setting and its source, which credentials file and section gave the
    endpoint and the keys, the addressing style, retries, connections and requests."""
    (tmp_path / ".pegasus").mkdir()
    (tmp_path / ".pegasus" / "cloudio.conf").write_text("PEGASUS_CLOUDIO_READ_TIMEOUT = 30\n")
    env = dict(s3_env, PATH=os.environ["PATH"], PEGASUS_CLOUDIO_THREADS="3", PEGASUS_CLOUDIO_P2P_TOKEN="tok-sekrit",
               PEGASUS_CLOUDIO_CACHE_DIR="off")
    del env["PEGASUS_CLOUDIO_CONFIG"]  # the default file in HOME, to see a second source
    (tmp_path / "a").write_text("a")
    spec = [{"type": "transfer", "src_urls": [{"site_label": "local", "url": f"file://{tmp_path}/a"}],
             "dest_urls": [{"site_label": "minio", "url": f"s3://test@minio/{bucket}/a"}]}]
    done = subprocess.run(OURS + ["-d"], input=json.dumps(spec), env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert "setting PEGASUS_CLOUDIO_THREADS=3 (from the environment)" in err, err
    assert f"setting PEGASUS_CLOUDIO_READ_TIMEOUT=30 (from config file {tmp_path}/.pegasus/cloudio.conf line 1)" in err
    assert (f"s3://test@minio: endpoint {minio.endpoint} from {env['PEGASUS_CREDENTIALS']} [minio], region us-east-1, "
            "path-style addressing (bucket in the path), keys from section [test@minio] of the same file") in err, err
    assert "1 connection(s) opened, 1 request(s) sent" in err, err
    for secret in (minio.secret_key, minio.access_key, "tok-sekrit"):
        assert secret not in err


def test_an_unreadable_credentials_file_is_one_line_naming_it(tmp_path):
    """It read "internal error: PermissionError" (here a directory, which root cannot read either):
    the plugin branch's safe open (transfer/named_files.py) makes it one line naming the file."""
    creds = tmp_path / "creds"
    creds.mkdir(mode=0o700)
    (tmp_path / "a").write_text("a")
    spec = json.dumps([transfer(f"file://{tmp_path}/a", f"file://{tmp_path}/b", "a", dst_label="local")])
    rc, err = run(spec, {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull},
                  tmp_path)
    assert rc == 1 and not (tmp_path / "b").exists()
    lines = [line for line in err.splitlines() if "CRITICAL" in line]
    assert len(lines) == 1 and f"{creds}: cannot read credentials file" in lines[0], err
    assert "internal error" not in err


def test_a_job_reads_the_cache_counters_once(s3_env, bucket, tmp_path):
    """The drop-in closed the node cache after the engine's run had closed it: one more read of
    stats.json per job. A hit now opens it twice: the usage read when the cache is opened, and
    the engine's one locked update of the counters at the end of its run."""
    (tmp_path / "in.dat").write_bytes(b"cached input")
    env = dict(s3_env, PEGASUS_CLOUDIO_CACHE_DIR=str(tmp_path / "cache"))
    put = json.dumps([transfer(f"file://{tmp_path}/in.dat", f"s3://test@minio/{bucket}/in.dat", "in.dat")])
    assert run(put, env, tmp_path)[0] == 0

    def get(name):
        return json.dumps([transfer(f"s3://test@minio/{bucket}/in.dat", f"file://{tmp_path}/{name}", "in.dat",
                                    src_label="minio", dst_label="local")])
    rc, err = run(get("first"), env, tmp_path)  # the miss that fills the entry
    assert rc == 0, err
    stats = next((tmp_path / "cache").rglob("stats.json"))
    fd, opens = stats_opens(stats.parent)
    try:
        rc, err = run(get("second"), env, tmp_path)
        assert rc == 0 and (tmp_path / "second").read_bytes() == b"cached input", err
        assert opens() == 2
    finally:
        os.close(fd)
