"""The benchmark itself runs (small scale) and reports what the issue asks for."""

import json
import subprocess
import sys


def test_small_files_bench_reports_every_tool_and_checks_its_own_output():
    done = subprocess.run(
        [sys.executable, "-m", "pegasus_cloudio.cli", "bench", "small-files", "--count", "40", "--size", "300",
         "--threads", "3", "--stock-sample", "8", "--allow-small-sample", "--json"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    runs = {(r["tool"], r["direction"]): r for r in result["runs"]}
    assert set(runs) == {(tool, d) for tool in ("pegasus-cloudio-transfer", "pegasus-cloudio-transfer (bundled)",
                                                "Go pegasus-transfer", "stock pegasus-transfer", "s5cmd cp")
                         for d in ("stage-out", "stage-in")} | {("pegasus-cloudio-transfer (node cache on, all misses)",
                                                                 "stage-in")}
    assert all(r["exit_code"] == 0 for r in result["runs"])
    ours = runs[("pegasus-cloudio-transfer", "stage-in")]
    stock = runs[("stock pegasus-transfer", "stage-in")]
    assert ours["requests"] == 40 and ours["connections"] <= 3 + 2
    assert stock["extrapolated"] and stock["measured_files"] == 8
    assert stock["connections"] > ours["connections"]
    assert result["targets"]["stage_in_files_identical"] is True
    assert result["ratios"]["stage_in_speedup_vs_stock"] > 1
    go = runs[("Go pegasus-transfer", "stage-in")]
    assert go["requests"] >= 40 and not go["extrapolated"]  # every file, no sample
    assert runs[("pegasus-cloudio-transfer (bundled)", "stage-in")]["requests"] < 40
    assert result["ratios"]["stage_in_wall_vs_go"] == round(ours["wall_s"] / go["wall_s"], 2)
    # loopback: the loopback targets apply, the 20 ms ones do not
    assert result["targets"]["cache_miss_cpu_per_get_at_most_0.6x_go_on_loopback"] is not None
    assert result["targets"]["stage_in_wall_at_most_0.25x_go_at_20ms"] is None


def test_mconcatfit_bench_compares_per_file_bundled_floor_and_stock():
    done = subprocess.run(
        [sys.executable, "-m", "pegasus_cloudio.cli", "bench", "mconcatfit", "--count", "120", "--producers", "4",
         "--stock-sample", "4", "--allow-small-sample", "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    runs = {r["tool"]: r for r in result["runs"]}
    assert runs["ours bundled producers"]["requests"] == 4  # one bundle per producer
    assert runs["ours bundled consumer"]["requests"] == 1 + 4  # LIST + one GET per bundle
    assert runs["ours per-file consumer"]["requests"] == 120
    # bundling off: at most one 404 per thread before the index is known, one LIST, one GET per bundle
    assert runs["ours transparent consumer"]["requests"] <= 5 + 1 + 4
    assert runs["floor (1 GET + local writes)"]["requests"] == 1
    assert result["targets"]["requests_at_least_50x_fewer"] is False  # 120/5 < 50 at this scale
    assert result["ratios"]["consumer_request_reduction"] == 24.0
    go = runs["Go pegasus-transfer consumer"]
    assert go["exit_code"] == 0 and go["requests"] >= 120 and not go["extrapolated"]
    assert result["ratios"]["per_file_consumer_wall_vs_go"] == round(
        runs["ours per-file consumer"]["wall_s"] / go["wall_s"], 2)


def test_condor_plugin_bench_reports_its_targets():
    done = subprocess.run(
        [sys.executable, "-m", "pegasus_cloudio.cli", "bench", "condor-plugin", "--count", "20", "--sample", "4", "--allow-small-sample",
         "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["targets"]["files_identical"] is True
    assert result["targets"]["connections_at_most_threads_plus_2 (10)"] is True
    assert result["ratios"]["stage_in_throughput_vs_process_per_file"] > 1


def test_library_bench_runs_ours_from_another_tree_in_the_same_rounds(tmp_path):
    import os

    tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-m", "pegasus_cloudio.cli", "bench", "library", "--count", "20", "--rounds", "1",
         "--threads", "2", "--tools", "ours", "--before", tree, "--json"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert set(result["median"]) == {"ours up", "ours down", "ours-before up", "ours-before down"}
    assert all(row["ok"] and row["requests"] >= 20 for row in result["median"].values())
    assert [t["target"] for t in result["targets"]] == ["ours wall <= ours-before wall"]
    refused = subprocess.run(
        [sys.executable, "-m", "pegasus_cloudio.cli", "bench", "library", "--before", str(tmp_path)],
        capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and str(tmp_path) in refused.stderr.strip().splitlines()[-1]
