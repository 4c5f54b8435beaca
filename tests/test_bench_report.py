"""`pegasus-cloudio bench report --quick` writes a complete report (not a speed test)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pegasus_cloudio.monitor import series

SCENARIO_FIGURES = {"workflow": ["workflow_makespan", "workflow_ratios"], "cost": ["cost"],
                    "sizes": ["sizes_download", "sizes_upload"], "threads": ["threads"], "large": ["large"],
                    "cache": ["cache"], "disk": ["disk"], "pool": ["pool"], "monitor": ["monitor"]}


@pytest.mark.timeout(1800)  # a few minutes on an idle machine; far longer on a shared, loaded one
def test_quick_report_has_every_scenario_figure_data_and_published_numbers(tmp_path: Path) -> None:
    monitor = tmp_path / "monitor.jsonl"
    series.append(str(monitor), [{"t": 1000 + i, "probe": "get empty", "ok": True,
                                  "seconds": 0.01 if i < 10 else 0.05} for i in range(20)])
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "bench", "report", "--out", str(out), "--quick",
                           "--monitor", str(monitor)], capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    text = (out / "report.md").read_text()
    assert "FAILED" not in text, text
    for scenario, names in SCENARIO_FIGURES.items():
        assert f"## {scenario}\n" in text
        for name in names:
            assert (out / "figures" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            json.loads((out / "figures" / f"{name}.json").read_text())
            assert f"figures/{name}.png" in text
    for scenario in ("workflow", "sizes", "threads", "large", "cache", "disk", "pool", "cost"):
        json.loads((out / "results" / f"{scenario}.json").read_text())
    assert text.count("Published (not measured here)") >= 7 and "seed 002" in text and "seed 003" in text
    assert "report: scenario workflow" in done.stderr  # progress lines when stderr is not a terminal
    workflow = json.loads((out / "results" / "workflow.json").read_text())
    unchecked = [r for r in workflow["runs"] if r["result_correct"] is None]
    assert all(r["result_correct"] for r in workflow["runs"] if r["result_correct"] is not None)
    assert all(r["extrapolated"] for r in unchecked)  # only a run stopped early goes unchecked...
    assert workflow["targets"]["results_correct"] is (None if unchecked else True)  # ...and then is no "met"
    assert json.loads((out / "figures" / "monitor.json").read_text())["shifts"]
    pool = json.loads((out / "results" / "pool.json").read_text())
    assert [(r["config"], r["dagman_status"], r["byte_exact"]) for r in pool["runs"]] == [
        ("stock", 0, True), ("go", 0, True), ("ours bundles+cache", 0, True)]  # the Go tool too (issue 38)
    assert pool["runs"][0]["stock_calls"] > 0 and pool["runs"][-1]["stock_calls"] == 0


def test_the_committed_reports_plots_read_without_the_docs(tmp_path: Path) -> None:
    """The report redrawn from its saved results (``bench report --reuse``) is the committed one,
    with no section FAILED: figures.save refuses a title that is not plain (a raw dict, a seed
    paper's figure number) and a legend over the data; the stock run that stopped early is a
    marked lower bound, never a bar."""
    import shutil
    repo = Path(__file__).resolve().parent.parent
    shutil.copytree(repo / "docs" / "report" / "results", tmp_path / "results")
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "bench", "report", "--out", str(tmp_path),
                           "--reuse", "--only", "workflow,sizes,threads,large,cache,disk"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "FAILED" not in done.stdout, done.stdout + done.stderr
    assert (tmp_path / "report.md").read_text() == (repo / "docs" / "report" / "report.md").read_text().replace(
        (repo / "docs" / "report" / "report.md").read_text().splitlines()[2], (tmp_path / "report.md").read_text()
        .splitlines()[2]), "docs/report/report.md is not what bench report --reuse writes: regenerate it"
    made = json.loads((tmp_path / "figures" / "workflow_makespan.json").read_text())
    assert made["lower_bounds_not_charted"]["stock"] == {"5.0": pytest.approx(140.36, abs=0.01)}
    assert "5.0" not in made["makespan_s"]["stock"]



def test_reuse_assembles_under_the_measured_load_and_never_starts_a_bench(tmp_path: Path) -> None:
    """The last stop's note: the head gave the load while the report was put together, and
    ``--reuse`` ran the pool bench (a real pool, minutes) when no pool result was saved. A
    skipped scenario printed its "scenario pool" line before the line saying it was skipped."""
    import shutil
    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "results").mkdir()
    shutil.copy(repo / "docs" / "report" / "results" / "large.json", tmp_path / "results" / "large.json")
    saved = json.loads((tmp_path / "results" / "large.json").read_text())
    saved["load_average"] = [1.5, 2.25, 3.0]
    (tmp_path / "results" / "large.json").write_text(json.dumps(saved))
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "bench", "report", "--out", str(tmp_path),
                           "--reuse", "--only", "large,pool"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "FAILED" not in done.stdout, done.stdout + done.stderr
    head = (tmp_path / "report.md").read_text().splitlines()[2]
    assert "load average when measured: large 1.50, 2.25, 3.00; " in head, head
    assert f"pool: no saved result {tmp_path}/results/pool.json: skipped" in done.stderr, done.stderr
    assert "scenario pool" not in done.stderr and "report: scenario large" in done.stderr, done.stderr
    assert "## pool\n\nSkipped: no saved result" in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "results" / "pool.json").exists()


def test_the_disk_line_of_the_large_plot_has_no_tools_colour() -> None:
    """The disk's write rate was drawn in the Go bars' colour."""
    from matplotlib.colors import to_hex

    from pegasus_cloudio_bench import figures
    plt = figures._pyplot()
    fig, ax = plt.subplots()
    runs = [{"tool": tool, "direction": "download", "mb_per_s": 100.0} for tool in ("ours", "go", "s5cmd")]
    bars, line = figures.draw_large(ax, {"runs": runs, "disk_write_mb_per_s": 300.0})
    plt.close(fig)
    tools = {to_hex(bar.get_facecolor()) for bar in bars}
    assert len(tools) == 3 and to_hex(line.get_color()) not in tools
