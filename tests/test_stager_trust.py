"""The node stager's trust boundaries (``docs/security.md``): its socket is never reached
through another user's symbolic link, and a job that sees another file system (another
mount namespace: a container, HTCondor's MOUNT_UNDER_SCRATCH) is refused with one line and
runs in its own process, where its paths mean what it thinks."""

import json
import os
import signal
import subprocess
import sys

import pytest

from pegasus_cloudio.stager.server import StagerError, listen
from pegasus_cloudio.testbed.stager import StagerProcess
from test_stager import _parts, _stalled_get, entry, job_env, served, wait_for

NOBODY = 65534


def test_a_socket_path_through_another_users_symlink_is_refused(tmp_path):
    """Mallory owns ``link -> dir``: she can point it elsewhere at any time, so the stager
    refuses the path, as the node cache refuses the same layout."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(StagerError, match="symbolic link owned by another user"):
        listen(str(link / "s.sock"))
    assert not (real / "s.sock").exists()
    own = tmp_path / "own"
    own.symlink_to(real)  # a link of one's own is fine
    listen(str(own / "s.sock")).close()


def test_a_job_from_another_mount_namespace_runs_in_its_own_process(native_dropin, tmp_path):
    """The job's cwd and paths are resolved in its mount namespace; the stager would resolve
    them in its own and could write outside the job's sandbox. It refuses, the job says why
    in one line and transfers in-process, and the stager serves no job."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "in.dat").write_bytes(b"input")
    spec = json.dumps([entry(f"file://{job}/in.dat", f"file://{job}/out.dat")])
    with StagerProcess() as stager:
        argv = ["unshare", "--mount", "--propagation", "private", *native_dropin]
        done = subprocess.run(argv, input=spec.encode(), capture_output=True, env=job_env(stager.socket_path),
                              cwd=job, timeout=120)
        err = done.stderr.decode()
        assert done.returncode == 0, err
        assert (job / "out.dat").read_bytes() == b"input"
        refusals = [line for line in err.splitlines() if "refused the job" in line]
        assert len(refusals) == 1 and "another mount namespace" in refusals[0], err
        assert "transferring in this process" in refusals[0]
        assert not served(stager)
        # the same job from this namespace is served by the stager
        done = subprocess.run(native_dropin, input=spec.encode(), capture_output=True, env=job_env(stager.socket_path),
                              cwd=job, timeout=120)
        assert done.returncode == 0 and b"refused" not in done.stderr
        wait_for(lambda: served(stager), "the stager's log line")


def _child_of(pid):
    """The one child process of ``pid`` (as this namespace numbers it), once it exists."""
    found = []

    def one():
        try:
            found[:] = open(f"/proc/{pid}/task/{pid}/children").read().split()
        except OSError:
            return False
        return len(found) == 1
    wait_for(one, f"the child of {pid}")
    return int(found[0])


def test_sigterm_reaches_the_job_of_a_client_in_another_pid_namespace(native_dropin, proxied, minio, bucket,
                                                                       tmp_path):
    """A client in another pid namespace (same file system) numbers processes differently:
    the pid the stager sends names no process there, or another one, so HTCondor's SIGTERM
    to the client would never reach the job. The stager refuses such a job (one line), which
    runs in the client's own process, where SIGTERM ends it as without the stager."""
    proxy, env = proxied
    job, spec = _stalled_get(proxy, minio, bucket, tmp_path)
    with StagerProcess() as stager:
        argv = ["unshare", "--pid", "--fork", "--kill-child", *native_dropin]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, cwd=job,
                                env=job_env(stager.socket_path, **env))
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
        wait_for(lambda: _parts(job) and os.path.getsize(_parts(job)[0]) > 0, "a partial download")
        os.kill(_child_of(proc.pid), signal.SIGTERM)  # the client, pid 1 of its namespace
        try:
            rc = proc.wait(timeout=20)  # the stall lasts 60 s
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail("SIGTERM to the client did not reach its job")
        err = proc.stderr.read().decode()
        assert rc == 1 and "Exiting due to signal 15" in err, err
        refusals = [line for line in err.splitlines() if "refused the job" in line]
        assert len(refusals) == 1 and "another pid namespace" in refusals[0], err
        assert _parts(job) == [] and not (job / "big.dat").exists()
        assert not served(stager)

