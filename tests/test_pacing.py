"""The pacing arithmetic (transfer/pacing.py): the cut, the cubic growth back, the bucket's
reservations, one cut per round, and the fast path that costs nothing while nothing throttles.
Pure functions of a state and a time: no clock, no sleep."""

from __future__ import annotations

import threading
from typing import List, Tuple

import pytest

from transfer import parse_url
from transfer.pacing import (
    BETA, BURST_SECONDS, CALM_SECONDS, CUT_SECONDS, LEARN_EVERY, MAX_WAIT, MIN_RATE, LocalStates, Pacer, RateState, cut, due_in,
    prefix_key, rate_at, reserve, wait_for,
)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.slept: List[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Counting:
    """A state store that records each call (``calls``) and holds nothing."""

    def __init__(self) -> None:
        self.calls: List[Tuple[str, str]] = []

    def update(self, key, change):  # type: ignore[no-untyped-def]
        self.calls.append(("update", key))
        return 0.0

    def peek(self, key):  # type: ignore[no-untyped-def]
        self.calls.append(("peek", key))


def test_first_cut_is_beta_times_the_measured_rate() -> None:
    state, _ = cut(None, 10.0, measured=200.0, sent=9.9)
    assert state is not None
    assert state.last_max == 200.0 and state.cut_at == 10.0
    assert rate_at(state, 10.0) == pytest.approx(BETA * 200.0)


def test_rate_grows_back_cubically_to_the_last_max_then_beyond() -> None:
    state = RateState(200.0, 0.0, 0.0, 0.0)
    k = (200.0 * (1 - BETA) / 0.4) ** (1 / 3)
    assert rate_at(state, k) == pytest.approx(200.0)
    samples = [rate_at(state, t) for t in (0.0, k / 2, k, 1.5 * k, 2 * k)]
    assert samples == sorted(samples)  # never falls between cuts
    assert samples[1] - samples[0] > samples[2] - samples[1]  # fast far below the old maximum, slow near it
    assert samples[4] > 200.0  # then probes beyond it


def test_a_later_cut_is_beta_times_the_bucket_rate() -> None:
    state = RateState(100.0, 0.0, 0.0, 0.0)
    now = 20.0
    before = rate_at(state, now)
    after, _ = cut(state, now, measured=1e6, sent=now - 0.01)
    assert after is not None and after.last_max == pytest.approx(before)
    assert rate_at(after, now) == pytest.approx(BETA * before)


def test_one_cut_per_round() -> None:
    state, _ = cut(None, 10.0, measured=100.0, sent=9.0)
    again, _ = cut(state, 12.0, measured=100.0, sent=9.5)  # sent before the cut: same round
    assert again is state
    soon, _ = cut(state, 10.0 + CUT_SECONDS / 2, measured=100.0, sent=10.01)  # answers arriving together
    assert soon is state
    later, _ = cut(state, 12.0, measured=100.0, sent=11.0)
    assert later is not state and later is not None and later.cut_at == 12.0


def test_rate_never_below_the_floor() -> None:
    state: RateState | None = None
    now = 0.0
    for _ in range(50):
        now += 1.0
        state, _ = cut(state, now, measured=0.0, sent=now)
    assert state is not None and MIN_RATE <= rate_at(state, now) < 2 * MIN_RATE
    assert rate_at(state, now + 0.001) >= MIN_RATE and state.last_max >= MIN_RATE


def test_reservations_space_requests_at_the_rate() -> None:
    state = RateState(100.0, 0.0, 0.0, 0.0)  # rate 70/s at t=0
    waits = []
    current: RateState | None = state
    for _ in range(20):
        current, wait = reserve(current, 0.0)
        waits.append(wait)
    rate = rate_at(state, 0.0)
    # the empty bucket: the n-th request waits until n tokens are made, at a rate growing from 70/s
    assert waits == sorted(waits) and waits == pytest.approx([(n + 1) / rate for n in range(20)], rel=0.05)
    assert all(w <= (n + 1) / rate for n, w in enumerate(waits))
    assert all(wait_for(state, 0.0, n + 1) == w for n, w in enumerate(waits))


def test_wait_for_counts_the_growth_of_the_rate() -> None:
    state = RateState(1.0, 0.0, -50.0, 0.0)  # cut from 1/s: the cubic grows fast in relative terms

    def made(t: float, ceiling: float = float("inf")) -> float:  # the integral, by small steps
        steps = 20000
        return sum(min(rate_at(state, (i + 0.5) * t / steps), ceiling) * t / steps for i in range(steps))

    for owed in (0.5, 5.0, 50.0, 500.0):
        t = wait_for(state, 0.0, owed)
        assert made(t) == pytest.approx(owed, rel=1e-3)
        assert t < owed / rate_at(state, 0.0)  # far less than at the rate of the cut (the collapse measured)
        capped = wait_for(state, 0.0, owed, ceiling=5.0)
        assert made(capped, 5.0) == pytest.approx(owed, rel=1e-3) and capped >= t
    assert wait_for(state, 0.0, 0.0) == 0.0 and wait_for(state, 0.0, -3.0) == 0.0
    assert wait_for(RateState(100.0, 0.0, 0.0, 0.0), 50.0, 10.0, ceiling=20.0) == pytest.approx(0.5)  # at the ceiling


def test_bucket_refills_up_to_its_burst_only() -> None:
    state = RateState(100.0, 0.0, 0.0, 0.0)
    rate = rate_at(state, 1.0)
    current: RateState | None = state
    free = 0
    for _ in range(100):
        current, wait = reserve(current, 1.0)  # a second idle: the bucket is full, not 70 tokens
        free += wait == 0.0
    assert current is not None and rate_at(current, 1.0) <= rate  # (the growth waited out the idle second)
    assert free == int(max(1.0, rate_at(current, 1.0) * BURST_SECONDS))


def test_the_rate_grows_only_while_the_bucket_is_used() -> None:
    state = RateState(100.0, 0.0, 0.0, 0.0)
    busy: RateState | None = state
    for n in range(10_000):  # a request every ms, more than the rate: the bucket stays empty, the cubic grows
        busy, _ = reserve(busy, n * 0.001)
    assert busy is not None and rate_at(busy, 10.0) == pytest.approx(rate_at(state, 10.0), rel=0.01)
    idle, _ = reserve(state, 20.0)  # one request after 20 s of a full bucket: grown as if not at all
    assert idle is not None and rate_at(idle, 20.0) == pytest.approx(rate_at(state, 0.0), rel=0.05)
    assert rate_at(state, 20.0) > 20 * rate_at(idle, 20.0)  # (2,400/s against 70/s)
    k = (100.0 * (1 - BETA) / 0.4) ** (1 / 3)
    steady: RateState | None = RateState(100.0, 0.0, 0.0, k)  # back at 100/s
    for n in range(1, 1001):  # then 50 requests/s for 20 s: none waits, and the rate stays, not 3,300/s
        steady, wait = reserve(steady, k + n * 0.02)
        assert wait == 0.0
    assert steady is not None and rate_at(steady, k + 20) == pytest.approx(100.0, rel=0.01)


def test_calm_prefix_is_forgotten() -> None:
    state = RateState(100.0, 0.0, 0.0, 0.0)
    assert reserve(state, CALM_SECONDS) == (None, -1.0)
    after, _ = cut(state, CALM_SECONDS + 1, measured=300.0, sent=CALM_SECONDS)
    assert after is not None and after.last_max == 300.0  # a stale rate is not reused


def test_prefix_key_is_endpoint_and_directory() -> None:
    a = prefix_key(parse_url("s3://u@site/bucket/run/a.dat"))
    b = prefix_key(parse_url("s3://u@site/bucket/run/b.dat"))
    c = prefix_key(parse_url("s3://u@site/bucket/other/a.dat"))
    assert a == b != c


def test_prefix_key_is_the_store_prefix_not_the_directory() -> None:
    def key(url: str) -> str:
        return prefix_key(parse_url(url))

    # S3: the bucket and the key's first directory, as the store (and the test bed's front) limits them:
    # jobs reading their own directories under one prefix share one rate
    assert key("s3://u@site/bench/data/j001/f7") == key("s3://u@site/bench/data/j002/sub/f8") \
        == key("s3s://u@site/bench/data/f9").replace("s3s", "s3", 1) == "s3://u@site/bench/data/"
    assert key("s3://u@site/bench/other/j001/f7") == "s3://u@site/bench/other/"
    assert key("s3://u@other/bench/data/j001/f7") == "s3://u@other/bench/data/"  # another endpoint
    # whole directories only: an object or a listing at the bucket's top is the bucket's
    assert key("s3://u@site/bench/f7") == key("s3://u@site/bench") == key("s3://u@site/bench/") == "s3://u@site/bench/"
    assert key("s3://u@site/bench//x/y") == "s3://u@site/bench//"  # an empty directory name is one
    # GCS documents its starting limit per bucket (the URL's host)
    assert key("gs://bkt/run/a/f") == key("gs://bkt/f") == key("gs://bkt") == "gs://bkt/"
    # no store prefix to follow: the key's directory
    assert key("https://h.example/a/b/c") == "https://h.example/a/b/"
    assert key("sftp://h/home/u/d/f") == "sftp://h/home/u/d/"


def test_every_object_store_row_names_its_prefix_rule() -> None:
    from transfer.pacing_pool import DOCUMENTED_RATE
    from transfer.schemes import OBJECT_STORES, SCHEMES
    for name in OBJECT_STORES:  # a new backend's row picks the rule: nothing else lists the schemes
        row = SCHEMES[name]
        assert row.pace_root is not None and row.pace_depth >= 0 and row.read_rate, name
        assert DOCUMENTED_RATE[name] == row.read_rate
    assert DOCUMENTED_RATE["s3"] == 5500.0 and DOCUMENTED_RATE["gs"] == 5000.0


def _queue(state: RateState, now: float, count: int) -> Tuple[RateState, List[Tuple[float, float, float]]]:
    """``count`` reservations at ``now``: the state after them, and each one's (due, ticket, owed)."""
    current: RateState | None = state
    booked = []
    for _ in range(count):
        current, wait = reserve(current, now)
        assert current is not None
        booked.append((now + wait, current.taken, -current.tokens))
    assert current is not None
    return current, booked


def test_a_cut_stretches_the_queue_in_order_and_leaves_no_gap() -> None:
    now = (100.0 * (1 - BETA) / 0.4) ** (1 / 3)  # back at the rate of the last cut, where the cubic is flat
    current, booked = _queue(RateState(100.0, 0.0, 0.0, now), now, int(100.0 * BURST_SECONDS) + 200)
    queued = [b for b in booked if b[0] > now]
    assert len(queued) >= 199
    old = rate_at(current, now)
    after, _ = cut(current, now, measured=0.0, sent=now)
    assert after is not None and rate_at(after, now) == pytest.approx(BETA * old)
    moved = [now + due_in(after, ticket, now, owed) for _, ticket, owed in queued]
    assert moved == sorted(moved)  # the queue keeps its order
    assert all(m > d for m, (d, _, _) in zip(moved, queued))  # and leaves later: at the new rate, not the old
    gaps = [b - a for a, b in zip(moved, moved[1:])]
    assert max(gaps) == pytest.approx(1 / (BETA * old), rel=0.01)  # the first gaps: the rate right after the cut
    assert min(gaps) >= 1 / (1.05 * old)  # never much faster than the rate before it (it regrows meanwhile)
    drained = now + wait_for(after, now, -after.tokens)  # the tokens owed at the cut, made at the new rate
    assert moved[-1] == pytest.approx(drained, abs=2 / old)
    # the first request booked after the cut goes out right after the queue: no gap, no overlap
    _, wait = reserve(after, now)
    assert now + wait == pytest.approx(drained + 1 / (BETA * old), abs=2 / old)
    # a token already made, or a state gone, keeps the request's time; no wait exceeds what was owed
    assert due_in(after, after.taken + after.tokens - 5, now, 10.0) == 0.0 and due_in(None, 7.0, now, 3.0) == 0.0
    assert due_in(after, after.taken + 1e9, now, 3.0) == pytest.approx(wait_for(after, now, 3.0))


def test_a_queue_follows_every_cut_made_while_it_sleeps() -> None:
    """Three cuts, a round apart, while 600 reservations wait (a node's queue is seconds deep):
    the queue leaves in order, and never faster than the rate in use as each request leaves.
    Re-timing from the last cut alone (before: the due first booked, stretched by that cut)
    sent the requests booked before the first cut among those booked after it: twice the rate."""
    now = (200.0 * (1 - BETA) / 0.4) ** (1 / 3)
    state, booked = _queue(RateState(200.0, 0.0, 0.0, now), now, 600)  # 3 s of tokens owed
    cuts = [now + 0.2 + CUT_SECONDS * k for k in range(3)]
    for k, at in enumerate(cuts):
        state, more = _queue(state, at, 100)  # each round, more requests queue behind
        booked += more
        after, _ = cut(state, at, measured=0.0, sent=at - 0.01)
        assert after is not None and after is not state
        state = after
    last = cuts[-1]
    leaving = [(last + due_in(state, ticket, last, owed), ticket) for due, ticket, owed in booked if due > last]
    times = [t for t, _ in sorted(leaving, key=lambda pair: pair[1])]
    assert times == sorted(times)  # in the order booked
    window = 0.5
    busiest = max(sum(1 for t in times if start <= t < start + window) for start in times)
    assert busiest <= rate_at(state, times[-1]) * window + 2  # at most the rate in use (it regrows meanwhile)
    assert rate_at(state, last) < BETA * 200.0  # (three cuts, less what it regrew between them)


def test_a_request_booked_before_two_cuts_waits_for_the_rate_after_both() -> None:
    clock = FakeClock()
    states = LocalStates()
    pace = Pacer(states, clock, clock.sleep).pace(parse_url("s3://u@site/b/p/x"))
    pace.sent = 200
    clock.now += 1.0
    pace.throttled(clock.now)  # paced at 140/s from an empty bucket
    clock.now += CUT_SECONDS  # (the next round)
    states.update(pace.key, lambda state: reserve(state, clock.now))  # (the bucket is empty again)
    other = Pacer(states, clock, clock.sleep).pace(parse_url("s3://u@site/b/p/y"))
    for _ in range(500):  # another job's 500 requests queue ahead: about 3 s
        states.update(other.key, lambda state: reserve(state, clock.now))
    booked = clock.now
    ticket = states._states[pace.key].taken + 1  # the number its reservation will hold
    cut_times: List[float] = []

    def sleep(seconds: float) -> None:  # while this request sleeps, another job is throttled twice
        clock.slept.append(seconds)
        if len(clock.slept) == 1:
            for _ in range(2):
                clock.now += CUT_SECONDS + 0.1
                other.throttled(clock.now - 0.05)
                cut_times.append(clock.now)
            clock.now += seconds - 2 * (CUT_SECONDS + 0.1)
        else:
            clock.now += seconds

    pace._sleep = sleep
    pace.acquire()
    first = clock.slept[0]
    assert len(clock.slept) >= 2 and clock.now > booked + first  # it woke, saw the cuts and waited on
    after = states._states[pace.key]  # the state of the second cut
    assert after.cut_at == cut_times[-1] and after.taken == ticket
    # it leaves when the state after both cuts has made its token: not before, not later
    assert due_in(after, ticket, clock.now, 1e9) == pytest.approx(0.0, abs=1e-3)
    assert due_in(after, ticket, clock.now - 0.05, 1e9) > 0.04
    # re-timed by the last cut alone from the due first booked, it left sooner: at the rate before the first cut
    by_last = after.cut_at + wait_for(after, after.cut_at, (booked + first - after.cut_at) * after.last_max)
    assert clock.now > by_last + 0.2


def test_fast_path_takes_no_lock_and_never_sleeps() -> None:
    class Refusing:
        def update(self, key, change):  # type: ignore[no-untyped-def]
            if change(None)[0] is not None:
                raise AssertionError("state written while nothing throttles")
            return 0.0

        def peek(self, key):  # type: ignore[no-untyped-def]
            return None

    clock = FakeClock()
    pace = Pacer(Refusing(), clock, clock.sleep).pace(parse_url("s3://u@site/b/p/x"))
    pace._states = counting = Counting()
    for _ in range(1000):
        pace.acquire()
    # a look at the shared state (no lock) once per LEARN_EVERY requests, never a reservation or a sleep
    assert counting.calls == [("peek", pace.key)] * (1000 // LEARN_EVERY) and clock.slept == [] and pace.requests == 1000


def test_throttle_then_paced_then_calm_again() -> None:
    clock = FakeClock()
    pacer = Pacer(LocalStates(), clock, clock.sleep)
    pace = pacer.pace(parse_url("s3://u@site/b/p/x"))
    for _ in range(100):
        pace.acquire()
    clock.now += 1.0  # 100 requests/s measured
    pace.throttled(clock.now - 0.05)
    assert pace.limited
    for _ in range(7):
        pace.acquire()
    assert sum(clock.slept) == pytest.approx(7 / (BETA * 100), rel=0.05)  # (the rate grows 3% meanwhile)
    clock.now += CALM_SECONDS
    pace.acquire()
    assert not pace.limited  # back on the fast path


def test_a_new_pace_learns_a_throttled_prefix() -> None:
    clock = FakeClock()
    states = LocalStates()
    first = Pacer(states, clock, clock.sleep).pace(parse_url("s3://u@site/b/p/x"))
    first.acquire()
    first.throttled(clock.now)
    second = Pacer(states, clock, clock.sleep).pace(parse_url("s3://u@site/b/p/y"))
    assert second.limited
    other = Pacer(states, clock, clock.sleep).pace(parse_url("s3://u@site/b/q/y"))
    assert not other.limited


def test_threads_share_one_bucket() -> None:
    clock = FakeClock()
    lock = threading.Lock()

    def sleep(seconds: float) -> None:
        with lock:
            clock.slept.append(seconds)

    pacer = Pacer(LocalStates(), clock, sleep)
    pace = pacer.pace(parse_url("s3://u@site/b/p/x"))
    pace.sent = 100
    clock.now += 1.0
    pace.throttled(clock.now)
    threads = [threading.Thread(target=lambda: [pace.acquire() for _ in range(50)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state = pacer._states._states[pace.key]  # type: ignore[attr-defined]
    # 200 reservations from an empty bucket at one instant: the waits for 1 .. 200 tokens, each once
    assert sorted(clock.slept) == pytest.approx([wait_for(state, clock.now, n + 1) for n in range(200)])


def test_throttled_keeps_retry_after_through_pickle() -> None:
    import pickle

    from transfer.errors import Throttled, retry_after_seconds
    err = Throttled("HTTP 503 SlowDown", url="s3://u@s/b/k", operation="get", status=503, retry_after=2.5)
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, Throttled) and back.retry_after == 2.5 and back.status == 503 and str(back) == str(err)
    assert [retry_after_seconds(v) for v in ("3", " 1.5 ", "", None, "-1", "Wed, 21 Oct 2015 07:28:00 GMT", "nan")] \
        == [3.0, 1.5, None, None, None, None, None]


def test_throttle_delay_is_retry_after_bounded_and_jittered() -> None:
    import random

    from transfer.errors import Throttled
    from transfer.retry import RetryPolicy
    policy = RetryPolicy(base_delay=0.01, max_delay=0.05, max_retry_after=60.0)
    rng = random.Random(7)
    waits = [policy.throttle_delay(1, Throttled("x", retry_after=3.0), rng, 100.0) for _ in range(200)]
    assert all(w is not None and 3.0 <= w <= 3.6 for w in waits) and len(set(waits)) > 100
    assert policy.throttle_delay(1, Throttled("x", retry_after=1e9), rng, 1000.0) <= 72.0  # type: ignore[operator]
    assert policy.throttle_delay(1, Throttled("x", retry_after=30.0), rng, 2.0) == 2.0  # never past the time bound
    assert policy.throttle_delay(1, Throttled("x"), rng, 0.0) is None  # the time is up
    assert policy.throttle_delay(5, Throttled("x"), rng, 100.0) <= 0.05  # type: ignore[operator]


def test_a_cut_keeps_the_queue_owed_and_the_next_round_starts_after_it() -> None:
    state = RateState(100.0, 0.0, 0.0, 0.0)
    now = CUT_SECONDS + 0.5  # a round after the cut: ~71 requests/s
    current: RateState | None = reserve(state, now)[0]
    assert current is not None
    rate = rate_at(current, now)  # (the growth waited out the time the bucket had tokens to spare)
    for _ in range(int(rate * BURST_SECONDS) + 49):  # 50 requests queued behind a full bucket
        current, _ = reserve(current, now)
    assert current is not None
    after, _ = cut(current, now, measured=0.0, sent=now)
    assert after is not None and after.tokens == pytest.approx(-50.0, abs=1)  # still owed: new requests queue behind
    assert wait_for(after, now, -after.tokens) == pytest.approx(50 / (BETA * rate), rel=0.15)  # the new rate (regrowing)
    # the queue leaves at the new rate (retime), so an answer to a request sent after the cut
    # (and past the answers in flight) is the next round's signal
    assert cut(after, now + CUT_SECONDS / 2, measured=0.0, sent=now + 0.01)[0] is after
    later, _ = cut(after, now + CUT_SECONDS + 0.15, measured=0.0, sent=now + 0.3)
    assert later is not None and later is not after and later.cut_at == now + CUT_SECONDS + 0.15


def test_an_unpaced_request_throttled_takes_up_the_cut_without_cutting_again() -> None:
    first, _ = cut(None, 10.0, measured=20.0, sent=9.9)  # one job's first answer: the node's state
    assert first is not None
    # 50 more jobs, each throttled once on requests they sent before pacing: one cut, not 50
    assert cut(first, 11.0, measured=20.0, sent=10.9, paced=False)[0] is first
    clock = FakeClock()
    states = LocalStates()
    a = Pacer(states, clock, clock.sleep).pace(parse_url("s3://u@site/b/p/x"))
    b = Pacer(states, clock, clock.sleep).pace(parse_url("s3://u@site/b/p/y"))
    sent_early = clock.now
    a.sent = 100
    clock.now += 1.0
    a.throttled(sent_early)
    kept = states.update(a.key, lambda state: (state, state.cut_at if state else -1.0))
    clock.now += 1.0
    b.throttled(sent_early + 0.5)  # b was on the fast path when it sent that request
    assert b.limited
    assert states.update(a.key, lambda state: (state, state.cut_at if state else -1.0)) == kept
    b.throttled(clock.now)  # b's request reserved since then is paced: a new round
    assert states.update(a.key, lambda state: (state, state.cut_at if state else -1.0)) == clock.now


def test_a_running_job_takes_up_what_another_learned() -> None:
    clock = FakeClock()
    states = LocalStates()
    running = Pacer(states, clock, clock.sleep).pace(parse_url("s3://u@site/b/p/x"))
    running.acquire()
    other = Pacer(states, clock, clock.sleep).pace(parse_url("s3://u@site/b/p/y"))
    other.sent = 100
    clock.now += 1.0
    other.throttled(clock.now)
    for _ in range(LEARN_EVERY):
        running.acquire()
    assert running.limited
