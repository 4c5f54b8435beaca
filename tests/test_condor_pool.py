"""The real HTCondor pool fixture: jobs run as the submitter and their outputs come back;
pools run side by side and leave nothing behind (see bench/pegasus_cloudio_testbed/condor_pool.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from pegasus_cloudio_testbed.condor_pool import CondorPool, PoolError, reap_orphans

JOB = """\
#!/bin/sh
set -e
id -un > who.txt
tr a-z A-Z < in.txt > out.txt
echo "$_CONDOR_SLOT" > slot.txt
"""

SUBMIT = """\
universe = vanilla
executable = job.sh
transfer_input_files = in.txt
should_transfer_files = YES
when_to_transfer_output = ON_EXIT
output = job.out
error = job.err
log = job.log
queue
"""


def _job_dir(pool: CondorPool, name: str) -> Path:
    work = pool.user_dir(name)
    (work / "job.sh").write_text(JOB)
    (work / "job.sh").chmod(0o755)
    (work / "in.txt").write_text("hello pool\n")
    for path in work.iterdir():
        os.chown(path, pool.submitter_uid, pool.submitter_gid)
    return work


def test_vanilla_job_runs_as_submitter_and_returns_output(condor_pool: CondorPool) -> None:
    work = _job_dir(condor_pool, "smoke")
    cluster = condor_pool.submit(SUBMIT, cwd=work)
    ad = condor_pool.wait_done(cluster)
    assert ad["ExitCode"] == "0", ad.get("HoldReason")
    assert ad["Owner"] == '"cloudio"'
    assert (work / "out.txt").read_text() == "HELLO POOL\n"
    assert (work / "who.txt").read_text() == "cloudio\n"
    assert (work / "out.txt").stat().st_uid == condor_pool.submitter_uid
    assert any(name in ad["LastRemoteHost"] for name in condor_pool.startd_names), ad["LastRemoteHost"]


def test_pool_shows_every_slot_of_both_startds(condor_pool: CondorPool) -> None:
    names = condor_pool.run(["condor_status", "-af", "Name"]).stdout.split()
    assert len(names) == 4
    assert {n.split("@")[1] for n in names} == {"node1", "node2"}


def test_bound_directory_is_the_same_inside(condor_pool: CondorPool, tmp_path: Path) -> None:
    outside = tmp_path / "bound"
    condor_pool.bind(outside)
    (outside / "marker").write_text("same\n")
    assert condor_pool.run(["cat", str(outside / "marker")], user="root").stdout == "same\n"


def test_second_pool_runs_beside_and_stops_clean(condor_pool: CondorPool,
                                                 make_condor_pool: Callable[..., CondorPool]) -> None:
    other = make_condor_pool(startds=("solo",), slots=1)
    assert other.port != condor_pool.port
    assert other.run(["condor_status", "-af", "Name"]).stdout.split()[0].startswith("slot1@solo@")
    work = _job_dir(other, "beside")
    ad = other.wait_done(other.submit(SUBMIT, cwd=work))
    assert ad["ExitCode"] == "0" and "solo" in ad["LastRemoteHost"]
    namespace, pool_dir = os.readlink(f"/proc/{other.master_pid}/ns/mnt"), other.dir
    other.stop()
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _ns(pid) == namespace]
    assert left == [] and not pool_dir.exists()
    # the session pool is untouched
    assert len(condor_pool.run(["condor_status", "-af", "Name"]).stdout.split()) == 4


def _ns(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def test_pool_of_a_killed_owner_is_reaped(tmp_path: Path) -> None:
    script = tmp_path / "owner.py"
    script.write_text(
        "import sys, time\n"
        "from pegasus_cloudio_testbed.condor_pool import CondorPool\n"
        "pool = CondorPool(startds=('orphan',), slots=1).start()\n"
        "print(pool.dir, pool.master_pid, flush=True)\n"
        "time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert owner.stdout is not None
    pool_dir, master = owner.stdout.readline().split()
    owner.kill()
    owner.wait()
    assert _running(master)                       # the pool outlives its owner ...
    reaped = reap_orphans(Path(pool_dir).parent)  # ... until the next start reaps it
    assert Path(pool_dir) in reaped and not Path(pool_dir).exists()
    deadline = time.monotonic() + 30
    while _running(master) and time.monotonic() < deadline:
        time.sleep(0.1)   # killed; a zombie until init reaps it
    assert not _running(master)


def _running(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_pool_that_cannot_start_fails_loudly_and_leaves_nothing() -> None:
    broken = CondorPool(startds=("broken",), slots=1, config="COLLECTOR = /bin/false", start_timeout=20)
    base = Path(os.environ.get("PEGASUS_CLOUDIO_POOL_DIR") or "/var/tmp/cloudio-pools")
    before = set(base.glob("pool-*"))
    with pytest.raises(PoolError) as raised:
        broken.start()
    message = str(raised.value)
    assert "not ready in 20 s" in message and "--- MasterLog" in message
    assert not broken.dir.exists() and set(base.glob("pool-*")) <= before
    assert not _running(str(broken.master_pid))
