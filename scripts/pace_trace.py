"""Where a cut's seconds go: a ``bench throttle --trace`` run's traces, read together.

Reads ``DIR/front.trace`` (the front's arrivals: ``arrive T PASSED``) and every job's
``DIR/PID.trace`` (:mod:`transfer.pacing_trace`), all on the machine's epoch clock, and prints
as JSON:

* ``cuts``: each cut, with the lag from the front's first 503 of its round to the cut (``lag_s``,
  the answer's way back and the job's handling) and the seconds its update waited for the lock;
* ``follow``: after each cut, how long until each job's requests follow it (the time of the
  job's first request, after the cut was written, that was booked after it or re-timed by
  it), median and 90th percentile over jobs, and how many requests left meanwhile that were
  booked before the cut and not re-timed (``stale``, sent at the old rate);
* ``storms``: runs of 503s (a second without one ends a storm): their length, 503s, the
  front's offered rate, and the client's sends in them by kind (``free``: unpaced; ``stale``;
  ``retimed``; ``fresh``: booked after the last cut);
* ``take_wait_s``: the reservations' lock waits (median, 90th percentile, max).

    .venv/bin/python scripts/pace_trace.py /tmp/trace/100-distinct-ours
"""

from __future__ import annotations

import bisect
import glob
import json
import os
import statistics
import sys
from typing import Any, Dict, List, Tuple


def _lines(path: str) -> List[List[str]]:
    with open(path, encoding="utf-8") as fh:
        return [line.split() for line in fh if line.strip()]


def _pct(values: List[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def load(directory: str) -> Tuple[List[Tuple[float, bool]], Dict[str, List[List[float]]]]:
    """The front's arrivals and, per job, its events (event name first, then numbers)."""
    front = [(float(f[1]), f[2] == "1") for f in _lines(os.path.join(directory, "front.trace"))]
    jobs: Dict[str, List[List[Any]]] = {}
    for path in glob.glob(os.path.join(directory, "*.trace")):
        name = os.path.basename(path)
        if name != "front.trace":
            jobs[name] = [[f[0]] + [float(x) for x in f[1:]] for f in _lines(path)]
    return front, jobs


def cuts_of(jobs: Dict[str, List[List[Any]]]) -> List[Dict[str, float]]:
    """Every cut: its time (the state's cut_at), when it was written, the rate cut from."""
    cuts = [{"at": e[1], "written": e[1] + e[5], "lock_s": e[5], "from": e[6]}
            for events in jobs.values() for e in events if e[0] == "503" and e[4] == 1]
    return sorted(cuts, key=lambda c: c["at"])


def storms_of(front: List[Tuple[float, bool]]) -> List[Tuple[float, float]]:
    """(start, end) of each run of 503s at the front; a second without one ends it."""
    storms: List[Tuple[float, float]] = []
    for t, ok in front:
        if ok:
            continue
        if storms and t - storms[-1][1] < 1.0:
            storms[-1] = (storms[-1][0], t)
        else:
            storms.append((t, t))
    return storms


def kind(event: List[Any], cut_times: List[float], written: List[float]) -> str:
    """``free``, ``retimed``, ``stale`` (booked before the last cut written by then) or ``fresh``."""
    if event[0] == "free":
        return "free"
    if event[4] > 0:
        return "retimed"
    i = bisect.bisect_right(written, event[1]) - 1  # the last cut written before it left
    return "stale" if i >= 0 and event[2] < cut_times[i] else "fresh"


def follow(cuts: List[Dict[str, float]], jobs: Dict[str, List[List[Any]]]) -> List[Dict[str, Any]]:
    """Per cut: the seconds until each job's requests follow it, and the stale sends meanwhile."""
    rows = []
    for n, c in enumerate(cuts):
        end = cuts[n + 1]["written"] if n + 1 < len(cuts) else float("inf")
        delays, stale = [], 0
        for events in jobs.values():
            for e in events:
                if e[0] != "send" or not c["written"] <= e[1] < end:
                    continue
                if e[2] >= c["at"] or e[4] > 0:
                    delays.append(e[1] - c["written"])
                    break
                stale += 1
        rows.append({"at": round(c["at"], 3), "jobs_following": len(delays), "median_s": _pct(delays, 0.5),
                     "p90_s": _pct(delays, 0.9), "stale": stale})
    return rows


def report(directory: str) -> Dict[str, Any]:
    front, jobs = load(directory)
    cuts = cuts_of(jobs)
    cut_times, written = [c["at"] for c in cuts], [c["written"] for c in cuts]
    t0 = front[0][0] if front else 0.0
    firsts = [t for t, ok in front if not ok]
    rows = []
    for c in cuts:  # the front's first 503 since the cut before
        before = [w for w in written if w < c["at"]]
        since = before[-1] if before else 0.0
        i = bisect.bisect_right(firsts, since)
        first = firsts[i] if i < len(firsts) and firsts[i] <= c["at"] else c["at"]
        rows.append({"at": round(c["at"] - t0, 3), "lag_s": round(c["at"] - first, 3),
                     "lock_s": round(c["lock_s"], 3), "from_rate": round(c["from"], 1)})
    sends = [e for events in jobs.values() for e in events if e[0] in ("send", "free")]
    storms = []
    for start, end in storms_of(front):
        inside = [e for e in sends if start <= e[1] <= end]
        counts: Dict[str, int] = {}
        for e in inside:
            k = kind(e, cut_times, written)
            counts[k] = counts.get(k, 0) + 1
        arrivals = [ok for t, ok in front if start <= t <= end]
        seconds = max(0.1, end - start)
        storms.append({"start": round(start - t0, 2), "seconds": round(seconds, 2),
                       "throttled": arrivals.count(False), "offered_per_s": round(len(arrivals) / seconds),
                       "cuts": sum(1 for t in cut_times if start <= t <= end + 1), "sends": counts})
    takes = [e[2] for events in jobs.values() for e in events if e[0] == "take"]
    return {"requests": len(front), "throttled": len(firsts), "share_503": round(len(firsts) / max(1, len(front)), 3),
            "jobs": len(jobs), "cuts": rows, "follow": [dict(f, at=round(f["at"] - t0, 3)) for f in follow(cuts, jobs)],
            "storms": storms, "take_wait_s": {"median": _pct(takes, 0.5), "p90": _pct(takes, 0.9),
                                              "max": _pct(takes, 1.0), "mean": round(statistics.fmean(takes), 4)
                                              if takes else 0.0}}


def main() -> int:
    if len(sys.argv) != 2 or not os.path.isfile(os.path.join(sys.argv[1], "front.trace")):
        sys.stderr.write("usage: pace_trace.py DIR (a directory holding front.trace and the jobs' PID.trace)\n")
        return 2
    print(json.dumps(report(sys.argv[1]), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
