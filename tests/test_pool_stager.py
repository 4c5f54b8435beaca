"""The node stager beside a real condor_starter (issue #20, item 5).

A stager started by a job dies with the job (the starter kills the job's process tree), so a
site runs it as a service of the job's user, outside HTCondor (docs/user-guide.md, section
5); here the test starts it the way a service manager would. Jobs handed to it behave as
in-process: the same exit codes and messages, and ``condor_rm`` or ``condor_vacate_job`` in
the middle of a download stop the stager's copy running the job, leave no partial file, and
leave the stager serving (a vacated job runs again and completes).
"""

from __future__ import annotations

import http.server
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List

import pytest

from pegasus_cloudio_testbed.condor_pool import CondorPool

MiB = 1 << 20
_STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
SIZE = 8 * MiB
SOCKET = "/home/cloudio/.cache/pegasus-cloudio/stager.sock"
JOB_ENV = {"PEGASUS_CLOUDIO_CONFIG": "/dev/null", "PEGASUS_CLOUDIO_CACHE_DIR": "off",
           "AWS_EC2_METADATA_DISABLED": "true"}


class SlowSource(http.server.ThreadingHTTPServer):
    """``GET /big.dat`` on loopback: the first ``stalls`` requests send 1 MiB, then wait until
    `release` (or 120 s); the others send everything."""

    def __init__(self, data: bytes) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.data = data
        self.stalls = 0
        self.requests = 0
        self.released = threading.Event()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/big.dat"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: SlowSource

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        src = self.server
        src.requests += 1
        if self.path != "/big.dat":
            self.send_error(404)
            return
        stall = src.stalls > 0
        src.stalls -= 1 if stall else 0
        self.send_response(200)
        self.send_header("Content-Length", str(len(src.data)))
        self.end_headers()
        try:
            self.wfile.write(src.data[:MiB])
            self.wfile.flush()
            if stall:
                src.released.wait(120)
            self.wfile.write(src.data[MiB:])
        except OSError:
            pass  # the job went away

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def source() -> Iterator[SlowSource]:
    server = SlowSource(os.urandom(SIZE))
    yield server
    server.released.set()
    server.shutdown()


@pytest.fixture(scope="module")
def stager(condor_pool: CondorPool, pool_bin: Path) -> Iterator[Path]:
    """A stager run as the submitter beside the pool (as a systemd unit would); its log."""
    log = condor_pool.user_dir("stager-service") / "stager.log"
    with open(log, "wb") as out:
        proc = condor_pool.popen([str(pool_bin / "pegasus-cloudio"), "stager", "--socket", SOCKET],
                                 stdout=out, stderr=out)
    _wait_for(lambda: " stager: serving " in log.read_text(), "the stager to serve", log)
    yield log
    proc.terminate()
    proc.wait(timeout=30)


def _wait_for(predicate: Callable[[], object], what: str, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; {log}:\n{log.read_text()[-2000:]}")
        time.sleep(0.1)


def _served(log: Path) -> List[str]:
    return [line for line in log.read_text().splitlines() if " job pid " in line]


def _job(pool: CondorPool, bin_dir: Path, name: str, src: str, dest: str, stager: bool) -> Path:
    """A job dir whose job copies ``src`` to ``dest`` (a name in the job dir) with the drop-in."""
    work = pool.user_dir(name)
    (work / "spec.json").write_text(json.dumps([_entry(src, f"file://{work}/{dest}")]))
    env = dict(JOB_ENV, **({"PEGASUS_CLOUDIO_STAGER": SOCKET} if stager else {}))
    (work / "job.sub").write_text(
        "universe = vanilla\n"
        f"executable = {bin_dir}/pegasus-cloudio-transfer\narguments = -f spec.json\n"
        "transfer_executable = false\nshould_transfer_files = NO\n"
        "output = job.out\nerror = job.err\nlog = job.log\n"
        f"environment = \"{' '.join(f'{k}={v}' for k, v in env.items())}\"\nqueue\n")
    for path in work.iterdir():
        os.chown(path, pool.submitter_uid, pool.submitter_gid)
    return work


def _entry(src: str, dst: str) -> Dict[str, object]:
    return {"type": "transfer", "src_urls": [{"site_label": "web", "url": src}],
            "dest_urls": [{"site_label": "local", "url": dst}]}


def _submit(pool: CondorPool, work: Path) -> int:
    return pool.submit((work / "job.sub").read_text(), cwd=work)


def _parts(work: Path) -> List[Path]:
    return [p for p in work.rglob("*") if p.name.endswith(".part")]


def test_a_stager_started_by_a_job_dies_with_the_job(condor_pool: CondorPool, pool_bin: Path) -> None:
    work = condor_pool.user_dir("stager-in-a-job")
    (work / "job.sh").write_text(
        "#!/bin/sh\n"
        f"{pool_bin}/pegasus-cloudio stager --socket {work}/s/stager.sock > {work}/stager.log 2>&1 &\n"
        "echo $! > stager.pid\n"
        f"for i in $(seq 300); do [ -S {work}/s/stager.sock ] && exit 0; sleep 0.1; done\nexit 3\n")
    (work / "job.sh").chmod(0o755)
    os.chown(work / "job.sh", condor_pool.submitter_uid, condor_pool.submitter_gid)
    cluster = condor_pool.submit(f"executable = {work}/job.sh\ntransfer_executable = false\n"
                                 f"should_transfer_files = NO\ninitialdir = {work}\nlog = job.log\nqueue\n", cwd=work)
    assert condor_pool.wait_done(cluster)["ExitCode"] == "0"
    pid = (work / "stager.pid").read_text().strip()
    _wait_for(lambda: not _alive(pid), "the starter to kill the job's stager", work / "stager.log")


def _alive(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_jobs_handed_to_the_stager_exit_as_in_process(condor_pool: CondorPool, pool_bin: Path, stager: Path,
                                                      source: SlowSource) -> None:
    before = len(_served(stager))
    results = {}
    for mode in ("in-process", "stager"):
        good = _job(condor_pool, pool_bin, f"good-{mode}", source.url, "copy.dat", mode == "stager")
        bad = _job(condor_pool, pool_bin, f"bad-{mode}", source.url.replace("big", "absent"), "x.dat",
                   mode == "stager")
        ads = [condor_pool.wait_done(_submit(condor_pool, w)) for w in (good, bad)]
        results[mode] = [(ad["ExitCode"], _error_lines(w)) for ad, w in zip(ads, (good, bad))]
        assert (good / "copy.dat").read_bytes() == source.data
        assert not (bad / "x.dat").exists() and _parts(bad) == []
    assert results["stager"] == results["in-process"]
    assert [code for code, _ in results["stager"]] == ["0", "1"]
    assert any("absent.dat" in line for line in results["stager"][1][1]), results
    assert len(_served(stager)) == before + 2   # both stager jobs ran in it, none fell back
    assert not any("node stager" in line for _, lines in results["stager"] for line in lines)


def _error_lines(work: Path) -> List[str]:
    """The job's error lines (stderr), without their timestamps."""
    lines = [_STAMP.sub("", line) for line in (work / "job.err").read_text().splitlines()]
    return [line for line in lines if "ERROR" in line or "CRITICAL" in line or "absent" in line]


@pytest.mark.parametrize("evict", ["condor_rm", "condor_vacate_job"])
def test_an_evicted_job_stops_its_stager_copy_and_leaves_no_partial_file(
        condor_pool: CondorPool, pool_bin: Path, stager: Path, source: SlowSource, evict: str) -> None:
    job_dir = _job(condor_pool, pool_bin, f"evicted-{evict}", source.url, "big.dat", True)
    before = len(_served(stager))
    source.released.clear()
    source.stalls = 1
    cluster = _submit(condor_pool, job_dir)
    _wait_for(lambda: _parts(job_dir) and _parts(job_dir)[0].stat().st_size > 0, "a partial download", stager)
    condor_pool.run([evict, str(cluster)], cwd=job_dir)
    _wait_for(lambda: len(_served(stager)) > before, "the stager's copy to end", stager)
    assert " exited 1 " in _served(stager)[before]
    if evict == "condor_rm":
        condor_pool.wait_done(cluster)
        assert _parts(job_dir) == [] and not (job_dir / "big.dat").exists()
    else:  # back to idle, matched again, and this time the source answers in full
        ad = condor_pool.wait_done(cluster)
        assert ad["ExitCode"] == "0" and int(ad["NumJobStarts"]) >= 2
        assert (job_dir / "big.dat").read_bytes() == source.data and _parts(job_dir) == []
    source.released.set()
