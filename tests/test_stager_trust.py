"""The node stager's trust boundaries (``docs/security.md``): its socket is never reached
through another user's symbolic link, and a job that sees another file system (another
mount namespace: a container, HTCondor's MOUNT_UNDER_SCRATCH) is refused with one line and
runs in its own process, where its paths mean what it thinks."""

import json
import os
import subprocess
import sys

import pytest

from pegasus_cloudio.stager.server import StagerError, listen
from pegasus_cloudio.testbed.stager import StagerProcess
from test_stager import entry, job_env, served, wait_for

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
