"""The benchmark itself runs (small scale) and reports what the issue asks for."""

import json
import subprocess
import sys


def test_small_files_bench_reports_every_tool_and_checks_its_own_output():
    done = subprocess.run(
        [sys.executable, "-m", "pegasus_cloudio.cli", "bench", "small-files", "--count", "40", "--size", "300",
         "--threads", "3", "--stock-sample", "8", "--json"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    runs = {(r["tool"], r["direction"]): r for r in result["runs"]}
    assert set(runs) == {(tool, d) for tool in ("pegasus-cloudio-transfer", "stock pegasus-transfer", "s5cmd cp")
                         for d in ("stage-out", "stage-in")}
    assert all(r["exit_code"] == 0 for r in result["runs"])
    ours = runs[("pegasus-cloudio-transfer", "stage-in")]
    stock = runs[("stock pegasus-transfer", "stage-in")]
    assert ours["requests"] == 40 and ours["connections"] <= 3 + 2
    assert stock["extrapolated"] and stock["measured_files"] == 8
    assert stock["connections"] > ours["connections"]
    assert result["targets"]["stage_in_files_identical"] is True
    assert result["ratios"]["stage_in_speedup_vs_stock"] > 1
