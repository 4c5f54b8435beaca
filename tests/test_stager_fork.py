"""The node stager when it cannot fork: a real limit on its processes (a pids cgroup, as a
systemd unit's ``TasksMax`` makes one; root is not held by ``RLIMIT_NPROC``) makes ``fork``
fail with EAGAIN. The job is refused with one line and runs in its own process; the stager
logs one line and serves the next job once it may fork again."""

import json
import os
import secrets
import subprocess
from contextlib import contextmanager
from pathlib import Path

from pegasus_cloudio.stager import warm as stager_warm
from pegasus_cloudio_testbed.stager import StagerProcess
from test_stager import entry, job_env, run_job, served, wait_for, warm_sources

PIDS_V1 = Path("/sys/fs/cgroup/pids")
UNIFIED = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


def _pids_root():
    """A cgroup directory under which a group with a pids limit can be made (v1's pids
    hierarchy, else a v2 hierarchy with the pids controller)."""
    if (PIDS_V1 / "cgroup.procs").exists():
        return PIDS_V1
    for root in UNIFIED:
        controllers = root / "cgroup.controllers"
        if controllers.exists() and "pids" in controllers.read_text().split():
            (root / "cgroup.subtree_control").write_text("+pids")
            return root
    raise AssertionError("no pids cgroup here to make fork fail (as root, RLIMIT_NPROC does not apply)")


@contextmanager
def pids_group(pid):
    """Process ``pid`` in a new pids cgroup, whose ``pids.max`` file is yielded; on leaving,
    every process in it goes back to its parent group and the group is removed."""
    root = _pids_root()
    group = root / f"pcio-test-{secrets.token_hex(4)}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(pid))
        yield group / "pids.max"
    finally:
        for member in (group / "cgroup.procs").read_text().split():
            try:
                (root / "cgroup.procs").write_text(member)
            except ProcessLookupError:
                pass
        group.rmdir()


def _job(native_dropin, stager, job):
    return subprocess.run([*native_dropin, "-f", "spec.json"], cwd=job, env=job_env(stager.socket_path),
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=120)


def _held_directories(pid):
    """The directories process ``pid`` holds descriptors of."""
    fds = Path(f"/proc/{pid}/fd")
    return {os.readlink(fd) for fd in fds.iterdir() if os.path.isdir(fd)}


def test_a_job_the_stager_cannot_fork_for_runs_itself_and_the_stager_serves_on(native_dropin, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "in.dat").write_bytes(b"input bytes")
    (job / "spec.json").write_text(json.dumps([entry(f"file://{job}/in.dat", f"file://{job}/out.dat")]))
    with StagerProcess() as stager, pids_group(stager.pid) as pids_max:
        pids_max.write_text("1")  # the stager itself: no child more
        refused = _job(native_dropin, stager, job)
        err = refused.stderr.decode()
        assert refused.returncode == 0, err
        assert (job / "out.dat").read_bytes() == b"input bytes"  # by the client itself
        lines = [line for line in err.splitlines() if "node stager" in line]
        assert len(lines) == 1 and "refused the job" in lines[0] and "transferring in this process" in lines[0], err
        assert "Resource temporarily unavailable" in lines[0], err
        wait_for(lambda: "cannot fork" in stager.log_tail(1000), "the stager's line")
        [logged] = [line for line in stager.log_tail(1000).splitlines() if "cannot fork" in line]
        assert "Resource temporarily unavailable" in logged
        assert not served(stager) and str(job) not in _held_directories(stager.pid)

        pids_max.write_text("max")
        (job / "out.dat").unlink()
        done = _job(native_dropin, stager, job)
        assert done.returncode == 0 and b"node stager" not in done.stderr, done.stderr.decode()
        assert (job / "out.dat").read_bytes() == b"input bytes"
        wait_for(lambda: served(stager), "the stager's log line for the served job")
        assert " exited 0 " in served(stager)[-1]


def test_warm_connections_handed_out_for_a_job_that_was_not_forked_stay_the_stagers(native_dropin, proxied, minio,
                                                                                    bucket, tmp_path):
    """The connections the stager handed out for a copy it could not fork carried nothing:
    they stay ready for the next job (none closed, none dialled anew), and that job's request
    goes out on one."""
    proxy, env = proxied
    warm_sources(minio, bucket, tmp_path)

    def job(n, src):
        return run_job(native_dropin, [], job_env(stager.socket_path, **env), tmp_path,
                       stdin=json.dumps([entry(src, f"file://{tmp_path}/out{n}", "minio", "local")]).encode())

    with StagerProcess() as stager, pids_group(stager.pid) as pids_max:
        assert job(0, f"s3://test@minio/{bucket}/obj").returncode == 0  # teaches the stager the endpoint
        wait_for(lambda: proxy.open_connections == stager_warm.PER_ENDPOINT, "the stager's warm connections")
        before = proxy.connections
        pids_max.write_text("1")
        refused = job(1, f"file://{tmp_path}/local")
        assert refused.returncode == 0 and b"cannot fork" in refused.stderr, refused.stderr.decode()
        assert proxy.connections == before and proxy.open_connections == stager_warm.PER_ENDPOINT
        pids_max.write_text("max")
        done = job(2, f"s3://test@minio/{bucket}/obj")
        assert done.returncode == 0 and b"node stager" not in done.stderr, done.stderr.decode()
        assert (tmp_path / "out2").read_bytes() == b"warm bytes"
        # lent both: the stager dialled 2 to stay ready, the job none of its own
        assert proxy.connections - before == stager_warm.PER_ENDPOINT
        wait_for(lambda: len(served(stager)) == 2, "the second served job's line")
