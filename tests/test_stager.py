"""The node stager: the drop-in hands its job to ``pegasus-cloudio stager`` and behaves exactly
as in-process (streams, exit code, environment, directory, umask, signals), falls back to
in-process when no stager answers, and the stager guards its socket. Jobs run the installed
command, the native front end (``tests/fixtures_native.py``; ``test_native_front_end.py``
compares it with the Python client)."""

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import pytest

from pegasus_cloudio.stager.server import StagerError, listen
from pegasus_cloudio_testbed.proxy import Fault
from pegasus_cloudio_testbed.stager import StagerProcess
from transfer.cache import cache_from_settings

MiB = 1 << 20


def entry(src, dst, src_label="local", dst_label="local"):
    return {"type": "transfer", "src_urls": [{"site_label": src_label, "url": src}],
            "dest_urls": [{"site_label": dst_label, "url": dst}]}


def job_env(stager_socket, **extra):
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "HOME": os.environ["HOME"],
           "PEGASUS_CLOUDIO_CONFIG": os.devnull, "PEGASUS_CLOUDIO_CACHE_DIR": "off",
           "PEGASUS_CLOUDIO_STAGER": str(stager_socket)}
    env.update(extra)
    return env


def run_job(ours, argv, env, cwd, stdin=b"", umask=None):
    return subprocess.run(list(ours) + list(argv), input=stdin, capture_output=True, env=env, cwd=cwd, timeout=120,
                          preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


def wait_for(predicate, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def served(stager):
    return [line for line in stager.log_tail(1000).splitlines() if " job pid " in line]


@pytest.fixture
def stager():
    with StagerProcess() as daemon:
        yield daemon


def test_a_job_runs_in_the_stager_with_its_own_streams_directory_umask_and_exit_code(native_dropin, stager, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "in.dat").write_bytes(b"input bytes")
    (job / "spec.json").write_text(json.dumps([entry(f"file://{job}/in.dat", f"file://{job}/out/copy.dat")]))
    done = run_job(native_dropin, ["-f", "spec.json"], job_env(stager.socket_path), job,  # a path relative to the job
                   umask=0o027)
    assert done.returncode == 0, done.stderr.decode()
    assert (job / "out" / "copy.dat").read_bytes() == b"input bytes"
    assert stat.S_IMODE(os.stat(job / "out" / "copy.dat").st_mode) == 0o640  # the job's umask, not the stager's
    err = done.stderr.decode()
    assert "Reading transfer specification from spec.json" in err and "All transfers completed successfully." in err
    wait_for(lambda: served(stager), "the stager's log line")
    assert served(stager)[-1].split(" exited ")[1].startswith("0 ")

    missing = run_job(native_dropin, [], job_env(stager.socket_path), job,
                      stdin=json.dumps([entry(f"file://{job}/absent.dat", f"file://{job}/x.dat")]).encode())
    assert missing.returncode == 1 and b"absent.dat" in missing.stderr
    assert not (job / "x.dat").exists()
    wait_for(lambda: len(served(stager)) == 2, "the second job's log line")


def test_the_job_sees_the_clients_environment_not_the_stagers(native_dropin, stager, tmp_path):
    done = run_job(native_dropin, [], job_env(stager.socket_path, PEGASUS_CLOUDIO_THREADS="lots"), tmp_path,
                   stdin=json.dumps([entry(f"file://{tmp_path}/a", f"file://{tmp_path}/b")]).encode())
    assert done.returncode == 1
    assert b"PEGASUS_CLOUDIO_THREADS (from the environment) must be a whole number" in done.stderr
    wait_for(lambda: served(stager), "the stager's log line")  # it ran in the stager, which has no such setting


def test_a_copy_takes_the_jobs_environment_exactly_for_itself_and_what_it_starts():
    from pegasus_cloudio.stager import server

    def started():  # the C-level environment, which commands the job starts get
        out = subprocess.run(["env", "-0"], capture_output=True, check=True).stdout
        return dict(line.split(b"=", 1) for line in out.split(b"\0") if line)

    saved = dict(os.environb)
    outside = {k: v for k, v in started().items() if k not in saved}  # set by C code (readline's LINES...)
    try:
        os.environb.update({b"STAGER_ONLY": b"1", b"SHARED_SAME": b"same", b"SHARED_OTHER": b"stager's"})
        job = {**{k: v for k, v in saved.items()}, b"SHARED_SAME": b"same", b"SHARED_OTHER": b"job's",
               b"JOB_ONLY": b"\xff\xfe", b"EMPTY": b""}
        server._take_environment(job)
        assert dict(os.environb) == job and os.environ["JOB_ONLY"] == os.fsdecode(b"\xff\xfe")
        assert started() == {**job, **outside}
    finally:
        server._take_environment(saved)
    assert dict(os.environb) == saved


def test_usage_errors_and_version_keep_their_exit_codes(native_dropin, stager, tmp_path):
    version = run_job(native_dropin, ["--version"], job_env(stager.socket_path), tmp_path)
    assert version.stdout.startswith(b"pegasus-cloudio-transfer ")
    bad = run_job(native_dropin, ["--no-such-flag"], job_env(stager.socket_path), tmp_path)
    assert bad.returncode == 2 and b"unrecognized arguments: --no-such-flag" in bad.stderr


def test_without_a_stager_the_job_runs_in_process_after_one_warning(native_dropin, tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 10)
    absent = tmp_path / "no-stager.sock"
    done = run_job(native_dropin, [], job_env(absent), tmp_path,
                   stdin=json.dumps([entry(f"file://{tmp_path}/a", f"file://{tmp_path}/b")]).encode())
    assert done.returncode == 0 and (tmp_path / "b").read_bytes() == b"x" * 10
    warnings = [line for line in done.stderr.decode().splitlines() if "node stager" in line]
    assert len(warnings) == 1 and str(absent) in warnings[0] and "transferring in this process" in warnings[0]


def test_a_python_client_started_without_stderr_runs_its_job_when_no_stager_takes_it(python_dropin, tmp_path):
    """A job started with its standard error closed (a daemon's child): the warning that no
    stager took the job is lost, not the job, as in-process (its client's warning crashed on
    the missing stream: exit 1, nothing transferred)."""
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "spec.json").write_text(json.dumps([entry(f"file://{tmp_path}/a", f"file://{tmp_path}/b")]))
    done = subprocess.run(["sh", "-c", 'exec "$@" 2>&-', "sh", *python_dropin, "-f", "spec.json"],
                          env=job_env(tmp_path / "no-stager.sock"), cwd=tmp_path, timeout=120)
    assert done.returncode == 0 and (tmp_path / "b").read_bytes() == b"x" * 10


def put_object(minio, bucket, key, body):
    """Put ``body`` at ``key`` in ``bucket`` with boto3 (set-up, not the code under test)."""
    boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                 aws_secret_access_key=minio.secret_key, region_name="us-east-1").put_object(
        Bucket=bucket, Key=key, Body=body)


def warm_sources(minio, bucket, tmp_path):
    """The sources of the warm-connection tests: ``obj`` in ``bucket`` (b"warm bytes"), which a
    job fetches over the stager's warm connections, and ``tmp_path/local`` (b"local bytes"),
    which a job copies without a request."""
    put_object(minio, bucket, "obj", b"warm bytes")
    (tmp_path / "local").write_bytes(b"local bytes")


def _stalled_get(proxy, minio, bucket, tmp_path):
    put_object(minio, bucket, "big.dat", os.urandom(16 * MiB))
    proxy.set_faults([Fault.stall(60, after_bytes=2 * MiB, method="GET")])
    job = tmp_path / "job"
    job.mkdir()
    return job, [entry(f"s3://test@minio/{bucket}/big.dat", f"file://{job}/big.dat", "minio", "local")]


def _parts(job):
    return [p for p in job.rglob("*") if p.name.endswith(".part")]


def _job_in_a_stalled_download(ours, stager, proxied, minio, bucket, tmp_path, stderr):
    """A job of command ``ours`` handed to ``stager``, once its download has written some bytes
    and stalled."""
    proxy, env = proxied
    job, spec = _stalled_get(proxy, minio, bucket, tmp_path)
    proc = subprocess.Popen(ours, stdin=subprocess.PIPE, stderr=stderr, cwd=job,
                            env=job_env(stager.socket_path, **env))
    proc.stdin.write(json.dumps(spec).encode())
    proc.stdin.close()
    wait_for(lambda: _parts(job) and os.path.getsize(_parts(job)[0]) > 0, "a partial download")
    return proc, job


def test_sigterm_to_the_job_reaches_the_stager_process_running_it(native_dropin, stager, proxied, minio, bucket,
                                                                  tmp_path):
    proc, job = _job_in_a_stalled_download(native_dropin, stager, proxied, minio, bucket, tmp_path, subprocess.PIPE)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    err = proc.stderr.read().decode()
    assert rc == 1, err
    assert "Exiting due to signal 15" in err and "completed successfully" not in err
    assert _parts(job) == [] and not (job / "big.dat").exists()


def test_a_killed_job_stops_its_stager_process_and_leaves_no_part_file(native_dropin, stager, proxied, minio, bucket,
                                                                       tmp_path):
    proc, job = _job_in_a_stalled_download(native_dropin, stager, proxied, minio, bucket, tmp_path, subprocess.DEVNULL)
    proc.kill()  # HTCondor's SIGKILL: the client cannot pass anything on
    proc.wait(timeout=30)
    wait_for(lambda: served(stager), "the stager's process to end")
    assert " exited 1 " in served(stager)[-1]
    assert _parts(job) == [] and not (job / "big.dat").exists()


def test_the_stager_refuses_a_socket_directory_others_can_reach(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "stager", "--socket", str(shared / "s.sock")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert str(shared) in lines[-1] and "mode 777" in lines[-1] and "private" in lines[-1]
    assert not (shared / "s.sock").exists()


def test_a_stale_socket_file_is_replaced_and_a_live_one_refused(tmp_path):
    private = tmp_path / "run"
    private.mkdir(mode=0o700)
    path = private / "s.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a killed stager leaves
    live = listen(str(path))
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with pytest.raises(StagerError, match="another stager is serving"):
            listen(str(path))
    finally:
        live.close()
    (private / "plain").write_text("not a socket")
    with pytest.raises(StagerError, match="not a socket"):
        listen(str(private / "plain"))


def test_a_stager_of_another_user_is_not_used(tmp_path, monkeypatch):
    """The client checks the peer's uid (SO_PEERCRED) before sending its environment."""
    from pegasus_cloudio.stager import client

    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    real_uid = os.getuid()
    monkeypatch.setattr(client.os, "getuid", lambda: real_uid + 1)  # as if the stager ran as someone else
    try:
        assert client.hand_off(str(path), ["--version"], {"SECRET": "x"}) is None
        conn, _ = server.accept()
        conn.settimeout(1)
        assert conn.recv(64) == b""  # nothing was sent to it
        conn.close()
    finally:
        server.close()


def upload_bundle(ours, env, bucket, tmp_path):
    """Twelve small files uploaded as one bundle by ``ours``: (their names, the directory URL)."""
    src = tmp_path / "src"
    src.mkdir()
    names = [f"m{i:02d}" for i in range(12)]
    for name in names:
        (src / name).write_bytes(name.encode() * 30)
    url = f"s3://test@minio/{bucket}/run"
    up = [entry(f"file://{src}/{n}", f"{url}/{n}", "local", "minio") for n in names]
    done = run_job(ours, [], env, tmp_path, stdin=json.dumps(up).encode())
    assert done.returncode == 0, done.stderr.decode()
    return names, url


def read_bundle(ours, env, names, url, job):
    """The files of :func:`upload_bundle` read by ``ours`` into the new directory ``job``, checked."""
    job.mkdir()
    down = [entry(f"{url}/{n}", f"file://{job}/{n}", "minio", "local") for n in names]
    done = run_job(ours, [], env, job, stdin=json.dumps(down).encode())
    assert done.returncode == 0, done.stderr.decode()
    assert all((job / n).read_bytes() == n.encode() * 30 for n in names)
    return done


def one_member_to_hold(ours, env, names, url, cache_dir, tmp_path):
    """A first job's read of :func:`upload_bundle`'s files (whose members enter the node cache),
    then the cache emptied: (the cache, the lock file of one member's key, a new job directory,
    the entries that read the bundle into it), for a test that holds the lock while the next
    job's insert of that member waits."""
    read_bundle(ours, env, names, url, tmp_path / "first")
    cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(cache_dir), "HOME": env["HOME"]})
    wait_for(lambda: len(cache.entries()) == len(names), "the first job's inserts")
    key = cache.entries()[0].meta.key
    cache.clear()
    job = tmp_path / "second"
    job.mkdir()
    down = [entry(f"{url}/{n}", f"file://{job}/{n}", "minio", "local") for n in names]
    return cache, cache._layout.paths(key).lock, job, down


def test_bundle_members_enter_the_node_cache_after_the_job_has_its_answer(native_dropin, stager, proxied, bucket,
                                                                         tmp_path):
    """Write-behind: the stager answers the job, then inserts the members it fetched; the next
    job on the node reads them from the cache without a request."""
    proxy, env = proxied
    common = dict(env, PEGASUS_CLOUDIO_BUNDLE="1", PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES="0")
    names, url = upload_bundle(native_dropin, job_env(stager.socket_path, **common), bucket, tmp_path)
    cache = tmp_path / "cache"
    node = job_env(stager.socket_path, **dict(common, PEGASUS_CLOUDIO_CACHE_DIR=str(cache)))
    for job in ("first", "second"):
        proxy.reset_counters()
        read_bundle(native_dropin, node, names, url, tmp_path / job)
        if job == "first":
            assert proxy.snapshot()["requests"] >= 1
            wait_for(lambda: len(served(stager)) == 2, "the first download's process to end")  # drained by then
    # the second job: the directory's index (LIST + head), every member's bytes from the cache
    assert proxy.snapshot()["requests"] <= 2
    held = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(cache), "HOME": env["HOME"]})
    assert sorted(e.meta.key.rsplit("#member=", 1)[1][:3] for e in held.entries()) == names
    held.close()


def test_requests_round_trip_any_argument_and_environment_and_refuse_garbage():
    from pegasus_cloudio.stager import wire

    argv = ["-f", "spé c.json", "a=b", ""]
    env = {"PATH": "/bin", "EMPTY": "", "WITH_EQUALS": "x=y=z", "BYTES": os.fsdecode(b"\xff\xfe")}
    data = wire.encode_request("/job dir/é", 0o027, argv, env)
    assert wire.decode_request(data) == ("/job dir/é", 0o027, argv, env)
    for bad in (b"", b"v2\0/\x0018\x000", data.replace(b"v1", b"v9", 1), b"v1\0/\0" + b"18\0" + b"5\0a",
                b"v1\0/\x00999999\x000", b"v1\0/\x0018\x000\0NOEQUALS", b"v1\0/\x00x\x000"):
        assert wire.decode_request(bad) is None, bad


def test_a_client_that_sends_garbage_gets_exit_2_and_the_stager_serves_on(native_dropin, stager, tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(stager.socket_path)
    here = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    with open(os.devnull, "rb") as null_in, open(tmp_path / "err", "wb") as err:
        socket.send_fds(sock, [(12).to_bytes(4, "big")], [null_in.fileno(), err.fileno(), err.fileno(), here])
        sock.sendall(b"not-a-reqest")
    os.close(here)
    from pegasus_cloudio.stager import wire
    assert wire.read_reply(sock) is None  # no pid, no exit code: the request was refused
    sock.close()
    assert (tmp_path / "err").read_bytes() == b"pegasus-transfer: the node stager got a malformed request\n"
    wait_for(lambda: served(stager), "the refused request's log line")
    assert " exited 2 " in served(stager)[-1]
    assert run_job(native_dropin, ["--version"], job_env(stager.socket_path), tmp_path).returncode == 0


HANDLERS_AROUND_A_JOB = """
import os, signal
from pegasus_cloudio.stager.client import FORWARDED, hand_off

def mine(signum, frame):
    pass

signal.signal(signal.SIGTERM, mine)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
before = {signum: signal.getsignal(signum) for signum in FORWARDED}  # SIGINT: Python's own
code = hand_off(os.environ["PEGASUS_CLOUDIO_STAGER"], [], os.environ)
after = {signum: signal.getsignal(signum) for signum in FORWARDED}
print(code, "same" if after == before else f"changed: {before} -> {after}")
"""


def test_the_python_client_gives_back_the_signal_handlers_it_replaced(stager, tmp_path):
    """Once the job's exit code has arrived, a caller of the client (a library, not the drop-in,
    which ends there) has its own handlers back, not forwarders to a process that has ended."""
    done = subprocess.run([sys.executable, "-c", HANDLERS_AROUND_A_JOB], input=b"[]", capture_output=True,
                          env=job_env(stager.socket_path), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == "0 same\n", done.stderr.decode()
    wait_for(lambda: len(served(stager)) == 1, "the stager to log the job")


def test_a_job_handed_to_the_stager_imports_only_the_lean_client(stager, tmp_path):
    """Every job step pays the client's imports: the plain script and the client use C modules
    (_socket, _signal), so neither re (the generated console_scripts wrapper), socket, signal,
    enum, json nor typing is imported before the stager has the job."""
    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-S", "-X", "importtime", str(repo / "bin" / "pegasus-cloudio-transfer-py")],
                          input=b"[]", capture_output=True, env=job_env(stager.socket_path, PYTHONPATH=str(repo)),
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in done.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert "pegasus_cloudio.stager.client" in imported and "pegasus_cloudio.dropin.main" not in imported
    assert not imported & {"re", "socket", "signal", "enum", "json", "typing", "selectors", "functools"}
    wait_for(lambda: len(served(stager)) == 1, "the stager to log the job")


def test_a_stop_during_reaping_waits_until_every_finished_job_is_reaped_and_logged(monkeypatch, caplog):
    """SIGTERM's handler can run between any two bytecodes of the SIGCHLD handler: the stop
    then takes effect after the reaping, so no finished job goes unlogged (a flaky CI run)."""
    from pegasus_cloudio.stager import server

    finished = [(101, 0, 0.25), (102, 256, 0.5)]

    class Usage:
        def __init__(self, cpu):
            self.ru_utime, self.ru_stime = cpu, 0.0

    def wait4(pid, options):
        if not finished:
            return 0, 0, Usage(0.0)
        child, status, cpu = finished.pop(0)
        return child, status, Usage(cpu)

    stager = server.Stager("/nonexistent/s.sock")
    stager._serving = True
    monkeypatch.setattr(server.os, "wait4", wait4)
    real_info = server.log.info

    def info(message, *args):
        real_info(message, *args)
        if len(finished) == 1:  # SIGTERM arrives right after the first job's line
            stager._stop(signal.SIGTERM, None)

    monkeypatch.setattr(server.log, "info", info)
    with caplog.at_level("INFO", logger="pegasus_cloudio.stager"):
        with pytest.raises(server._Stop):
            stager._reap(signal.SIGCHLD, None)
    assert stager.served == 2 and stager.cpu_s == 0.75
    lines = [r.getMessage() for r in caplog.records if "job pid" in r.getMessage()]
    assert lines == ["job pid 101 exited 0 (0.250 s CPU)", "job pid 102 exited 1 (0.500 s CPU)"]
    stager._serving = False  # outside the accept loop a stop never raises
    stager._stop(signal.SIGTERM, None)


def test_inserts_after_the_answer_neither_hold_nor_write_the_jobs_streams(native_dropin, stager, proxied, bucket,
                                                                         tmp_path):
    """The stager's copy fills the node cache after the job has its exit status: by then the
    job's stdout and stderr are not its own any more. A reader of the job's streams sees their
    end when the job's command exits, even while an insert waits (here on a member's lock, which
    this test holds), and nothing the inserts do is written there."""
    from transfer.cache.locks import EXCLUSIVE, held
    proxy, env = proxied
    common = dict(env, PEGASUS_CLOUDIO_BUNDLE="1", PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES="0")
    names, url = upload_bundle(native_dropin, job_env(stager.socket_path, **common), bucket, tmp_path)
    cache_dir = tmp_path / "cache"
    node = job_env(stager.socket_path, **dict(common, PEGASUS_CLOUDIO_CACHE_DIR=str(cache_dir)))
    cache, lock, job, down = one_member_to_hold(native_dropin, node, names, url, cache_dir, tmp_path)
    with held(lock, EXCLUSIVE):  # the copy's insert of this member waits
        client = subprocess.Popen(list(native_dropin), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=node, cwd=job)
        client.stdin.write(json.dumps(down).encode())
        client.stdin.close()
        assert client.wait(timeout=60) == 0
        ended = threading.Event()
        err = []
        reader = threading.Thread(target=lambda: (err.append(client.stderr.read()), ended.set()), daemon=True)
        reader.start()
        assert ended.wait(30), "the job's stderr is still open after its command exited"
    assert b"All transfers completed successfully." in err[0]
    wait_for(lambda: len(cache.entries()) == len(names), "the second job's inserts")
    client.stdout.close()
    client.stderr.close()
    cache.close()


def test_a_stager_started_without_standard_streams_serves_jobs(native_dropin, tmp_path):
    """A service manager may start the stager with its standard streams closed: its listening
    socket and its copies' report pipe then took descriptors 0-2, where a copy puts the job's
    streams (the copy closed the job's standard input, wrote its reports into the job's
    standard error): every job fell back to running itself."""
    import shutil
    import tempfile

    directory = tempfile.mkdtemp(prefix="stager-")  # short: a socket path holds 107 bytes
    path = os.path.join(directory, "stager.sock")
    daemon = subprocess.Popen(["sh", "-c", 'exec "$@" <&- >&- 2>&-', "sh", sys.executable, "-m",
                               "pegasus_cloudio.cli", "stager", "--socket", path])

    def accepts():
        probe = socket.socket(socket.AF_UNIX)
        try:
            return probe.connect_ex(path) == 0  # the copy forked for it ends at the probe's close
        finally:
            probe.close()

    try:
        wait_for(accepts, "the stager's socket")
        (tmp_path / "a").write_bytes(b"x" * 10)
        done = run_job(native_dropin, [], job_env(path), tmp_path,
                       stdin=json.dumps([entry(f"file://{tmp_path}/a", f"file://{tmp_path}/b")]).encode())
        assert done.returncode == 0 and (tmp_path / "b").read_bytes() == b"x" * 10, done.stderr.decode()
        assert b"node stager" not in done.stderr, done.stderr.decode()  # served there, no fall-back
    finally:
        daemon.terminate()
        daemon.wait(30)
        shutil.rmtree(directory, ignore_errors=True)
