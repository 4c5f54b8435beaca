"""`pegasus-cloudio bench small-files --store scp` runs (small scale) and reports what issue 3 asks for."""

import json
import subprocess
import sys


def test_scp_small_files_bench_counts_handshakes_and_checks_its_output():
    done = subprocess.run(
        [sys.executable, "-m", "pegasus_cloudio.cli", "bench", "small-files", "--store", "scp", "--count", "24",
         "--size", "300", "--threads", "2", "--stock-sample", "4", "--allow-small-sample", "--json"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    runs = {(r["tool"], r["direction"]): r for r in result["runs"]}
    assert set(runs) == {(tool, d) for tool in ("pegasus-cloudio-transfer", "stock pegasus-transfer",
                                                "Go pegasus-transfer") for d in ("stage-out", "stage-in")}
    assert all(r["exit_code"] == 0 for r in result["runs"])
    assert runs[("pegasus-cloudio-transfer", "stage-in")]["connections"] == 1
    assert runs[("pegasus-cloudio-transfer", "stage-out")]["connections"] == 1
    stock_in = runs[("stock pegasus-transfer", "stage-in")]
    assert stock_in["extrapolated"] and stock_in["measured_files"] == 4 and stock_in["connections"] > 1
    assert result["targets"]["one_ssh_handshake_per_batch"] is True
    assert result["targets"]["stage_in_files_identical"] is True
    assert result["ratios"]["stage_in_speedup_vs_stock"] > 1
    go_in = runs[("Go pegasus-transfer", "stage-in")]  # one scp, so one handshake, per file
    assert go_in["extrapolated"] and go_in["measured_files"] == 4 and go_in["connections"] >= 4


def test_stock_stage_out_samples_are_large_enough_for_full_scp_batches():
    from pegasus_cloudio_bench.small_files import Params
    from pegasus_cloudio_bench.small_files_scp import stock_samples

    # 5 threads: groups reach their 100-file cap from 500 files on (PM-610)
    assert stock_samples(Params(count=2000, threads=5, stock_sample=200)) == ([500, 1000], [50, 200])
    assert stock_samples(Params(count=24, threads=2, stock_sample=4)) == ([24], [1, 4])
