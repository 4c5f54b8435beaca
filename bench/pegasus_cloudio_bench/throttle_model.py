"""`bench throttle --model`: N staging jobs against one prefix's request limit, simulated.

A discrete-event simulation. The store is one token bucket per prefix (the front's
`TokenBucket`, at the documented limit: S3 5,500 GET/HEAD per second per prefix, GCS about
5,000 reads per second per bucket before it ramps). Each request takes one round trip
``latency_s``; the store decides when it arrives. Clients, per job:

* ``today``: the drop-in of main before issue 37's client side: a pipelined pass over all M
  files (``window`` requests in flight), then every throttled file down the per-file path
  with ``threads`` workers: 3 attempts, full-jitter waits (0.5 s x 2^(n-1) x 4 for a 503,
  at most 20 s), every retry spending a token of the run's budget (20 + M/10, a success
  earning 0.1 back once spent); a file fails when its attempts or the budget run out,
  a job when one of its files does.
* ``node``: issue 37's design, modelled, not measured: throttles spend no budget and are
  retried for up to ``time_bound_s``; the ``slots`` jobs of a node share one rate, cut to
  0.7x on a throttle (once per generation of requests) and grown back over ``regrow_s``
  (see `_Rate`).
* ``pool``: one rate for the whole pool (the Redis limiter) at ``pool_share`` of the limit.

Bundles and the node cache change the requests, not the client: a job that reads its M
small files from one bundle makes ``bundle_requests`` requests; with the node cache, the
``slots`` jobs of a node that read shared inputs make one set of M requests between them.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import itertools
import math
import random
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from pegasus_cloudio_bench.harness import aligned
from pegasus_cloudio_testbed.throttle_policy import TokenBucket

__all__ = ["Client", "Limit", "Outcome", "simulate", "run"]


@dataclass(frozen=True)
class Limit:
    """A store's documented read limit on one prefix (requests per second) and burst."""
    name: str
    rate: float
    burst: float


S3 = Limit("S3 (5,500 GET/s per prefix)", 5500.0, 5500.0)
GCS = Limit("GCS (5,000 reads/s per bucket, before ramping)", 5000.0, 5000.0)


@dataclass(frozen=True)
class Client:
    kind: str = "today"            # today | node | pool
    threads: int = 8
    window: int = 80               # pipelined GETs in flight in the first pass
    latency_s: float = 0.004       # one request's round trip (calibrated)
    start_s: float = 0.2           # a job's start-up before its first request (calibrated)
    spread_s: float = 0.0          # starts spread over N x this (the test machine's 2 cores; calibrated)
    max_attempts: int = 3
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    throttle_factor: float = 4.0
    time_bound_s: float = 300.0
    slots: int = 16                # jobs per node (node rate, node cache)
    pool_share: float = 0.9
    regrow_s: float = 2.0


@dataclass(frozen=True)
class Outcome:
    jobs: int
    files: int
    jobs_failed: int
    wall_s: float
    floor_s: float
    requests: int
    throttled: int

    @property
    def share_503(self) -> float:
        return self.throttled / self.requests if self.requests else 0.0


class _Sim:
    """The clock, the events and the store's bucket."""

    def __init__(self, limit: Limit, latency_s: float) -> None:
        self.now, self.latency = 0.0, latency_s
        self.bucket = TokenBucket(limit.rate, limit.burst, 0.0)
        self._events: List[Tuple[float, int, Callable[..., None], Tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.requests = self.throttled = 0

    def at(self, when: float, action: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._events, (when, next(self._seq), action, args))

    def request(self, answer: Callable[[bool], None]) -> None:
        """Send one request now; ``answer(passed)`` runs one round trip later."""
        passed = self.bucket.take(self.now + self.latency / 2)  # arrivals stay in time order
        self.requests += 1
        self.throttled += 0 if passed else 1
        self.at(self.now + self.latency, answer, passed)

    def run(self) -> None:
        while self._events:
            self.now, _, action, args = heapq.heappop(self._events)
            action(*args)


class _Budget:
    def __init__(self, capacity: float) -> None:
        self.capacity = self.tokens = capacity

    def spend(self) -> bool:
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def earn(self) -> None:
        self.tokens = min(self.capacity, self.tokens + 0.1)


class _Rate:
    """A client-side rate shared by the jobs of a node: unlimited until the first throttle,
    then cut to 0.7x and grown back to the rate of the cut in ``regrow_s``, then on by half
    of it per ``regrow_s`` (CUBIC's shape, as the AWS SDKs' adaptive mode). One cut per
    generation: a throttle of a request sent before the last cut is old news. The first
    cut starts from what the node sent in the last second. A pool's rate is fixed."""

    def __init__(self, fixed: Optional[float] = None, regrow_s: float = 2.0) -> None:
        self._fixed, self._regrow = fixed, regrow_s
        self._peak: Optional[float] = fixed
        self._cut_at = -1.0
        self.next_free = 0.0
        self._sent: List[float] = []
        self._queue: Deque[Callable[[], None]] = collections.deque()
        self._pumping = False

    def rate(self, now: float) -> Optional[float]:
        if self._fixed is not None or self._peak is None:
            return self._peak
        since = (now - self._cut_at) / self._regrow
        return self._peak * (0.7 + 0.3 * since if since < 1 else 1.0 + 0.5 * (since - 1))

    def wait(self, sim: "_Sim", send: Callable[[], None]) -> None:
        """Run ``send`` when the rate allows, in turn with the node's other senders (the pace
        is the rate at the moment each leaves, so a cut slows the queue at once)."""
        self._queue.append(send)
        if not self._pumping:
            self._pumping = True
            sim.at(max(sim.now, self.next_free), self._pump, sim)

    def _pump(self, sim: "_Sim") -> None:
        self._queue.popleft()()
        rate = self.rate(sim.now)
        self.next_free = sim.now + (1.0 / rate if rate is not None else 0.0)
        if self._fixed is None:
            self._sent.append(sim.now)
            if len(self._sent) > 65536:
                del self._sent[:32768]
        if self._queue:
            sim.at(self.next_free, self._pump, sim)
        else:
            self._pumping = False

    def answered(self, passed: bool, sent: float, now: float) -> None:
        if passed or self._fixed is not None or sent <= self._cut_at:
            return
        rate = self.rate(now)
        recent = len(self._sent) - bisect.bisect_right(self._sent, now - 1.0)
        self._peak = max(1.0, rate if rate is not None else float(recent))
        self._cut_at = now
        self.next_free = now + 1.0 / (0.7 * self._peak)


class _Job:
    """One job of M requests under the client model; ``done(failed)`` when it ends."""

    def __init__(self, sim: _Sim, client: Client, files: int, rate: Optional[_Rate], rng: random.Random,
                 done: Callable[[bool], None]) -> None:
        self.sim, self.c, self.rate, self.rng, self.done = sim, client, rate, rng, done
        self.unsent, self.answered, self.files = files, 0, files
        self.retry: List[int] = []
        self.resolved = self.failed = 0
        self.budget = _Budget(20 + files / 10)
        self.deadline = 0.0

    def start(self) -> None:
        self.deadline = self.sim.now + self.c.time_bound_s
        if self.c.kind == "today":
            for _ in range(min(self.c.window, self.unsent)):
                self._pass_send()
        else:
            for _ in range(min(self.c.window, self.unsent)):
                self.unsent -= 1
                self._paced_send(1)

    # -- today: the pipelined pass, then the per-file path
    def _pass_send(self) -> None:
        self.unsent -= 1
        self.sim.request(self._pass_answer)

    def _pass_answer(self, passed: bool) -> None:
        self.answered += 1
        if passed:
            self._resolve(False)
        else:
            self.retry.append(1)
        if self.unsent:
            self._pass_send()
        elif self.answered == self.files and self.retry:
            for _ in range(min(self.c.threads, len(self.retry))):
                self._next_file()

    def _next_file(self) -> None:
        if self.retry:
            self.retry.pop()
            self._attempt(1)

    def _attempt(self, attempt: int) -> None:
        self.sim.request(lambda passed: self._file_answer(passed, attempt))

    def _file_answer(self, passed: bool, attempt: int) -> None:
        if passed:
            self.budget.earn()
        elif attempt < self.c.max_attempts and self.budget.spend():
            ceiling = min(self.c.max_delay_s, self.c.base_delay_s * 2 ** (attempt - 1) * self.c.throttle_factor)
            self.sim.at(self.sim.now + self.rng.uniform(ceiling / 2, ceiling), self._attempt, attempt + 1)
            return
        self._resolve(not passed)
        self._next_file()

    # -- node / pool: paced by the shared rate, throttles retried until the time bound
    def _paced_send(self, attempt: int) -> None:
        assert self.rate is not None
        self.rate.wait(self.sim, lambda: self._paced_go(attempt))

    def _paced_go(self, attempt: int) -> None:
        sent = self.sim.now
        self.sim.request(lambda passed: self._paced_answer(passed, attempt, sent))

    def _paced_answer(self, passed: bool, attempt: int, sent: float) -> None:
        assert self.rate is not None
        self.rate.answered(passed, sent, self.sim.now)
        if passed or self.sim.now >= self.deadline:
            self._resolve(not passed)
            if self.unsent:
                self.unsent -= 1
                self._paced_send(1)
            return
        self._paced_send(attempt + 1)

    def _resolve(self, failed: bool) -> None:
        self.resolved += 1
        self.failed += 1 if failed else 0
        if self.resolved == self.files:
            self.done(self.failed > 0)


def simulate(limit: Limit, client: Client, jobs: int, files: int, seed: int = 37) -> Outcome:
    """``jobs`` jobs released together, each making ``files`` requests on one prefix."""
    sim, rng = _Sim(limit, client.latency_s), random.Random(seed)
    ends: List[Tuple[float, bool]] = []
    shared: Dict[int, _Rate] = {}

    def rate_for(j: int) -> Optional[_Rate]:
        if client.kind == "today":
            return None
        key = 0 if client.kind == "pool" else j // client.slots
        if key not in shared:
            shared[key] = _Rate(client.pool_share * limit.rate if client.kind == "pool" else None,
                                client.regrow_s)
        return shared[key]

    for j in range(jobs):
        job = _Job(sim, client, files, rate_for(j), rng, lambda failed: ends.append((sim.now, failed)))
        sim.at(client.start_s * rng.uniform(0.5, 1.5) + rng.uniform(0.0, jobs * client.spread_s), job.start)
    sim.run()
    return Outcome(jobs, files, sum(1 for _, f in ends if f), max(t for t, _ in ends),
                   jobs * files / limit.rate, sim.requests, sim.throttled)


# --------------------------------------------------------------------------- calibration and report


def calibrate(measured: Dict[str, Any]) -> Tuple[Client, List[Dict[str, Any]]]:
    """The round trip, start-up and start spread that best match the measured runs of ours
    (plain, no stager) at their own N, M, R and burst: failed jobs, 503 share and wall/floor,
    weighted alike; the comparison rows at the chosen values. The spread is the test machine's
    (N processes starting on 2 cores); predictions release a pool's jobs together."""
    runs = [r for r in measured["runs"] if r["tool"] == "ours" and r["reuse"] == "plain" and not r["stager"]]
    burst = float(measured["params"]["burst"])
    best: Optional[Tuple[float, Client, List[Dict[str, Any]]]] = None
    for latency, start, spread in itertools.product((0.002, 0.005, 0.01), (0.2, 0.5), (0.0, 0.05, 0.1, 0.2)):
        client = Client(latency_s=latency, start_s=start, spread_s=spread)
        rows = [_compare(client, run, burst) for run in runs]
        error = sum(abs(r["model_failed"] - r["measured_failed"]) / r["jobs"] + abs(r["model_503"] - r["measured_503"])
                    + abs(math.log(r["model_wall_over_floor"] / r["measured_wall_over_floor"])) for r in rows)
        if best is None or error < best[0]:
            best = (error, client, rows)
    if best is None:
        return Client(), []
    return best[1], best[2]


def _compare(client: Client, run: Dict[str, Any], burst: float) -> Dict[str, Any]:
    limit = Limit("the front", float(run["rate"]), burst)
    got = simulate(limit, client, int(run["jobs"]), int(run["files"]))
    return {"jobs": run["jobs"], "objects": run["objects"], "measured_failed": run["jobs_failed"],
            "model_failed": got.jobs_failed, "measured_503": run["share_503"], "model_503": round(got.share_503, 3),
            "measured_wall_over_floor": run["wall_over_floor"], "model_wall_over_floor": round(got.wall_s / got.floor_s, 3)}


def predictions(client: Client, counts: Sequence[int] = (1000, 10000), files: int = 200,
                bundle_requests: int = 3) -> List[Dict[str, Any]]:
    """Every store, N, client kind and way of reading, as rows."""
    rows = []
    for limit, jobs, kind, reuse in itertools.product((S3, GCS), counts, ("today", "node", "pool"),
                                                      ("plain", "bundles", "cache")):
        c = replace(client, kind=kind)
        if reuse == "plain":
            got = simulate(limit, c, jobs, files)
        elif reuse == "bundles":
            got = simulate(limit, c, jobs, bundle_requests)
        else:  # one set of requests per node; the node's other jobs hit its cache
            got = simulate(limit, c, math.ceil(jobs / client.slots), files)
        failed = got.jobs_failed * (client.slots if reuse == "cache" else 1)
        rows.append({"store": limit.name, "jobs": jobs, "client": kind, "reuse": reuse, "jobs_failed": failed,
                     "fan_in_s": round(got.wall_s, 1), "floor_s": round(jobs * files / limit.rate, 1),
                     "requests": got.requests, "share_503": round(got.share_503, 3),
                     "jobs_done_per_s": round((jobs - failed) / got.wall_s, 1)})
    return rows


def run(measured: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    client, agreement = calibrate(measured) if measured else (Client(), [])
    return {"scenario": "throttle-model", "client": asdict(client), "agreement": agreement,
            "predictions": predictions(replace(client, spread_s=0.0))}


def format_table(result: Dict[str, Any]) -> str:
    lines: List[str] = []
    if result["agreement"]:
        keys = list(result["agreement"][0])
        lines += ["model against measurement (today's client, calibrated):"]
        lines += aligned([keys] + [[str(r[k]) for k in keys] for r in result["agreement"]], left=2)
        lines.append("")
    client = result["client"]
    lines.append(f"predictions (round trip {client['latency_s'] * 1000:g} ms, start-up {client['start_s']:g} s, "
                 f"{client['slots']} jobs per node, M = 200 small files per job, all jobs released together; "
                 "fan_in_s: until the last job has its inputs or has failed; floor_s: N*M/limit):")
    keys = list(result["predictions"][0])
    lines += aligned([keys] + [[str(r[k]) for k in keys] for r in result["predictions"]], left=4)
    return "\n".join(lines)
