"""``pegasus-cloudio sites --provider azure`` planned by the real ``pegasus-plan`` 5.1.2, and
the jobs it plans run by our drop-in on a real Azurite.

The planner accepts ``az://`` file servers (its URL parser takes any ``WORD://`` scheme, and it
asks for no credential file for a scheme it has no handler for): site selection, transfer
refinement, create-dir and cleanup planning all finish and write every job's input. Only
its last step, writing the DAG's submit file, needs HTCondor's ``condor_submit_dag``, which on
this machine lives in the pool's root (``make pool``; ``tests/test_pegasus_pool.py`` runs the
S3, GCS and Azure sets there, the Azure one through DAGMan on Azurite): outside it the plan stops at that step, named exactly, and the test
then runs the planned create-dir, stage-in and stage-out inputs with our drop-in, as the jobs
would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from pegasus_cloudio_testbed.pegasus import ensure_pegasus
from pegasus_cloudio_testbed.pegasus_sets import add_montage_like, plan_argv, write_set

DROPIN = [sys.executable, "-m", "pegasus_cloudio.dropin"]
NO_CONDOR = "Unable to find path to condor_submit_dag"


@pytest.fixture(scope="module")
def pegasus_home() -> Path:
    return ensure_pegasus()


def _plan(pegasus_home: Path, set_dir: Path, home: Path) -> subprocess.CompletedProcess:
    argv = [a for a in plan_argv(set_dir) if a != "--submit"]  # the README's command, not submitted
    path = f"{Path(sys.executable).parent}:{pegasus_home / 'bin'}:/usr/bin:/bin"  # Pegasus's Python deps first
    return subprocess.run([str(pegasus_home / "bin" / argv[0]), *argv[1:]], cwd=set_dir, capture_output=True,
                          text=True, timeout=600, env={"PATH": path, "HOME": str(home), "LANG": "C.UTF-8"})


def _inputs(submit: Path, prefix: str) -> List[Path]:
    return sorted(submit.rglob(f"{prefix}*.in"))


def test_the_planner_plans_an_azure_set_and_its_jobs_run_on_azurite(pegasus_home, azurite, azure_env,
                                                                  azure_container, azure_sdk, tmp_path) -> None:
    set_dir = tmp_path / "set"
    write_set(set_dir, ["--mode", "cloud-storage", "--provider", "azure", "--account", azurite.account,
                        "--bucket", azure_container, "--prefix", "scratch"])
    add_montage_like(set_dir, producers=2, files=3, cluster_size=2)
    (tmp_path / "home").mkdir()
    done = _plan(pegasus_home, set_dir, tmp_path / "home")
    out = done.stdout + done.stderr
    assert "credential" not in out.lower(), out[-3000:]
    assert done.returncode == 0 or NO_CONDOR in out, out[-3000:]  # 0 where HTCondor is installed
    submit = set_dir / "submit"
    base = f"az://{azurite.account}/{azure_container}/scratch/"
    mkdirs, stage_ins, stage_outs = (_inputs(submit, p) for p in ("create_dir_", "stage_in_", "stage_out_"))
    assert mkdirs and stage_ins and stage_outs, sorted(p.name for p in submit.rglob("*.in"))
    planned = [json.loads(p.read_text()) for p in mkdirs + stage_ins + stage_outs]
    assert all(u["url"].startswith(base) for entries in planned for e in entries
               for u in ([e["target"]] if e["type"] == "mkdir" else e["src_urls"] + e["dest_urls"])
               if u["site_label"] == "azurestaging")
    for path in mkdirs + stage_ins:  # what the create-dir and stage-in jobs run, in that order
        ran = subprocess.run(DROPIN, stdin=path.open(), capture_output=True, text=True, timeout=300,
                             env=dict(azure_env, PATH=os.environ["PATH"]), cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr
    staged = {e["lfn"] for p in stage_ins for e in json.loads(p.read_text())}
    listed = "\n".join(b.name for b in azure_sdk.list_blobs("scratch/"))
    assert all(lfn in listed for lfn in staged), (staged, listed)  # as blobs or bundle members
