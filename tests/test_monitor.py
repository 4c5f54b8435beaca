"""`pegasus-cloudio monitor`: probes a real store, appends a bounded series, finds shifts."""

import json
import os
import subprocess
import sys
from pathlib import Path

from pegasus_cloudio.monitor import series


def test_series_stays_bounded_keeps_the_newest_and_skips_torn_lines(tmp_path: Path) -> None:
    path = str(tmp_path / "s.jsonl")
    for i in range(200):
        series.append(path, [{"t": i, "probe": "get empty", "ok": True, "seconds": 0.01}], max_bytes=4000)
    assert os.path.getsize(path) <= 4000
    points = series.read(path)
    assert points[-1]["t"] == 199 and points[0]["t"] > 100
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"t": 200, "probe": "get em')  # a writer killed mid-line
    assert series.read(path)[-1]["t"] == 199


def test_shifts_mark_a_level_change_only() -> None:
    flat = [{"t": i, "probe": "p", "seconds": 0.010 + (i % 3) * 0.001} for i in range(30)]
    assert series.shifts(flat) == []
    stepped = flat[:15] + [{"t": 15 + i, "probe": "p", "seconds": 0.05} for i in range(15)]
    found = series.shifts(stepped)
    assert len(found) == 1 and 12 <= found[0]["t"] <= 16 and found[0]["after_s"] == 0.05


def test_monitor_probes_minio_and_records_failures(s3_env, bucket, tmp_path: Path) -> None:
    out = tmp_path / "series.jsonl"
    argv = [sys.executable, "-m", "pegasus_cloudio.cli", "monitor", f"s3://test@minio/{bucket}/monitor", "--file",
            str(out), "--every", "0.1", "--rounds", "2"]
    done = subprocess.run(argv, env={**os.environ, **s3_env}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    points = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted({p["probe"] for p in points}) == ["get empty", "get small", "put empty", "put small"]
    assert len(points) == 8 and all(p["ok"] and p["seconds"] > 0 for p in points)
    bad = subprocess.run(argv[:4] + ["s3://test@minio/no-such-bucket-x/monitor"] + argv[5:7],
                         env={**os.environ, **s3_env}, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "no-such-bucket-x" in bad.stderr
    assert [p["ok"] for p in series.read(str(out))[8:]] == [False] * 4
