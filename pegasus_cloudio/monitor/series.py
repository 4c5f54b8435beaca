"""The monitor's time series: one JSON object per line, bounded in size, and its level shifts.

A line is ``{"t": unix seconds, "probe": name, "seconds": latency, "ok": bool, "error": ...}``.
`append` adds lines; when the file would pass ``max_bytes`` it keeps the newest half of the
lines (rewritten to a temp file and renamed into place, so a reader never sees a torn file).
`shifts` marks where a probe's median latency over ``window`` samples changes by more than
``factor`` from the ``window`` samples before (the seed's month-long series showed such steps).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from typing import Any, Dict, Iterable, List

DEFAULT_MAX_BYTES = 4 << 20


def read(path: str) -> List[Dict[str, Any]]:
    """Every well-formed line of ``path`` in order (a torn last line is skipped)."""
    points: List[Dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    point = json.loads(line)
                except ValueError:
                    continue
                if isinstance(point, dict) and {"t", "probe", "seconds"} <= set(point):
                    points.append(point)
    except FileNotFoundError:
        pass
    return points


def append(path: str, points: Iterable[Dict[str, Any]], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Add ``points``; keep the file at most ``max_bytes`` by dropping the oldest half when needed."""
    text = "".join(json.dumps(p, sort_keys=True) + "\n" for p in points)
    size = os.path.getsize(path) if os.path.exists(path) else 0
    if size + len(text) <= max_bytes:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)
        return
    with open(path, encoding="utf-8") if size else open(os.devnull, encoding="utf-8") as fh:
        lines = fh.readlines() + text.splitlines(keepends=True)
    budget, kept = max_bytes // 2, []
    for line in reversed(lines):
        if budget - len(line) < 0:
            break
        budget -= len(line)
        kept.append(line)
    temp = f"{path}.{os.getpid()}.tmp"
    with open(temp, "w", encoding="utf-8") as fh:
        fh.writelines(reversed(kept))
    os.replace(temp, path)


def shifts(points: List[Dict[str, Any]], window: int = 6, factor: float = 1.5) -> List[Dict[str, Any]]:
    """Level shifts per probe: ``{"t", "probe", "before_s", "after_s"}`` (medians of ``window``).

    Where the ratio first passes ``factor``, the split with the largest ratio within the next
    ``window`` samples is taken (the step itself, not its first hint); the scan resumes after it.
    """
    found: List[Dict[str, Any]] = []
    for probe in dict.fromkeys(p["probe"] for p in points):
        series = [float(p["seconds"]) for p in points if p["probe"] == probe and p.get("ok", True)]
        times = [p["t"] for p in points if p["probe"] == probe and p.get("ok", True)]
        i = window
        while i + window <= len(series):
            if _step(series, i, window) <= math.log(factor):
                i += 1
                continue
            best = max(range(i, min(i + window, len(series) - window + 1)), key=lambda j: _step(series, j, window))
            found.append({"t": times[best], "probe": probe, "before_s": statistics.median(series[best - window:best]),
                          "after_s": statistics.median(series[best:best + window])})
            i = best + window
    return found


def _step(series: List[float], i: int, window: int) -> float:
    """|log(median after / median before)| at split ``i``."""
    before = statistics.median(series[i - window:i])
    after = statistics.median(series[i:i + window])
    return abs(math.log(max(after, 1e-9) / max(before, 1e-9)))
