"""The GCS small-files benchmark runs (small scale) and reports what issue 3 asks for."""

import json
import subprocess
import sys


def test_small_files_gcs_bench_reports_ours_and_the_naive_loop():
    done = subprocess.run(
        [sys.executable, "-m", "pegasus_cloudio.cli", "bench", "small-files", "--store", "gcs", "--count", "30",
         "--size", "300", "--threads", "3", "--stock-sample", "4", "--allow-small-sample", "--json"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    runs = {(r["tool"], r["direction"]): r for r in result["runs"]}
    assert set(runs) == {(tool, d) for tool in ("pegasus-cloudio-transfer", "naive gcs loop")
                         for d in ("stage-out", "stage-in")}
    ours, naive = runs[("pegasus-cloudio-transfer", "stage-in")], runs[("naive gcs loop", "stage-in")]
    assert ours["requests"] == 30 and ours["connections"] <= 3 + 2
    assert naive["extrapolated"] and naive["measured_files"] == 4 and naive["connections"] > ours["connections"]
    assert all(result["targets"].values()), result["targets"]
    assert any("gsutil" in note for note in result["notes"])
