"""The Azure small-files benchmark runs (small scale) and reports what issue 35 asks for: ours
per file and bundled, azure-storage-blob in a thread pool, and the Azure CLI per file (on
samples of 1 and 4 files, extrapolated)."""

import json
import subprocess
import sys


def test_small_files_azure_bench_reports_ours_bundles_and_both_baselines():
    done = subprocess.run(
        [sys.executable, "-m", "pegasus_cloudio.cli", "bench", "small-files", "--store", "azure", "--count", "200",
         "--size", "300", "--threads", "3", "--stock-sample", "4", "--allow-small-sample", "--json"],
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    runs = {(r["tool"], r["direction"]): r for r in result["runs"]}
    tools = ("pegasus-cloudio-transfer", "pegasus-cloudio-transfer (bundles)", "azure-storage-blob thread pool",
             "az storage blob (per file)")
    assert set(runs) == {(tool, d) for tool in tools for d in ("stage-out", "stage-in")}
    ours, bundled = runs[(tools[0], "stage-in")], runs[(tools[1], "stage-in")]
    assert ours["requests"] == 200 and ours["connections"] <= 3 + 2
    assert bundled["requests"] * 50 <= ours["requests"]
    cli = runs[(tools[3], "stage-in")]
    assert cli["extrapolated"] and cli["measured_files"] == 4 and cli["files"] == 200
    speed = result["targets"].pop("stage_in_20x_faster_than_az_cli")  # a figure of the run, not a test's
    assert isinstance(speed, bool) and result["ratios"]["stage_in_speedup_vs_az_cli"] is not None
    assert all(result["targets"].values()), result["targets"]
    assert result["store"] == "azure" and any("azure-storage-blob" in note for note in result["notes"])
    assert any("azure-cli==" in note for note in result["notes"])
