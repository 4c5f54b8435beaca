"""What the real planner plans in submit-host mode, from its recorded output
(tests/data/planner-submit-host-scp.json: pegasus-plan built from the Pegasus 5.1 source, run on
site-catalogs/submit-host-scp): every job runs the drop-in except the stage-worker job, which
runs `pegasus-transfer` by name under pegasus-lite-local.sh with the set's PATH, whose first
entry holds the shim that execs the drop-in. The checks tie the record to today's generator."""

from __future__ import annotations

import json
from pathlib import Path

from Pegasus import site_catalog

REPO = Path(__file__).resolve().parent.parent
SET = REPO / "site-catalogs" / "submit-host-scp"
RECORD = json.loads((Path(__file__).parent / "data" / "planner-submit-host-scp.json").read_text())
DROP_IN = "/opt/pegasus-cloudio/bin/pegasus-cloudio-transfer"


def _local_path() -> str:
    with open(SET / "sites.yml") as fh:
        return str(site_catalog.load(fh).sites["local"].profiles["env"]["PATH"])


def test_every_planned_transfer_job_but_stage_worker_runs_the_drop_in() -> None:
    jobs = RECORD["jobs"]
    assert {"stage_worker_local_wf_0_local", "create_dir_wf_0_local", "stage_in_local_local_0_0",
            "stage_out_local_local_1_0", "cleanup_wf_0_local"} <= set(jobs)
    for name, job in jobs.items():
        if name.startswith("register_"):
            assert job["runs"] == "PEGASUS_BIN_DIR/pegasus-rc-client"
        elif name.startswith("stage_worker_"):
            assert job["runs"] == "pegasus-transfer" and job["wrapper"] == "pegasus-lite-local.sh"
        else:
            assert job["runs"] == DROP_IN, (name, job)


def test_stage_worker_finds_the_shim_first_on_the_path_the_generator_writes() -> None:
    [job] = [job for name, job in RECORD["jobs"].items() if name.startswith("stage_worker_")]
    assert job["PATH"] == _local_path()  # the record matches what `sites` generates today
    shim_dir = job["PATH"].split(":")[0]
    assert shim_dir == "/home/user/wf/bin"
    shim = (SET / "bin" / "pegasus-transfer").read_text()
    assert shim.startswith("#!/bin/sh") and f'exec {DROP_IN} "$@"' in shim


def test_the_set_readme_states_what_the_planner_does() -> None:
    readme = " ".join((SET / "README.md").read_text().split())
    for fact in ("stage_worker_local_*", "`$PEGASUS_BIN_DIR`", "unless it is `/usr/bin`", "tarball",
                 "Every other job runs the drop-in"):
        assert fact in readme, fact
