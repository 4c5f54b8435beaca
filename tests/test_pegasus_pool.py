"""The real engine: workflows planned by the real ``pegasus-plan`` 5.1.2 (HTCondor code
generator) and run by ``pegasus-run``/DAGMan on a real HTCondor pool, in every mode
``pegasus-cloudio sites`` offers, with the drop-in as users install it on workers: the one-file
worker bundle under the root's Python 3.13 (S3, vm-storage) or our wheel with its extras in a
venv there (GCS, submit-host: google-auth and paramiko).

Per mode, one Montage-like workflow (4 producers x 3 small files, clustered by 2, one concat):
DAGMan ends successfully, the output is byte-exact, and no job ran the stock
``pegasus-transfer``, counted from the kickstart records monitord stored (the executable each
job ran, links resolved), the submit-host ``stage_worker`` job included (the set's Pegasus
overlay puts the shim where ``pegasus-lite-local.sh`` looks first). ``pegasus-statistics`` and
``pegasus-analyzer`` run on the result; a failed stage-in shows in ``pegasus-analyzer`` with our
message."""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from installed import build_sdist_and_wheel
from pegasus_cloudio.testbed.condor_pool import CondorPool
from pegasus_cloudio.testbed.pegasus import ensure_pegasus
from pegasus_cloudio.testbed.pegasus_pool import (
    POOL_PACKAGES,
    PegasusOnPool,
    SshdInRoot,
    invocations,
    stock_calls,
    wheelhouse,
    worker_venv,
)
from pegasus_cloudio.testbed.pegasus_sets import (
    OUTPUT,
    add_montage_like,
    chown_tree,
    expected_concat,
    plan_argv,
    write_set,
)

PRODUCERS, FILES, CLUSTER = 4, 3, 2
TRANSFER_TRANSFORMATIONS = {"pegasus::transfer", "pegasus::dirmanager", "pegasus::cleanup"}


@pytest.fixture(scope="module")
def pegasus_home() -> Path:
    return ensure_pegasus()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_sdist_and_wheel(tmp_path_factory.mktemp("wheel"))[1]


@pytest.fixture(scope="module")
def wheels(wheel: Path, pegasus_home: Path) -> Path:
    return wheelhouse(wheel, "gcs,sftp", pegasus_home.parent)


@pytest.fixture(scope="module")
def pool(pegasus_home: Path, wheel: Path, wheels: Path) -> Iterator[CondorPool]:
    import pip

    binds = [pegasus_home, wheels, Path(pip.__file__).resolve().parent]
    with CondorPool(binds=binds, packages=POOL_PACKAGES) as started:
        yield started


@pytest.fixture(scope="module")
def pegasus(pool: CondorPool, pegasus_home: Path) -> PegasusOnPool:
    return PegasusOnPool(pool, pegasus_home)


@pytest.fixture(scope="module")
def installs(pool: CondorPool, wheel: Path, wheels: Path) -> Dict[str, Path]:
    """Worker installs, as `--install-bin` directories: ``bundle`` and ``venv``."""
    bundle = pool.user_dir("bundle")
    assert _run_ours(["worker-bundle", str(bundle / "pegasus-cloudio-transfer")]) == 0
    venv_bin = worker_venv(pool, pool.user_dir("venv") / "v", wheel, "gcs,sftp", wheels)
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


def _prepare(pegasus: PegasusOnPool, name: str, flags: List[str], *, producers: int = PRODUCERS) -> Path:
    """A run directory with the mode's set (Pegasus on the workers: the tarball) and the workflow."""
    pool = pegasus.pool
    run_dir = pool.user_dir(f"{name}-{uuid.uuid4().hex[:6]}")
    set_dir = run_dir / "set"
    write_set(set_dir, flags + ["--work-dir", str(set_dir), "--worker-pegasus-home", str(pegasus.home)])
    add_montage_like(set_dir, producers, FILES, CLUSTER)
    chown_tree(run_dir, pool.submitter_uid, pool.submitter_gid)
    return set_dir


def _ours(records, set_dir: Path, install_bin: Path) -> List[str]:
    drop_in = os.path.realpath(install_bin / "pegasus-cloudio-transfer")
    shim = os.path.realpath(set_dir / "bin" / "pegasus-transfer")
    return [r.job for r in records if os.path.realpath(r.executable) in (drop_in, shim)]


def _run_and_check(pegasus: PegasusOnPool, set_dir: Path, install_bin: Path, mode: str) -> None:
    started = time.monotonic()
    run = pegasus.plan_and_run(set_dir, plan_argv(set_dir))
    assert run.status == 0, pegasus.tool("analyzer", str(run.submit_dir)).stdout[-4000:]
    assert (set_dir / "outputs" / OUTPUT).read_bytes() == expected_concat(set_dir, PRODUCERS, FILES)
    records = invocations(run.submit_dir)
    transfers = [r for r in records if r.transformation in TRANSFER_TRANSFORMATIONS]
    assert transfers and all(r.exitcode == 0 for r in records), records
    assert stock_calls(records, pegasus.home / "bin" / "pegasus-transfer") == []
    assert sorted(_ours(records, set_dir, install_bin)) == sorted(r.job for r in transfers), transfers
    stats = pegasus.tool("statistics", "-s", "all", str(run.submit_dir))
    assert stats.returncode == 0, stats.stderr
    breakdown = (run.submit_dir / "statistics" / "breakdown.txt").read_text()
    assert "pegasus::transfer" in breakdown
    analyzer = pegasus.tool("analyzer", str(run.submit_dir))
    assert analyzer.returncode == 0 and re.search(r"# jobs failed *: +0 ", analyzer.stdout), analyzer.stdout
    print(f"\n{mode}: {time.monotonic() - started:.1f} s in all; plan {run.plan_s:.1f} s, DAGMan {run.makespan_s:.1f} s, "
          f"{len(records)} kickstart records, {len(transfers)} transfer jobs ours")


def test_cloud_storage_s3(pool, pegasus, installs, minio, bucket):
    creds = _private(pool.shared / f"creds-{bucket}.conf", (
        f"[minio]\nendpoint = {minio.endpoint}\n[test@minio]\naccess_key = {minio.access_key}\n"
        f"secret_key = {minio.secret_key}\n"), pool)
    flags = ["--mode", "cloud-storage", "--provider", "s3", "--bucket", bucket, "--endpoint", minio.endpoint,
             "--identity", "test@minio", "--credentials", str(creds), "--install-bin", str(installs["bundle"])]
    _run_and_check(pegasus, _prepare(pegasus, "s3", flags), installs["bundle"], "cloud-storage s3")


def test_cloud_storage_gcs(pool, pegasus, installs, gcs_server, gcs_bucket, gcs_key):
    key = _private(pool.shared / f"key-{gcs_bucket}.json", gcs_key.path.read_text(), pool)
    boto = _private(pool.shared / f"boto-{gcs_bucket}", f"[Credentials]\ngs_service_key_file = {key}\n", pool)
    flags = ["--mode", "cloud-storage", "--provider", "gcs", "--bucket", gcs_bucket, "--gcs-key", str(key),
             "--boto-config", str(boto), "--gcs-endpoint", gcs_server.endpoint,
             "--install-bin", str(installs["venv"])]
    _run_and_check(pegasus, _prepare(pegasus, "gcs", flags), installs["venv"], "cloud-storage gcs")
    assert gcs_key.grants, "the jobs never asked the key's token endpoint"


def test_vm_storage(pool, pegasus, installs):
    scratch = pool.user_dir(f"vm-scratch-{uuid.uuid4().hex[:6]}")
    flags = ["--mode", "vm-storage", "--vm-scratch", str(scratch), "--install-bin", str(installs["bundle"])]
    _run_and_check(pegasus, _prepare(pegasus, "vm", flags), installs["bundle"], "vm-storage")


def test_submit_host_with_pegasus_from_the_tarball(pool, pegasus, installs, sshd):
    flags = ["--mode", "submit-host", "--submit-host", f"{sshd.user}@127.0.0.1", "--ssh-port", str(sshd.port),
             "--ssh-key", str(sshd.client_key), "--pegasus-bin", str(pegasus.home / "bin"),
             "--install-bin", str(installs["venv"])]
    set_dir = _prepare(pegasus, "scp", flags)
    assert plan_argv(set_dir)[0] == "pegasus/bin/pegasus-plan"
    _run_and_check(pegasus, set_dir, installs["venv"], "submit-host")
    [worker] = [r for r in invocations(set_dir / "submit" / "run") if r.job.startswith("stage_worker_")]
    assert os.path.realpath(worker.executable) == os.path.realpath(set_dir / "bin" / "pegasus-transfer")


def test_failed_stage_in_shows_our_message_in_pegasus_analyzer(pool, pegasus, installs):
    scratch = pool.user_dir(f"vm-fail-{uuid.uuid4().hex[:6]}")
    flags = ["--mode", "vm-storage", "--vm-scratch", str(scratch), "--install-bin", str(installs["bundle"])]
    set_dir = _prepare(pegasus, "fail", flags, producers=1)
    (set_dir / "inputs" / "region.hdr").unlink()
    argv = plan_argv(set_dir)
    argv[1:1] = ["-Ddagman.retry=0"]
    run = pegasus.plan_and_run(set_dir, argv)
    assert run.status != 0
    analyzer = pegasus.tool("analyzer", str(run.submit_dir)).stdout
    missing = f"{set_dir}/inputs/region.hdr"
    [failed] = [r for r in invocations(run.submit_dir) if r.exitcode != 0]
    assert failed.job.startswith("stage_in_") and os.path.realpath(failed.executable) == os.path.realpath(
        installs["bundle"] / "pegasus-cloudio-transfer")
    assert f"ERROR:  read {missing}: no such file or directory" in analyzer, analyzer[-4000:]
