"""Benchmark output that cannot mislead: extrapolation never goes negative, small samples are
refused unless asked for, published figures stay apart, progress shows in logs, columns align."""

from __future__ import annotations

import io
import subprocess
import sys
import time

from pegasus_cloudio_bench import cache as cache_bench
from pegasus_cloudio_bench.harness import Measurement, Progress, extrapolate, minimum_sample, run_rows
from waiting import wait_for


def _m(files: int, wall: float, cpu: float, requests: int = 0) -> Measurement:
    return Measurement("stock pegasus-transfer", "stage-in", files, files, wall, cpu, requests, requests, 0)


def test_extrapolation_is_never_negative_and_never_shrinks_with_the_count() -> None:
    # the larger sample happened to cost less CPU than the smaller one: noise, not a negative slope
    noisy = extrapolate(_m(2, 1.0, 0.9, 4), _m(8, 3.0, 0.4, 16), 6000)
    assert noisy.extrapolated and noisy.files == 6000 and noisy.measured_files == 8
    assert noisy.cpu_s == 0.4 / 8 * 6000 and noisy.wall_s > 3.0 and noisy.requests == 12000
    assert all(value >= 0 for value in (noisy.wall_s, noisy.cpu_s, noisy.requests))
    linear = extrapolate(_m(25, 5.0, 2.0), _m(100, 20.0, 8.0), 1000)
    assert round(linear.wall_s, 6) == 200.0 and round(linear.cpu_s, 6) == 80.0


def test_minimum_sample_is_100_or_a_tenth_of_the_count() -> None:
    assert [minimum_sample(n) for n in (40, 500, 6173, 20000)] == [40, 100, 618, 2000]


def test_small_samples_are_refused_before_anything_runs() -> None:
    for argv, flag in ((["small-files", "--count", "6173", "--stock-sample", "200"], "--stock-sample 200"),
                       (["mconcatfit", "--count", "2000", "--stock-sample", "50"], "--stock-sample 50"),
                       (["condor-plugin", "--count", "1000", "--sample", "10"], "--sample 10")):
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "bench", *argv],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stdout == ""
        [line] = done.stderr.splitlines()
        assert f"{flag} is below the minimum" in line and "--allow-small-sample" in line, line
        assert time.monotonic() - started < 30  # refused up front, no server was started


def test_progress_prints_periodic_lines_when_stderr_is_not_a_terminal() -> None:
    stream = io.StringIO()
    progress = Progress(stream, interval=0.1)
    progress.phase("stock pegasus-transfer: stage-in sample of 100 files")
    wait_for(lambda: len(stream.getvalue().splitlines()) >= 3, "two periodic progress lines", timeout=10)
    progress.done()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "  stock pegasus-transfer: stage-in sample of 100 files ..."
    assert len(lines) >= 3 and all("still running" in line for line in lines[1:])
    assert "\r" not in stream.getvalue()


def test_run_table_columns_align_and_extrapolated_runs_are_marked() -> None:
    runs = [_m(6173, 1.5, 0.7).as_dict(), extrapolate(_m(50, 9.0, 5.0), _m(200, 36.0, 20.0), 6173).as_dict()]
    rows = run_rows(runs, (("files", "files", "d"), ("wall s", "wall_s", ".2f"), ("cpu s", "cpu_s", ".2f")))
    table, note = rows[:-1], rows[-1]
    assert "(extrapolated from 200 files)" in table[2] and note.startswith("note: runs marked 'extrapolated'")
    assert len({len(row) for row in table}) == 1  # every row as wide: right-aligned numbers line up
    assert len({row.index("stage-in") for row in table[1:]}) == 1


def test_cache_bench_keeps_the_seed_figures_apart_as_published() -> None:
    result = {"reuse": [], "single_flight": {"processes": 2, "object_bytes": 1 << 20, "origin_requests": 1,
                                              "hits": 1, "wall_s": 0.1},
              "latency_ms": [], "targets": {}, "published": cache_bench.PUBLISHED}
    text = cache_bench.format_table(result)
    head, _, tail = text.partition("published, not measured in this run")
    assert "3951" not in head and "1841" not in head
    assert "3951 ms" in tail and "1841 ms" in tail and "seed paper" in tail


def _workflow_run(mode, compute, makespan, complete=True, correct=True):
    return {"mode": mode, "compute_s": compute, "jobs": 101, "jobs_run": 101 if complete else 30,
            "extrapolated": not complete, "makespan_lower_bound": not complete, "makespan_s": makespan,
            "requests": 1, "mean_stage_in_s": 0.1, "mean_stage_out_s": 0.1, "mean_staging_cpu_s": 0.1,
            "concat_stage_in_s": 0.1 if complete else None, "result_correct": correct if complete else None}


def test_workflow_stock_lower_bound_is_not_a_figure_and_unchecked_results_are_not_met() -> None:
    """Before: the extrapolated stock row at 5 s was a ratio and a bar like any other, and
    ``results_correct`` read "met" though the stock result was never checked."""
    from pegasus_cloudio_bench import workflow
    runs = [_workflow_run("vm-local", 5.0, 100.0), _workflow_run("stager", 5.0, 102.0),
            _workflow_run("stock", 5.0, 310.0, complete=False)]
    result = workflow.report(workflow.Params(computes=(5.0,), modes=("stock", "stager", "vm-local")), runs, {})
    assert "stock_vs_vm_local_at_5s" not in result["ratios"]
    assert result["ratios_lower_bound"] == {"stock_vs_vm_local_at_5s": 3.1}
    assert result["targets"]["results_correct"] is None and result["results_unchecked"] == ["stock at 5 s"]
    table = workflow.format_table(result)
    assert ">=310.00" in table and "stock_vs_vm_local_at_5s: >= 3.1 (lower bound)" in table
    assert "target results_correct: met" not in table and "not checked for stock at 5 s" in table
    runs[1]["result_correct"] = False
    assert workflow.report(workflow.Params(computes=(5.0,)), runs, {})["targets"]["results_correct"] is False
