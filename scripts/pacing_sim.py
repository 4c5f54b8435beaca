"""The pacing's arithmetic against the test bed's throttling front, simulated: how much of a
node's traffic is answered 503 when a throttle answer slows the node after a given delay.

One node-wide bucket paced by :func:`transfer.pacing.rate_at` and cut by
:func:`transfer.pacing.cut` (the functions the jobs run), always with requests to send; one
prefix behind a token bucket of ``--rate`` per second holding ``--burst`` (the front of
``bench throttle``). A request is judged half a ``latency`` after it leaves and its answer
comes back half a ``latency`` later; a 503 then cuts. ``latency`` stands for the whole delay
between the store's first 503 and the node sending less (a round trip, and the time its
processes take to follow the cut). Prints the 503 share and the goodput over R for each.

    .venv/bin/python scripts/pacing_sim.py --latency 0.05,0.2,1,2,3
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Deque, Dict, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transfer import pacing  # noqa: E402


def simulate(rate: float, burst: float, latency: float, seconds: float, start: float,
             step: float = 0.001) -> Dict[str, float]:
    """The node's requests against the front for ``seconds``: answered, throttled, their share."""
    tokens, state, owed = burst, None, 0.0
    arriving: Deque[Tuple[float, float]] = collections.deque()  # (judged at, sent at)
    answers: Deque[Tuple[float, float, bool]] = collections.deque()  # (answered at, sent at, passed)
    passed = throttled = 0
    now = 0.0
    while now < seconds:
        owed += (start if state is None else pacing.rate_at(state, now)) * step
        while owed >= 1:
            owed -= 1
            arriving.append((now + latency / 2, now))
        tokens = min(burst, tokens + rate * step)
        while arriving and arriving[0][0] <= now:
            sent = arriving.popleft()[1]
            ok = tokens >= 1
            tokens -= 1 if ok else 0
            passed, throttled = passed + ok, throttled + (not ok)
            answers.append((now + latency / 2, sent, ok))
        while answers and answers[0][0] <= now:
            _, sent, ok = answers.popleft()
            if not ok:
                state = pacing.cut(state, now, start, sent, paced=state is not None)[0]
        now += step
    return {"share_503": throttled / max(1, passed + throttled), "goodput_over_rate": passed / seconds / rate}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="the front's requests/s (R)")
    parser.add_argument("--burst", type=float, default=200.0, help="the front's bucket")
    parser.add_argument("--latency", default="0.05,0.2,1,2,3", help="comma-separated delays, seconds")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--start", type=float, default=1000.0, help="requests/s the node sends before a cut")
    args = parser.parse_args()
    rows = {lat: simulate(args.rate, args.burst, float(lat), args.seconds, args.start)
            for lat in args.latency.split(",")}
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
