"""SIGTERM (HTCondor eviction) and SIGINT during transfers: no temp file left, no orphaned
multipart upload, the unfinished transfers logged, exit 1 and never a success line."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from pegasus_cloudio_testbed.proxy import Fault

OURS = [sys.executable, "-m", "pegasus_cloudio.dropin"]
MiB = 1 << 20


def entry(src, dst, src_label, dst_label):
    return {"type": "transfer", "src_urls": [{"site_label": src_label, "url": src}],
            "dest_urls": [{"site_label": dst_label, "url": dst}]}


def start(spec, env, cwd, cache="off", write=True):
    """The drop-in, started with ``spec`` on its stdin (left open, unwritten, without ``write``)."""
    proc = subprocess.Popen(OURS, stdin=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                            env=dict(env, PATH=os.environ["PATH"], PYTHONPATH=os.environ.get("PYTHONPATH", ""),
                                     PEGASUS_CLOUDIO_CACHE_DIR=str(cache), PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES="0"))
    if write:
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
    return proc


def wait_for(predicate, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def parts(*directories: Path):
    return [p for d in directories for p in d.rglob("*") if p.name.endswith(".part")]


def client(minio):
    return boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                        aws_secret_access_key=minio.secret_key, region_name="us-east-1")


@pytest.mark.parametrize("signum, cached", [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGTERM, True)])
def test_a_signal_during_a_get_leaves_no_part_file_and_logs_what_did_not_finish(proxied, bucket, minio,
                                                                                tmp_path, signum, cached):
    proxy, env = proxied
    client(minio).put_object(Bucket=bucket, Key="big.dat", Body=os.urandom(32 * MiB))
    proxy.set_faults([Fault.stall(60, after_bytes=4 * MiB, method="GET")])
    job = tmp_path / "job"
    job.mkdir()
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    url = f"s3://test@minio/{bucket}/big.dat"
    proc = start([entry(url, f"file://{job}/big.dat", "minio", "local")], env, job, cache if cached else "off")
    wait_for(lambda: parts(job, cache) and os.path.getsize(parts(job, cache)[0]) > 0, "a partial download")
    proc.send_signal(signum)
    rc = proc.wait(timeout=30)
    err = proc.stderr.read().decode()
    assert rc == 1, err
    assert parts(job, cache) == [] and not (job / "big.dat").exists()
    assert f"Exiting due to signal {int(signum)}" in err and f"Not finished: {url}" in err
    assert "completed successfully" not in err


_TGKILL = {"x86_64": 234, "aarch64": 131}  # the tgkill system call's number


def test_a_sigterm_one_of_the_workers_receives_ends_the_job_as_well(proxied, bucket, minio, tmp_path):
    """SIGTERM delivered to a worker thread (tgkill), not to the main thread, which sleeps on its
    workers: Python runs handlers in the main thread only, which then wakes within a slice of its
    wait and ends the job as for any SIGTERM; before, it slept until the stalled GET was over."""
    import ctypes
    proxy, env = proxied
    client(minio).put_object(Bucket=bucket, Key="big.dat", Body=os.urandom(32 * MiB))
    proxy.set_faults([Fault.stall(60, after_bytes=4 * MiB, method="GET")])
    job = tmp_path / "job"
    job.mkdir()
    url = f"s3://test@minio/{bucket}/big.dat"
    proc = start([entry(url, f"file://{job}/big.dat", "minio", "local")], env, job)
    wait_for(lambda: parts(job) and os.path.getsize(parts(job)[0]) > 0, "a partial download")
    workers = sorted(int(tid) for tid in os.listdir(f"/proc/{proc.pid}/task") if int(tid) != proc.pid)
    assert workers, "the drop-in runs no worker thread"
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(_TGKILL[os.uname().machine], proc.pid, workers[0], signal.SIGTERM) == 0, ctypes.get_errno()
    rc = proc.wait(timeout=30)
    err = proc.stderr.read().decode()
    assert rc == 1, err
    assert parts(job) == [] and not (job / "big.dat").exists()
    assert "Exiting due to signal 15" in err and f"Not finished: {url}" in err


def test_sigterm_during_a_multipart_upload_aborts_it(proxied, bucket, minio, tmp_path):
    proxy, env = proxied
    src = tmp_path / "out.dat"
    src.write_bytes(os.urandom(12 * MiB))
    proxy.set_faults([Fault.stall(60, method="PUT", path="partNumber", times=10)])
    url = f"s3://test@minio/{bucket}/out.dat"
    env = dict(env, PEGASUS_CLOUDIO_MULTIPART_THRESHOLD=str(5 * MiB), PEGASUS_CLOUDIO_MULTIPART_PART_SIZE=str(5 * MiB))
    proc = start([entry(f"file://{src}", url, "local", "minio")], env, tmp_path)
    s3 = client(minio)
    wait_for(lambda: s3.list_multipart_uploads(Bucket=bucket).get("Uploads"), "a multipart upload to start")
    wait_for(lambda: proxy.requests_by_method.get("PUT", 0) >= 1, "a part in flight")
    proxy.clear_faults()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    err = proc.stderr.read().decode()
    assert rc == 1, err
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads"), err
    assert f"Not finished: file://{src}" in err or f"Not finished: {src}" in err or "Not finished:" in err


def test_sigterm_during_a_pipelined_batch_of_small_gets_leaves_no_part_file(proxied, bucket, minio, tmp_path):
    """Small downloads go pipelined from the main thread (transfer/batched.py), which also
    writes the files: the handler still runs, removes what is half written and exits."""
    proxy, env = proxied
    s3 = client(minio)
    names = [f"s{i:02d}" for i in range(40)]
    for name in names:
        s3.put_object(Bucket=bucket, Key=name, Body=os.urandom(300))
    # every GET arms the stall (the proxy frames pipelined requests but re-arms at each head):
    # each connection stalls some 3,000 bytes into its answers, after a few whole files
    proxy.set_faults([Fault.stall(60, after_bytes=3000, method="GET", times=10_000)])
    job = tmp_path / "job"
    job.mkdir()
    spec = [entry(f"s3://test@minio/{bucket}/{n}", f"file://{job}/{n}", "minio", "local") for n in names]
    proc = start(spec, env, job)
    wait_for(lambda: proxy.snapshot()["faults_triggered"] >= 1 and any(job.iterdir()), "a stalled batch")
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    err = proc.stderr.read().decode()
    assert rc == 1, err
    assert parts(job) == []
    assert "Exiting due to signal 15" in err and "Not finished: s3://" in err
    assert "completed successfully" not in err


def test_sigterm_while_a_debug_log_line_blocks_on_a_full_stderr_still_exits_1_and_says_so(s3_env, bucket, minio,
                                                                                           tmp_path):
    """With ``-d`` the main thread writes a line per file; when the reader of stderr falls
    behind, that write blocks, and SIGTERM's handler runs inside it (the interrupted write is
    retried after the handler). It still removes the temp files, exits 1 and says why on
    stderr, with no traceback."""
    s3 = client(minio)
    names = [f"d{i:04d}" for i in range(1500)]
    for name in names:
        s3.put_object(Bucket=bucket, Key=name, Body=b"x" * 300)
    job = tmp_path / "job"
    job.mkdir()
    spec = [entry(f"s3://test@minio/{bucket}/{n}", f"file://{job}/{n}", "minio", "local") for n in names]
    proc = subprocess.Popen(OURS + ["-d"], stdin=subprocess.PIPE, stderr=subprocess.PIPE, cwd=job,
                            env=dict(s3_env, PATH=os.environ["PATH"], PYTHONPATH=os.environ.get("PYTHONPATH", ""),
                                     PEGASUS_CLOUDIO_CACHE_DIR="off"))
    proc.stdin.write(json.dumps(spec).encode())
    proc.stdin.close()
    wait_for(lambda: _blocked_writing(proc.pid), "the drop-in blocked on its full stderr")
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read().decode()  # drains the pipe: a process that carried on would log on
    rc = proc.wait(timeout=30)
    assert rc == 1, err[-2000:]
    assert "Exiting due to signal 15" in err, err[-2000:]
    assert "RuntimeError" not in err and "Traceback" not in err, err[-3000:]
    assert "completed successfully" not in err
    assert parts(job) == []


def _blocked_writing(pid: int) -> bool:
    """The process's main thread sleeps in a pipe write (its stderr is full)."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text().endswith("pipe_write")
    except OSError:
        return False


# strace's fault injection: every link(2)/symlink(2) of the process returns only after a minute,
# so the hidden ``.link`` name it made stays on disk, not yet renamed over the destination.
LINKS = "link,linkat,symlink,symlinkat"


def hold_links(pid: int, when: str = "1+") -> subprocess.Popen:
    """strace attached to every thread of ``pid`` (and those it starts), holding its links (each
    thread's from the ``when``-th on)."""
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={LINKS}",
                               "-e", f"inject={LINKS}:delay_exit=60s:when={when}", "-p", str(pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: _status(pid, "TracerPid") == str(tracer.pid), "strace to attach")
    return tracer


def _status(pid: int, field: str) -> str:
    """A field of /proc/PID/status ("" once the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return ""
    return next((line.split()[1] for line in lines if line.startswith(field + ":")), "")


@pytest.mark.parametrize("how", ["symlink", "cache-hit"])
def test_sigterm_while_a_link_is_made_leaves_no_hidden_link_name(proxied, bucket, minio, tmp_path, how):
    """A destination linked into place (a ``symlink://`` one, a node-cache hit's hard link over a
    file already there: a free name is hard-linked at once) is made under a hidden
    ``.NAME.PID.N.link`` name and renamed over it: an eviction between the two removes that name
    as it removes ``.part`` files, and leaves the file that was there. strace holds each link call's return,
    so the name exists, deterministically, when SIGTERM comes (the signal's handler runs on the
    main thread; the link is made on a worker's)."""
    proxy, env = proxied
    job = tmp_path / "job"
    job.mkdir()
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    if how == "symlink":
        (tmp_path / "in.dat").write_bytes(b"linked input")
        spec = [entry(f"file://{tmp_path}/in.dat", f"symlink://{job}/in.dat", "local", "local")]
    else:
        client(minio).put_object(Bucket=bucket, Key="in.dat", Body=b"cached input")
        url = f"s3://test@minio/{bucket}/in.dat"
        filler = start([entry(url, f"file://{tmp_path}/filled.dat", "minio", "local")], env, tmp_path, cache)
        assert filler.wait(timeout=60) == 0, filler.stderr.read().decode()
        spec = [entry(url, f"file://{job}/in.dat", "minio", "local")]
        (job / "in.dat").write_bytes(b"there before")
    proc = start([], env, job, cache, write=False)  # waits for its spec on stdin meanwhile
    tracer = hold_links(proc.pid, "1+" if how == "symlink" else "2+")  # not the link to the taken name
    try:
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
        wait_for(lambda: [p for p in job.iterdir() if p.name.endswith(".link")], "a hidden link name")
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: _status(proc.pid, "State") in ("Z", ""), "the drop-in's main thread to exit")
    finally:
        tracer.kill()  # detaches: the thread it held ends with its process
        tracer.wait()
    rc = proc.wait(timeout=30)
    err = proc.stderr.read().decode()
    assert rc == 1, err
    assert [p.name for p in job.iterdir()] == ([] if how == "symlink" else ["in.dat"])
    assert how == "symlink" or (job / "in.dat").read_bytes() == b"there before"
    assert "Exiting due to signal 15: 1 transfer(s) did not finish, 1 temporary file(s) removed" in err
