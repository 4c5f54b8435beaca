"""`pegasus-cloudio bench throttle` (issue 37): the scenario at N = 3, its wave runner, and the model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from pegasus_cloudio_bench.throttle_jobs import Job, run_wave
from pegasus_cloudio_bench.throttle_model import Client, Limit, calibrate, simulate


def bench(*args: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "bench", "throttle", *args],
                          capture_output=True, text=True, timeout=900)


def runs_of(done: subprocess.CompletedProcess) -> Dict[str, Dict[str, Any]]:  # type: ignore[type-arg]
    assert done.returncode == 0, done.stderr[-3000:]
    return {run["name"]: run for run in json.loads(done.stdout)["runs"]}


def test_every_tool_and_way_of_reading_delivers_every_file_and_counts_its_requests() -> None:
    runs = runs_of(bench("--jobs", "3", "--files", "12", "--rate", "5000", "--burst", "5000", "--objects", "shared",
                         "--stager", "off,on", "--reuse", "plain,bundles,cache", "--json"))
    assert set(runs) == {"ours", "ours (bundles)", "ours (cache)", "ours (stager)", "ours (bundles, stager)",
                         "ours (cache, stager)", "s5cmd", "stock"}
    for name, run in runs.items():
        assert (run["jobs_failed"], run["files_missing"], run["throttled"]) == (0, 0, 0), (name, run)
        assert run["wall_s"] >= run["slowest_job_s"] > 0
    assert runs["ours"]["served"] == 3 * 12                              # one GET per file
    assert runs["s5cmd"]["served"] == 2 * 3 * 12                         # a HEAD and a GET per file
    assert runs["ours (bundles)"]["served"] <= 3 * 3                     # a LIST and the bundle, per job
    # the node's jobs share the GETs, but only those that start after another job's answer: a
    # small file the pipelined pass reads enters the cache behind the job's answer, so jobs
    # released at one instant on a loaded machine each read it (docs/cache.md)
    assert runs["ours (cache)"]["served"] <= runs["ours"]["served"]


def test_a_throttling_front_shows_in_the_503_share_and_each_job_is_checked() -> None:
    runs = runs_of(bench("--jobs", "3", "--files", "30", "--rate", "5", "--burst", "5", "--tools", "ours",
                         "--objects", "distinct", "--json"))
    ours = runs["ours"]
    assert ours["throttled"] > 0 and ours["share_503"] == round(ours["throttled"] / ours["requests"], 3)
    assert ours["served"] >= 3 * 30 - ours["files_missing"]
    assert ours["floor_s"] == 3 * 30 / 5
    assert (ours["jobs_failed"] > 0) == (ours["files_missing"] > 0 or bool(ours["first_error"]))


def test_stage_out_waves_upload_every_file_through_the_front_and_check_it() -> None:
    """``--direction out``: each job's uploads through the throttling front (the pipelined PUT
    pass of ours), read back from the store and checked: 0 failed at a rate that throttles."""
    runs = runs_of(bench("--jobs", "3", "--files", "30", "--rate", "20", "--burst", "20", "--tools", "ours,s5cmd",
                         "--objects", "distinct", "--direction", "out", "--json"))
    for name in ("ours", "s5cmd"):
        run = runs[name]
        assert (run["jobs_failed"], run["files_missing"]) == (0, 0), (name, run)
        assert run["throttled"] > 0 and run["served"] >= 3 * 30, (name, run)
        assert sum(run["throttled_by_second"]) == run["throttled"] >= run["throttled_first_20s"] > 0, (name, run)


def test_jobs_on_namespace_nodes_share_the_pool_limiter_on_redis() -> None:
    """Two nodes in network namespaces, two jobs each on one prefix the front throttles: the
    jobs reach the front and the Redis on the bridge, the pool limiter holds the prefix there
    (one shared state, not a node rate file each), and every file arrives."""
    runs = runs_of(bench("--nodes", "2", "--jobs", "4", "--files", "20", "--rate", "20", "--burst", "20",
                         "--tools", "ours", "--objects", "shared", "--json"))
    ours = runs["ours"]
    assert (ours["jobs_failed"], ours["files_missing"]) == (0, 0), ours
    assert ours["throttled"] > 0 and ours["served"] >= 4 * 20, ours
    assert (ours["nodes"], ours["pool_keys"], ours["node_rate_files"]) == (2, 1, 0), ours


@pytest.mark.parametrize("flags,message", [
    (["--tools", "ours,azcopy"], "--tools must name only ours, s5cmd, stock"),
    (["--jobs", "10,0"], "--jobs counts must be at least 1"),
    (["--jobs", "ten"], "--jobs must be comma-separated whole numbers"),
    (["--measured", "x.json"], "--measured needs --model"),
    (["--nodes", "9", "--tools", "ours"], "--nodes must be 0 (none) or 1 to 8"),
    (["--nodes", "2"], "--nodes needs --tools ours"),
    (["--pool-share", "0"], "--pool-share must be above 0 and at most 1"),
    (["--direction", "sideways"], "--direction must be in or out"),
    (["--direction", "out", "--objects", "shared"], "--direction out needs --objects distinct"),
])
def test_bad_flags_are_one_line_each_and_run_nothing(flags: List[str], message: str) -> None:
    done = bench(*flags)
    assert done.returncode == 2 and message in done.stderr and "installing" not in done.stderr


def test_bench_pool_refuses_a_negative_throttle_and_runs_nothing() -> None:
    """``bench pool --throttle RATE`` (the workflow behind the front) checks its rate first."""
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "bench", "pool", "--throttle", "-1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--throttle must be a rate >= 0 (0: no front), not -1.0" in done.stderr
    assert "installing" not in done.stderr and done.stdout == ""


def test_a_job_that_exits_zero_with_a_wrong_file_counts_as_failed(tmp_path: Path) -> None:
    want = tmp_path / "want"
    want.write_bytes(b"right")
    jobs = [Job(["sh", "-c", f"printf {text} > {tmp_path}/{name}"], b"", {"PATH": "/usr/bin:/bin"},
                {str(tmp_path / name): str(want)}) for name, text in (("a", "right"), ("b", "wrong"), ("c", "right"))]
    jobs.append(Job(["sh", "-c", "exit 3"], b"", {"PATH": "/usr/bin:/bin"}, {}))
    wave = run_wave(jobs, timeout_s=60)
    assert [job.missing for job in wave.jobs] == [0, 1, 0, 0]
    assert [job.exit_code for job in wave.jobs] == [0, 0, 0, 3]
    assert (wave.failed, wave.missing) == (2, 1)


def test_a_job_past_the_deadline_is_killed_and_fails(tmp_path: Path) -> None:
    wave = run_wave([Job(["sh", "-c", "exec sleep 60"], b"", {"PATH": "/usr/bin:/bin"},
                         {str(tmp_path / "never"): str(tmp_path / "never")})], timeout_s=1)
    assert wave.failed == 1 and wave.jobs[0].exit_code != 0 and "deadline" in wave.jobs[0].stderr_tail

# --------------------------------------------------------------------------- the model


LIMIT = Limit("test", 200.0, 200.0)


def test_model_of_todays_client_fails_jobs_once_the_load_is_far_above_the_limit() -> None:
    few, many = simulate(LIMIT, Client(), 2, 50), simulate(LIMIT, Client(), 50, 200)
    assert few.jobs_failed == 0 and few.throttled == 0          # 100 requests: inside the burst
    assert many.jobs_failed == 50 and many.share_503 > 0.5


def test_model_of_shared_rates_finishes_every_job_near_the_floor() -> None:
    pool = simulate(LIMIT, Client(kind="pool"), 50, 200)
    assert pool.jobs_failed == 0 and pool.throttled == 0 and pool.requests == 50 * 200
    assert pool.floor_s / 0.9 <= pool.wall_s <= pool.floor_s / 0.9 + 1.5
    node = simulate(LIMIT, Client(kind="node"), 50, 200)
    assert node.jobs_failed == 0 and node.share_503 < 0.15 and node.wall_s < 1.3 * node.floor_s


def test_calibration_reports_model_beside_measurement() -> None:
    measured = {"params": {"burst": 200.0}, "runs": [
        {"tool": "ours", "reuse": "plain", "stager": False, "jobs": 10, "objects": "distinct", "files": 50,
         "rate": 200.0, "jobs_failed": 0, "share_503": 0.0, "wall_over_floor": 1.0},
        {"tool": "s5cmd", "reuse": "plain", "stager": False, "jobs": 10, "objects": "distinct", "files": 50,
         "rate": 200.0, "jobs_failed": 9, "share_503": 0.9, "wall_over_floor": 1.0}]}
    client, rows = calibrate(measured)
    assert len(rows) == 1 and rows[0]["measured_failed"] == 0 and "model_503" in rows[0]
    assert client.kind == "today"
