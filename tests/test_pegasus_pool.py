"""The real engine: workflows planned by the real ``pegasus-plan`` 5.1.2 (HTCondor code
generator, the plan command of each set's README) and run by ``pegasus-run``/DAGMan on a real
HTCondor pool, in every mode ``pegasus-cloudio sites`` offers, with the drop-in as sites install
it on workers: the one-file worker bundle under the root's Python 3.13 (S3, vm-storage) or our
wheel with its extras in a venv there (GCS, submit-host: google-auth and paramiko).

Cloud-storage mode runs on S3 (MinIO), GCS (fake-gcs-server) and Azure (Azurite); the Azure
jobs read the connection string from the environment the pool's ``STARTER_JOB_ENVIRONMENT``
gives every job, as the Azure set's README tells an administrator to do (Pegasus ships no
Azure credentials).

Per mode, one Montage-like workflow (``examples/montage_like``: 4 producers x 3 small files,
clustered by 2, one concat): DAGMan ends successfully, the output is byte-exact, and every
transfer job ran our drop-in, none the stock ``pegasus-transfer``, counted from the kickstart
records monitord stored (the executable each job ran, links resolved), including the
submit-host ``stage_worker`` job with Pegasus from the tarball (the set's ``pegasus/`` overlay
puts the shim where ``pegasus-lite-local.sh`` looks first). ``pegasus-statistics`` and
``pegasus-analyzer`` work on each run; a failed stage-in shows in ``pegasus-analyzer`` with the
message our drop-in wrote. A sixth run, cloud-storage S3 behind the rate-limiting front
(``ThrottleFront``, issue 37) at a limit below what the workflow offers, ends with the store
having answered throttles and with no job retried or held for them. The seven runs share one pool
and run at once (their DAGMan waits overlap)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import boto3
import pytest
from fixtures_gcs import ServiceAccountKey, service_account_key

from installed import build_sdist_and_wheel
from pegasus_cloudio_testbed.condor_pool import CondorPool
from pegasus_cloudio_testbed.pegasus import ensure_pegasus
from pegasus_cloudio_testbed.pegasus_pool import (
    DAGMAN_CONFIG,
    POOL_PACKAGES,
    DagRun,
    PegasusOnPool,
    SshdInRoot,
    dagman_retries,
    held_jobs,
    invocations,
    stock_calls,
    WORKER_EXTRAS,
    wheelhouse,
    worker_venv,
)
from pegasus_cloudio_testbed.pegasus_sets import (
    OUTPUT,
    add_montage_like,
    chown_tree,
    expected_concat,
    plan_argv,
    write_set,
)
from pegasus_cloudio_testbed.throttle import ThrottleFront

PRODUCERS, FILES, CLUSTER = 4, 3, 2
TRANSFER_TRANSFORMATIONS = {"pegasus::transfer", "pegasus::dirmanager", "pegasus::cleanup"}
# The throttled run's limit per prefix (requests/s, burst as many): below what its jobs offer (a
# stage-in's pipelined pass alone sends several requests at once), which the front's throttled
# count shows; a retry or hold of a job would show in the run's records.
THROTTLE_RATE = 2.0


@pytest.fixture(scope="module")
def pegasus_home() -> Path:
    return ensure_pegasus()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_sdist_and_wheel(tmp_path_factory.mktemp("wheel"))[1]


@pytest.fixture(scope="module")
def wheels() -> Path:
    return wheelhouse()  # fetched by `make pool`


@pytest.fixture(scope="module")
def pool(pegasus_home: Path, wheel: Path, wheels: Path, azurite) -> Iterator[CondorPool]:
    import pip

    binds = [pegasus_home, wheels, Path(pip.__file__).resolve().parent]
    # every job's environment: the Azure credentials, as the Azure set's README says to give them
    azure = f'STARTER_JOB_ENVIRONMENT = "AZURE_STORAGE_CONNECTION_STRING={azurite.connection_string}"'
    with CondorPool(binds=binds, packages=POOL_PACKAGES, config=f"{DAGMAN_CONFIG}\n{azure}") as started:
        yield started


@pytest.fixture(scope="module")
def pegasus(pool: CondorPool, pegasus_home: Path) -> PegasusOnPool:
    return PegasusOnPool(pool, pegasus_home)


@pytest.fixture(scope="module")
def installs(pool: CondorPool, wheel: Path, wheels: Path) -> Dict[str, Path]:
    """Worker installs, as `--install-bin` directories: ``bundle`` and ``venv``."""
    bundle = pool.user_dir("bundle")
    assert _run_ours(["worker-bundle", str(bundle / "pegasus-cloudio-transfer")]) == 0
    venv_bin = worker_venv(pool, pool.user_dir("venv") / "v", wheel, ",".join(WORKER_EXTRAS), wheels)
    chown_tree(bundle, pool.submitter_uid, pool.submitter_gid)
    return {"bundle": bundle, "venv": venv_bin}


@pytest.fixture(scope="module")
def sshd(pool: CondorPool) -> Iterator[SshdInRoot]:
    server = SshdInRoot(pool, pool.shared / "sshd").start()
    yield server
    server.stop()


def _run_ours(args: List[str]) -> int:
    import subprocess

    return subprocess.run([str(Path(sys.executable).parent / "pegasus-cloudio"), *args],
                          capture_output=True, timeout=300).returncode


def _private(path: Path, text: str, pool: CondorPool) -> Path:
    path.write_text(text)
    os.chown(path, pool.submitter_uid, pool.submitter_gid)
    os.chmod(path, 0o600)
    return path


def _prepare(pegasus: PegasusOnPool, name: str, flags: List[str], producers: int = PRODUCERS) -> Path:
    """A run directory with the mode's set (Pegasus on the workers: the tarball) and the workflow."""
    pool = pegasus.pool
    run_dir = pool.user_dir(f"{name}-{uuid.uuid4().hex[:6]}")
    set_dir = run_dir / "set"
    write_set(set_dir, flags + ["--work-dir", str(set_dir), "--worker-pegasus-home", str(pegasus.home)])
    add_montage_like(set_dir, producers, FILES, CLUSTER)
    chown_tree(run_dir, pool.submitter_uid, pool.submitter_gid)
    return set_dir


def _s3_flags(pool: CondorPool, minio, endpoint: Optional[str] = None) -> List[str]:
    """A fresh bucket on ``minio``, which the jobs reach at ``endpoint`` (default MinIO's own)."""
    bucket = f"wf-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                 aws_secret_access_key=minio.secret_key, region_name="us-east-1").create_bucket(Bucket=bucket)
    endpoint = endpoint or minio.endpoint
    creds = _private(pool.shared / f"creds-{bucket}.conf", (
        f"[minio]\nendpoint = {endpoint}\n[test@minio]\naccess_key = {minio.access_key}\n"
        f"secret_key = {minio.secret_key}\n"), pool)
    return ["--mode", "cloud-storage", "--provider", "s3", "--bucket", bucket, "--endpoint", endpoint,
            "--identity", "test@minio", "--credentials", str(creds)]


def _gcs_flags(pool: CondorPool, gcs_server, key: ServiceAccountKey) -> List[str]:
    bucket = f"wf-{uuid.uuid4().hex[:12]}"
    gcs_server.create_bucket(bucket)
    boto = _private(pool.shared / f"boto-{bucket}", f"[Credentials]\ngs_service_key_file = {key.path}\n", pool)
    return ["--mode", "cloud-storage", "--provider", "gcs", "--bucket", bucket, "--gcs-key", str(key.path),
            "--boto-config", str(boto), "--gcs-endpoint", gcs_server.endpoint]


def _azure_flags(azurite) -> List[str]:
    """A fresh container on ``azurite``; the jobs take its credentials from their environment."""
    from azure.storage.blob import BlobServiceClient

    container = f"wf-{uuid.uuid4().hex[:12]}"
    BlobServiceClient.from_connection_string(azurite.connection_string).create_container(container)
    return ["--mode", "cloud-storage", "--provider", "azure", "--account", azurite.account, "--bucket", container]


def _vm_flags(pool: CondorPool) -> List[str]:
    return ["--mode", "vm-storage", "--vm-scratch", str(pool.user_dir(f"vm-scratch-{uuid.uuid4().hex[:6]}"))]


@dataclass
class Planned:
    """One mode's run: its set, the install its jobs ran, the DAG run (or what went wrong)."""

    set_dir: Path
    install_bin: Path
    run: Optional[DagRun] = None
    error: Optional[BaseException] = None
    seconds: float = 0.0

    def result(self) -> DagRun:
        if self.error is not None:
            raise self.error
        assert self.run is not None
        return self.run


@pytest.fixture(scope="module")
def gcs_sa_key(pool: CondorPool) -> Iterator[ServiceAccountKey]:
    with service_account_key(pool.shared / "sa-key.json") as key:
        os.chown(key.path, pool.submitter_uid, pool.submitter_gid)
        yield key


@pytest.fixture(scope="module")
def front(minio) -> Iterator[ThrottleFront]:
    """MinIO behind the rate-limiting front (S3's 503 SlowDown), for the throttled run alone."""
    with ThrottleFront(minio.host, minio.port, rate=THROTTLE_RATE) as started:
        yield started


@pytest.fixture(scope="module")
def runs(pegasus: PegasusOnPool, installs, sshd, minio, gcs_server, gcs_sa_key, azurite,
         front: ThrottleFront) -> Dict[str, Planned]:
    """Every mode (and a failing stage-in, and S3 behind the throttling front) planned and run at
    once on the pool: DAGMan's waits overlap, so the module costs about one workflow's time, not seven."""
    pool = pegasus.pool
    scp = ["--mode", "submit-host", "--submit-host", f"{sshd.user}@127.0.0.1", "--ssh-port", str(sshd.port),
           "--ssh-key", str(sshd.client_key), "--pegasus-bin", str(pegasus.home / "bin")]
    modes = {"s3": (_s3_flags(pool, minio), "bundle"), "gcs": (_gcs_flags(pool, gcs_server, gcs_sa_key), "venv"),
             "azure": (_azure_flags(azurite), "bundle"), "vm": (_vm_flags(pool), "bundle"), "scp": (scp, "venv"), "fail": (_vm_flags(pool), "bundle"),
             "throttled": (_s3_flags(pool, minio, front.endpoint), "bundle")}
    planned = {name: Planned(_prepare(pegasus, name, flags + ["--install-bin", str(installs[kind])],
                                      1 if name == "fail" else PRODUCERS), installs[kind])
               for name, (flags, kind) in modes.items()}
    (planned["fail"].set_dir / "inputs" / "region.hdr").unlink()
    with ThreadPoolExecutor(len(planned)) as workers:
        for name, job in zip(planned, workers.map(lambda n: _plan_and_run(pegasus, n, planned[n]), planned)):
            assert job is planned[name]
    return planned


def _plan_and_run(pegasus: PegasusOnPool, name: str, planned: Planned) -> Planned:
    started = time.monotonic()
    argv = plan_argv(planned.set_dir)
    if name == "fail":
        argv[1:1] = ["-Ddagman.retry=0"]
    try:
        planned.run = pegasus.plan_and_run(planned.set_dir, argv, timeout=1200)
    except Exception as err:  # noqa: BLE001 - reported by the mode's own test
        planned.error = err
    planned.seconds = time.monotonic() - started
    return planned


def _ours(records, set_dir: Path, install_bin: Path) -> List[str]:
    drop_in = os.path.realpath(install_bin / "pegasus-cloudio-transfer")
    shim = os.path.realpath(set_dir / "bin" / "pegasus-transfer")
    return [r.job for r in records if os.path.realpath(r.executable) in (drop_in, shim)]


def _failed_jobs(submit_dir: Path, records) -> str:  # type: ignore[no-untyped-def]
    """The records that did not exit 0, each with the end of its job's output files (what our
    drop-in said), for an assertion's message."""
    lines = []
    for record in (r for r in records if r.exitcode != 0):
        lines.append(repr(record))
        outputs = [p for p in sorted(submit_dir.rglob(f"{record.job}.*")) if re.search(r"\.(out|err)\.\d+$", p.name)]
        for path in outputs[-4:]:  # the last tries' stdout and stderr
            lines.append(f"--- {path.name}: " + path.read_text(errors="replace")[-1500:])
    return "\n".join(lines)


def _check(pegasus: PegasusOnPool, planned: Planned, mode: str) -> None:
    run = planned.result()
    set_dir = planned.set_dir
    assert run.status == 0, pegasus.tool("analyzer", str(run.submit_dir)).stdout[-4000:]
    assert (set_dir / "outputs" / OUTPUT).read_bytes() == expected_concat(set_dir, PRODUCERS, FILES)
    records = invocations(run.submit_dir)
    transfers = [r for r in records if r.transformation in TRANSFER_TRANSFORMATIONS]
    assert transfers and all(r.exitcode == 0 for r in records), _failed_jobs(run.submit_dir, records)
    assert stock_calls(records, pegasus.home / "bin" / "pegasus-transfer") == []
    assert sorted(_ours(records, set_dir, planned.install_bin)) == sorted(r.job for r in transfers), transfers
    stats = pegasus.tool("statistics", "-s", "all", str(run.submit_dir))
    assert stats.returncode == 0, stats.stderr
    breakdown = (run.submit_dir / "statistics" / "breakdown.txt").read_text()
    assert "pegasus::transfer" in breakdown
    analyzer = pegasus.tool("analyzer", str(run.submit_dir))
    assert analyzer.returncode == 0 and re.search(r"# jobs failed *: +0 ", analyzer.stdout), analyzer.stdout
    print(f"\n{mode}: {planned.seconds:.1f} s planned and run (concurrently with the other modes); plan "
          f"{run.plan_s:.1f} s, DAGMan {run.makespan_s:.1f} s, {len(records)} kickstart records, "
          f"{len(transfers)} transfer jobs, all ours")


def test_cloud_storage_s3(pegasus, runs):
    _check(pegasus, runs["s3"], "cloud-storage s3")


def test_cloud_storage_gcs(pegasus, runs, gcs_sa_key):
    _check(pegasus, runs["gcs"], "cloud-storage gcs")
    assert gcs_sa_key.grants, "the jobs never asked the key's token endpoint"


def test_cloud_storage_azure(pegasus, runs, azurite):
    """The Azure set on the pool: the workflow's files went through Azurite (every stage-in job
    stages to ``az://``, and the compute jobs read their inputs from there), moved by the
    drop-in (the one-file bundle) with the credentials the pool's configuration gave the jobs."""
    _check(pegasus, runs["azure"], "cloud-storage azure")
    submit_dir = runs["azure"].result().submit_dir
    stage_ins = [json.loads(p.read_text()) for p in submit_dir.rglob("stage_in_*.in")]
    dests = [u["url"] for entries in stage_ins for e in entries for u in e.get("dest_urls", [])]
    assert dests and all(u.startswith(f"az://{azurite.account}/wf-") for u in dests), dests


def test_vm_storage(pegasus, runs):
    _check(pegasus, runs["vm"], "vm-storage")


def test_submit_host_with_pegasus_from_the_tarball(pegasus, runs):
    set_dir = runs["scp"].set_dir
    assert plan_argv(set_dir)[0] == "pegasus/bin/pegasus-plan"
    readme = " ".join((set_dir / "README.md").read_text().split())
    for fact in ("`stage_worker_local_*`", "`$PEGASUS_BIN_DIR`", "unless it is `/usr/bin`", "tarball", "`--pegasus-bin`"):
        assert fact in readme, fact
    _check(pegasus, runs["scp"], "submit-host")
    [worker] = [r for r in invocations(runs["scp"].result().submit_dir) if r.job.startswith("stage_worker_")]
    assert os.path.realpath(worker.executable) == os.path.realpath(set_dir / "bin" / "pegasus-transfer")


def test_failed_stage_in_shows_our_message_in_pegasus_analyzer(pegasus, runs):
    planned = runs["fail"]
    run = planned.result()
    assert run.status != 0
    analyzer = pegasus.tool("analyzer", str(run.submit_dir)).stdout
    missing = f"{planned.set_dir}/inputs/region.hdr"
    [failed] = [r for r in invocations(run.submit_dir) if r.exitcode != 0]
    assert failed.job.startswith("stage_in_")
    assert os.path.realpath(failed.executable) == os.path.realpath(planned.install_bin / "pegasus-cloudio-transfer")
    assert f"ERROR:  read {missing}: no such file or directory" in analyzer, analyzer[-4000:]


def test_cloud_storage_s3_behind_a_throttling_store_retries_no_job(pegasus, runs, front: ThrottleFront):
    """Issue 37: the workflow behind the front at a limit below its offered load succeeds, the
    store answered throttles, and DAGMan retried no job and HTCondor held none (the drop-ins
    waited the throttling out within their time bound)."""
    _check(pegasus, runs["throttled"], "cloud-storage s3 behind the throttling front")
    stats = front.stats()
    assert int(stats["throttled"]) > 0, stats  # the limit was below what the workflow offered
    submit_dir = runs["throttled"].result().submit_dir
    assert dagman_retries(submit_dir) == {} and held_jobs(submit_dir) == [], (
        dagman_retries(submit_dir), held_jobs(submit_dir))
    print(f"throttled at {THROTTLE_RATE:g} requests/s per prefix: {stats['requests']} requests, "
          f"{stats['throttled']} answered 503 SlowDown, 0 job retries, 0 holds")

