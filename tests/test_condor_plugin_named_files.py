"""Files the plugin and the drop-in read on someone else's say (issue 39 items 2, 3, 4, 9),
driven as condor_starter drives the plugin (tests/fixtures_condor.py), with real other users.

The job may replace ``.job.ad`` in its sandbox, and a job variable may name any path as the
credentials file: a FIFO, ``/dev/zero``, another user's 0600 file. Each is one line naming the
file and a result ad the starter can hold the job with; nothing blocks, nothing reads without
bound, no request is sent. A job ad that does not parse is one warning line naming it. A store
that throttles every request ends in a retryable ``TransferErrorData`` (issue 37 item 5).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import pytest

from unix_users import new_users
from fixtures_condor import (
    PLUGIN_FILE, PluginRun, Starter, assert_filter_types, base_env, file_ad, parse_results, put_objects,
    write_credentials,
)

from test_p2p_trust import portable_python

from pegasus_cloudio_testbed.proxy import Fault, TcpProxy

HANG_GUARD_S = 60  # a run that blocks (on a FIFO) fails the test instead of hanging it


def run_plugin(starter: Starter, ads, env: Dict[str, str], user: Optional["OtherUser"] = None) -> PluginRun:
    """The plugin on ``ads`` as the starter runs it; as ``user`` when given (the module run by
    that user's readable interpreter: the test bed's own lives under /root)."""
    infile, outfile = starter.prepare(ads)
    argv = starter.argv(infile, outfile, False)
    extra: Dict[str, object] = {}
    if user is not None:
        for path in (infile, outfile):
            os.chown(path, user.uid, user.gid)
        argv = [user.python, "-m", "pegasus_cloudio.condor.plugin"] + argv[1:]
        env = dict(env, **user.env)
        extra = {"user": user.uid, "group": user.gid, "extra_groups": []}
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=HANG_GUARD_S, **extra)  # type: ignore[call-overload]
    return PluginRun(done.returncode, done.stdout, parse_results(outfile.read_text()), outfile)


def one_line(run: PluginRun, *needles: str) -> str:
    """The plugin's output is one line per failure plus its summary line; returns the line
    holding every needle."""
    lines = [line for line in run.output.splitlines() if all(n in line for n in needles)]
    assert len(lines) == 1, run.output
    assert "Traceback" not in run.output and "internal error" not in run.output, run.output
    return lines[0]


@pytest.fixture
def counted(minio, bucket, tmp_path, starter) -> Iterator[Tuple[TcpProxy, str]]:
    """(a counting proxy in front of MinIO, the URL of an object behind it); the starter's
    environment names credentials for it."""
    put_objects(minio, bucket, {"k.dat": b"k"})
    with TcpProxy((minio.host, minio.port)) as proxy:
        creds = write_credentials(tmp_path / "proxied.conf", minio, minio.secret_key)
        creds.write_text(creds.read_text().replace(minio.endpoint, proxy.url()))
        starter.env["PEGASUS_CREDENTIALS"] = str(creds)
        yield proxy, f"s3://test@minio/{bucket}/k.dat"


# --------------------------------------------------------------------------- the job ad


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "link", "oversized"])
def test_a_job_ad_that_is_not_a_small_regular_file_is_refused_with_a_result_ad(starter, counted, kind):
    proxy, url = counted
    ad = starter.sandbox / ".job.ad"
    if kind == "fifo":
        os.mkfifo(ad)
    elif kind == "dev-zero":
        ad.symlink_to("/dev/zero")
    elif kind == "link":
        (starter.sandbox / "elsewhere.ad").write_text('Environment = "CLOUDIO_PEGASUS_CREDENTIALS=x"\n')
        ad.symlink_to(starter.sandbox / "elsewhere.ad")
    else:
        with open(ad, "wb") as fh:
            fh.truncate(17 << 20)  # sparse: over the bound, nothing on disk
    env = dict(starter.env, _CONDOR_JOB_AD=str(ad) if kind != "dev-zero" else "/dev/zero")
    run = run_plugin(starter, [file_ad(url, str(starter.sandbox / "a.dat"))], env)
    assert run.returncode == 3, run.output
    named = "/dev/zero" if kind == "dev-zero" else str(ad)
    line = one_line(run, f"cannot read the job ad {named}")
    why = {"fifo": "a FIFO", "dev-zero": "a character device", "link": "a symbolic link",
           "oversized": "larger than"}[kind]
    assert why in line, line
    [result] = run.ads
    assert result.eval("TransferSuccess") is False and named in result.eval("TransferError")
    assert proxy.connections == 0
    assert not (starter.sandbox / "a.dat").exists()


def test_a_job_ad_that_does_not_parse_is_one_warning_naming_it(starter, minio, bucket):
    put_objects(minio, bucket, {"k.dat": b"k"})
    ad = starter.write_job_ad(['Environment = "CLOUDIO_PEGASUS_CREDENTIALS=creds.conf"'])
    ad.write_text("this is ] not [ a classad ((\n" + ad.read_text())
    url = f"s3://test@minio/{bucket}/k.dat"
    run = run_plugin(starter, [file_ad(url, str(starter.sandbox / "k.dat"))], starter.env)
    line = one_line(run, str(ad))
    assert "does not parse" in line and "no job variables" in line, line
    assert run.returncode == 1  # no credentials given (the job's were in the ad it could not read)


def test_a_request_file_that_is_a_fifo_is_refused_at_once(starter):
    """The request sits in the job's sandbox too: a FIFO there is one line and a failed ad."""
    _, outfile = starter.prepare([])
    infile = starter.sandbox / "request.fifo"
    os.mkfifo(infile)
    done = subprocess.run(starter.argv(infile, outfile, False), env=starter.env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 3, done.stdout
    [line] = done.stdout.strip().splitlines()
    assert str(infile) in line and "a FIFO, not a regular file" in line, line
    [result] = parse_results(outfile.read_text())
    assert result.eval("TransferSuccess") is False and str(infile) in result.eval("TransferError")


@pytest.mark.parametrize("kind", ["fifo", "link", "device"])
def test_a_result_file_that_is_not_a_regular_file_is_refused_naming_it(starter, tmp_path, kind):
    """The starter's -outfile sits in the job's sandbox too: a FIFO, a link or a device there
    (the job may leave one) is exit 3 with one line naming it, and nothing is written through
    the link."""
    infile, outfile = starter.prepare([file_ad("nosuch://h/b/k", str(starter.sandbox / "k"))])
    outfile.unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("kept")
    if kind == "fifo":
        os.mkfifo(outfile)
    elif kind == "device":
        os.mknod(outfile, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # /dev/full's numbers
    else:
        outfile.symlink_to(elsewhere)
    done = subprocess.run(starter.argv(infile, outfile, False), env=starter.env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 3, done.stdout
    [line] = done.stdout.strip().splitlines()
    reason = {"fifo": "a FIFO, not a regular file", "device": "a character device, not a regular file",
              "link": "a symbolic link (not followed)"}[kind]
    assert str(outfile) in line and reason in line, line
    assert elsewhere.read_text() == "kept"


# --------------------------------------------------------------------------- credentials files


def test_a_fifo_as_credentials_file_fails_the_file_naming_it(starter, counted):
    proxy, url = counted
    fifo = starter.sandbox / "creds.fifo"
    os.mkfifo(fifo)
    fifo.chmod(0o600)
    starter.write_job_ad([f'Environment = "CLOUDIO_PEGASUS_CREDENTIALS={fifo.name}"'])
    run = run_plugin(starter, [file_ad(url, str(starter.sandbox / "k.dat"))], starter.env)
    assert run.returncode == 1, run.output
    error = run.ad_for(url).eval("TransferError")
    assert str(fifo) in error and "a FIFO, not a regular file" in error, error
    [entry] = run.ad_for(url).eval("TransferErrorData")
    assert entry.eval("ErrorType") == "Parameter" and entry.eval("Retryable") == -1
    assert_filter_types(run.ad_for(url))
    assert proxy.connections == 0


@dataclass(frozen=True)
class OtherUser:
    """A Unix user made for the test, and an interpreter with this tree's packages it can run."""

    uid: int
    gid: int
    python: str
    env: Dict[str, str]


@pytest.fixture(scope="module")
def readable_python() -> Iterator[Tuple[str, Dict[str, str]]]:
    """A copy of this interpreter every user can run, and the environment it needs."""
    base = Path(tempfile.mkdtemp(prefix="pcio-python-"))
    base.chmod(0o755)
    try:
        python = portable_python(base / "python")
        paths = f"{Path(__file__).resolve().parents[1]}:{sysconfig.get_paths()['purelib']}"
        yield str(python), {"PYTHONPATH": paths, "LD_LIBRARY_PATH": str(python.parents[1] / "lib")}
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def two_users(readable_python) -> Iterator[Tuple[OtherUser, OtherUser]]:
    """Two new Unix users, removed after the test."""
    with new_users(2) as (a, b):
        yield (OtherUser(a.pw_uid, a.pw_gid, *readable_python), OtherUser(b.pw_uid, b.pw_gid, *readable_python))


@pytest.fixture
def user_sandbox(two_users) -> Iterator[Tuple[Starter, OtherUser, Path]]:
    """(a starter whose sandbox user a owns, a, b's private 0600 credentials file) in a
    directory every user can reach (pytest's own is root's 0700)."""
    a, b = two_users
    top = Path(tempfile.mkdtemp(prefix="pcio-plugin-users-"))
    top.chmod(0o755)
    try:
        sandbox = top / "execute" / "dir_4242"
        sandbox.mkdir(parents=True)
        os.chown(sandbox, a.uid, a.gid)
        theirs = top / "theirs.conf"
        theirs.write_text("[minio]\nendpoint = http://127.0.0.1:9\n[test@minio]\naccess_key = k\nsecret_key = s\n")
        os.chown(theirs, b.uid, b.gid)
        theirs.chmod(0o600)
        yield Starter(Path(PLUGIN_FILE), sandbox, base_env(sandbox)), a, theirs
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_another_users_credentials_file_fails_the_file_naming_it(user_sandbox):
    starter, a, theirs = user_sandbox
    url = "s3://test@minio/bucket/k.dat"
    run = run_plugin(starter, [file_ad(url, str(starter.sandbox / "k.dat"))],
                     dict(starter.env, PEGASUS_CREDENTIALS=str(theirs)), user=a)
    assert run.returncode == 1, run.output  # bad input, as for a group-readable credentials file
    error = run.ad_for(url).eval("TransferError")
    assert str(theirs) in error and "Permission denied" in error, error
    assert_filter_types(run.ad_for(url))
    assert "internal error" not in run.output and "PermissionError" not in run.output, run.output


def test_the_drop_in_names_another_users_credentials_file_in_one_line(user_sandbox):
    starter, a, theirs = user_sandbox
    spec = [{"type": "transfer", "lfn": "k.dat", "id": 1,
             "src_urls": [{"site_label": "minio", "url": "s3://test@minio/bucket/k.dat"}],
             "dest_urls": [{"site_label": "local", "url": f"file://{starter.sandbox}/k.dat"}]}]
    env = dict(starter.env, PEGASUS_CREDENTIALS_minio=str(theirs), **a.env)
    done = subprocess.run([a.python, "-m", "pegasus_cloudio.dropin"], input=json.dumps(spec), env=env,
                          cwd=starter.sandbox, capture_output=True, text=True, timeout=HANG_GUARD_S,
                          user=a.uid, group=a.gid, extra_groups=[])
    assert done.returncode == 1, done.stderr
    assert "internal error" not in done.stderr and "PermissionError" not in done.stderr, done.stderr
    named = [line for line in done.stderr.splitlines() if str(theirs) in line and "Permission denied" in line]
    assert named, done.stderr
    assert not (starter.sandbox / "k.dat").exists()


# --------------------------------------------------------------------------- a throttling store


def test_a_store_that_throttles_to_the_end_gets_a_retryable_answer(starter, counted):
    """Every request answered 503 SlowDown until the plugin gives up: exit 11 (the release
    policy's subcode), and each attempt a retryable Transfer/TooSlow entry."""
    proxy, url = counted
    proxy.set_faults([Fault.status(503, times=1000)])
    # throttle answers spend no attempts: the time bound (300 s by default) ends the retries
    env = dict(starter.env, PEGASUS_CLOUDIO_MAX_ATTEMPTS="2", PEGASUS_CLOUDIO_THROTTLE_TIMEOUT="2")
    run = run_plugin(starter, [file_ad(url, str(starter.sandbox / "k.dat"))], env)
    assert sum(proxy.requests_by_method.values()) >= 2
    assert run.returncode == 11, run.output
    ad = run.ad_for(url)
    assert_filter_types(ad)
    assert "slow down" in ad.eval("TransferError") and "retrying later" in ad.eval("TransferError")
    entries = ad.eval("TransferErrorData")
    assert entries and all(e.eval("Retryable") == 0 and e.eval("ErrorType") == "Transfer"
                           and e.eval("FailureType") == "TooSlow" and e.eval("ErrorCode") == 503 for e in entries)
    assert entries[-1].eval("DeveloperData").eval("ErrorClass") == "Throttled"
    assert not (starter.sandbox / "k.dat").exists()
