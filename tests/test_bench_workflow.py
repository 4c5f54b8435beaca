"""`pegasus-cloudio bench workflow` runs the DAG in every mode and checks its own result."""

import json
import subprocess
import sys
from pathlib import Path

from pegasus_cloudio_bench.dag import JobTiming, expected_result, montage_like
from pegasus_cloudio_bench.workflow import tail
from pegasus_cloudio_testbed.wheel import installed_bin, source_checkout

REPO = Path(__file__).resolve().parent.parent


def test_montage_like_dag_has_the_example_shape() -> None:
    jobs = montage_like(3, 4, 50)
    assert [j.id for j in jobs] == ["project_0000", "project_0001", "project_0002", "concat"]
    assert jobs[-1].parents == ["project_0000", "project_0001", "project_0002"]
    assert jobs[-1].inputs == [name for job in jobs[:-1] for name in job.outputs]
    assert len(expected_result(jobs, b"H" * 300, 50)) == 3 * 4 * 50


def test_the_tail_is_the_concat_jobs_steps_after_the_last_producer() -> None:
    timings = [JobTiming("project_0000", 0, 0, 0.0, 0.1, 0.6, 0.8), JobTiming("project_0001", 1, 1, 0.0, 0.2, 0.7, 1.0),
               JobTiming("concat", 0, 0, 1.05, 1.25, 1.75, 1.8)]
    assert tail(timings) == {"producers_end_s": 1.0, "wait_s": 0.05, "stage_in_s": 0.2, "compute_s": 0.5,
                             "stage_out_s": 0.05}
    assert tail(timings[:2]) is None  # a run stopped before its concat job


def test_workflow_bench_runs_every_mode_counts_requests_and_extrapolates_stock() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pegasus_cloudio.cli", "bench", "workflow", "--producers", "2", "--files", "8",
         "--compute", "0.05", "--rtt-ms", "4", "--threads", "1", "--stock-budget", "0.001", "--repeats", "2",
         "--json"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["params"]["slots"] == 8 and result["params"]["nodes"] == 4 and result["params"]["cores"] >= 1
    runs = {r["mode"]: r for r in result["runs"]}
    assert set(runs) == {"stock", "go", "per-file", "bundles+cache", "stager", "vm-local"}
    # per file: a header GET and 8 PUTs per producer, 16 GETs and 1 PUT for the concat job
    assert runs["per-file"]["requests"] == 2 * (1 + 8) + 16 + 1
    assert runs["bundles+cache"]["requests"] < runs["per-file"]["requests"]
    # the node stagers ran the same staging (same requests) and their CPU was charged to the jobs
    assert runs["stager"]["requests"] == runs["bundles+cache"]["requests"]
    assert runs["stager"]["stager_cpu_s"] > 0 and runs["bundles+cache"]["stager_cpu_s"] == 0
    assert runs["vm-local"]["requests"] == 0
    assert len(runs["per-file"]["rounds_makespan_s"]) == 2 and len(runs["stock"]["rounds_makespan_s"]) == 1
    assert runs["per-file"]["makespan_s"] == min(runs["per-file"]["rounds_makespan_s"])
    assert all(runs[m]["result_correct"] is True for m in ("go", "per-file", "bundles+cache", "stager", "vm-local"))
    # the Go tool moved the same files (at least as many requests: it may check the bucket) in every round
    assert runs["go"]["requests"] >= runs["per-file"]["requests"] and len(runs["go"]["rounds_makespan_s"]) == 2
    assert result["ratios"]["per-file_vs_go_at_0.05s"] == round(
        runs["per-file"]["makespan_s"] / runs["go"]["makespan_s"], 2)
    assert set(result["tool_startup_s"]) == {"ours", "stock", "go"}
    for mode in ("go", "per-file", "bundles+cache", "stager"):  # the serial end: the concat job's steps
        run, end = runs[mode], runs[mode]["tail"]
        assert end["stage_in_s"] == runs[mode]["concat_stage_in_s"] and end["producers_end_s"] <= run["makespan_s"]
        assert len(run["load_average_1min"]) == 2
    stock = runs["stock"]
    assert stock["extrapolated"] and stock["jobs_run"] < stock["jobs"] == 3
    assert stock["makespan_s"] > stock["measured_s"]
    assert "per-file_vs_vm_local_at_0.05s" in result["ratios"]
    # the stock run stopped before its concat job: its result was never checked, so the target is
    # "not checked" (None), never "met", and the unchecked run is named
    assert stock["result_correct"] is None
    assert result["targets"]["results_correct"] is None
    assert result["results_unchecked"] == ["stock at 0.05 s"]


def test_benchmarks_run_our_commands_from_a_wheel_in_a_fresh_venv_not_the_checkout(tmp_path: Path) -> None:
    bin_dir = Path(installed_bin(str(tmp_path)))
    assert source_checkout() and bin_dir == tmp_path / "venv" / "bin"
    assert (bin_dir / "pegasus-cloudio-transfer").read_bytes()[:4] == b"\x7fELF"  # the native front end
    script = (bin_dir / "pegasus-cloudio-transfer-py").read_text()  # the Python drop-in it execs
    assert script.startswith(f"#!{bin_dir / 'python'}") and "import re" not in script  # the plain script
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    where = subprocess.run([str(bin_dir / "python"), "-c", "import transfer, pegasus_cloudio.stager as s; "
                            "print(transfer.__file__); print(s.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(tmp_path / "venv")) for line in where.stdout.splitlines())
    assert not (REPO / "build").exists()  # the wheel was built from a copy: the checkout is untouched
    version = subprocess.run([str(bin_dir / "pegasus-cloudio-transfer"), "--version"], capture_output=True,
                             text=True, env=env, cwd=tmp_path, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("pegasus-cloudio-transfer ")
