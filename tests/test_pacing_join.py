"""The first cut from the node's rate (transfer/pacing.py, issue 37): the jobs that were sending
unpaced when a prefix was cut add their rates to the cut (``join``), and a pipelined pass draws
its tokens from the bucket (``Pace.draw``). Pure functions and a fake clock: no sleep."""

from __future__ import annotations

import pytest

from transfer import parse_url
from transfer.pacing import (
    BETA, BURST_SECONDS, CUT_SECONDS, LEARN_EVERY, PASS_LEARN_EVERY, LocalStates, Pacer, RateState, cut, join, rate_at,
)

from test_pacing import Counting, FakeClock  # (a sleep moves it on)

URL = parse_url("s3://u@site/b/p/x")


def test_a_job_that_joins_in_the_round_of_the_cut_adds_its_rate() -> None:
    first, _ = cut(None, 10.0, measured=20.0, sent=9.9)  # one job's answer: the node's first cut
    assert first is not None
    joined = join(first, 10.4, measured=30.0)
    assert joined.last_max == pytest.approx(50.0) and joined.cut_at == 10.0
    assert rate_at(joined, 10.0) == pytest.approx(BETA * 50.0)  # the bucket: BETA times the node's rate
    assert (joined.tokens, joined.stamp, joined.epoch) == (first.tokens, first.stamp, first.epoch)


def test_a_join_after_the_round_or_with_nothing_sent_changes_nothing() -> None:
    first = RateState(20.0, 10.0, 0.0, 10.0, 10.0)
    assert join(first, 10.0 + CUT_SECONDS, measured=30.0) is first  # a later round: the rate is the bucket's
    assert join(first, 9.0, measured=30.0) is first  # (a clock behind the cut's)
    assert join(first, 10.5, measured=0.0) is first  # a job that sent nothing (started after the cut)


def test_a_join_never_passes_the_ceiling() -> None:
    first = RateState(20.0, 10.0, 0.0, 10.0, 10.0)
    assert join(first, 10.5, measured=100.0, ceiling=50.0).last_max == 50.0
    at_ceiling = RateState(50.0, 10.0, 0.0, 10.0, 10.0)
    assert join(at_ceiling, 10.5, measured=100.0, ceiling=50.0) is at_ceiling


def test_cut_joins_only_for_a_first_answer_of_a_job_not_yet_paced() -> None:
    first, _ = cut(None, 10.0, measured=20.0, sent=9.9)
    assert first is not None
    joining, _ = cut(first, 10.5, measured=30.0, sent=10.4, paced=False, joining=True)
    assert joining is not None and joining.last_max == pytest.approx(50.0)
    # the job's other answers of the storm (it paces now, those requests did not): nothing new
    assert cut(joining, 10.6, measured=30.0, sent=10.4, paced=False)[0] is joining


def test_the_node_first_cut_is_from_the_rate_of_all_its_jobs() -> None:
    """Ten jobs at 20 requests/s each, unpaced: the first answer cuts from one job's rate, and each
    of the others' first answers (in the same round) adds its own: BETA times the node's 200/s,
    not BETA times 20. A job that starts after the round paces by that rate and adds nothing."""
    clock = FakeClock()
    states = LocalStates()
    paces = [Pacer(states, clock, clock.sleep).pace(URL) for _ in range(10)]
    for pace in paces:
        pace.sent = 20
    clock.now += 1.0
    for pace in paces:
        pace.throttled(clock.now - 0.05)
    state = states.peek(paces[0].key)
    assert state is not None and state.last_max == pytest.approx(200.0, rel=0.01)
    assert rate_at(state, state.cut_at) == pytest.approx(BETA * 200.0, rel=0.01)
    clock.now += CUT_SECONDS
    late = Pacer(states, clock, clock.sleep).pace(URL)
    assert late.limited and states.peek(late.key) is state


def test_a_job_that_learns_the_cut_from_a_look_adds_its_rate_once() -> None:
    clock = FakeClock()
    states = LocalStates()
    cutting = Pacer(states, clock, clock.sleep).pace(URL)
    running = Pacer(states, clock, clock.sleep).pace(URL)
    cutting.sent = 20
    clock.now += 1.0
    cutting.throttled(clock.now)
    for _ in range(LEARN_EVERY):  # 64 requests in the second since it began: 64/s, unpaced
        running.acquire()
    assert running.limited
    state = states.peek(running.key)
    assert state is not None and state.last_max == pytest.approx(20.0 + 64.0)
    running.throttled(clock.now - 0.01)  # an answer to one of those requests: neither a cut nor a second join
    assert states.peek(running.key) is state


def test_a_pass_draws_nothing_and_looks_every_few_requests_while_nothing_throttles() -> None:
    clock = FakeClock()
    pace = Pacer(LocalStates(), clock, clock.sleep).pace(URL)
    pace._states = counting = Counting()
    for _ in range(200):
        pace.draw()
    assert counting.calls == [("peek", pace.key)] * (200 // PASS_LEARN_EVERY) and clock.slept == []
    assert pace.requests == 200


def test_a_pass_that_another_job_cut_midway_sends_at_the_bucket_rate() -> None:
    clock = FakeClock()
    states = LocalStates()
    passing = Pacer(states, clock, clock.sleep).pace(URL)
    for _ in range(PASS_LEARN_EVERY - 1):
        passing.draw()
    other = Pacer(states, clock, clock.sleep).pace(URL)
    other.sent = 100
    clock.now += 1.0
    other.throttled(clock.now)
    passing.draw()  # its look: the cut (and its own 8 requests/s joined)
    assert passing.limited
    state = states.peek(passing.key)
    assert state is not None and state.last_max == pytest.approx(100.0 + PASS_LEARN_EVERY)
    start = clock.now
    for _ in range(40):
        passing.draw()
    # 40 requests from an empty bucket at BETA times 108/s (growing a little meanwhile)
    assert clock.now - start == pytest.approx(40 / (BETA * state.last_max), rel=0.1)


def test_a_pass_into_a_prefix_already_paced_never_sends_unpaced() -> None:
    clock = FakeClock()
    states = LocalStates()
    cutting = Pacer(states, clock, clock.sleep).pace(URL)
    cutting.sent = 50
    clock.now += 1.0
    cutting.throttled(clock.now)
    clock.now += 5.0
    late = Pacer(states, clock, clock.sleep).pace(URL)
    assert late.limited
    start = clock.now
    for _ in range(20):
        late.draw()
    state = states.peek(late.key)
    assert state is not None
    rate = rate_at(state, clock.now)
    paced = 20 - max(1.0, rate * BURST_SECONDS) - 1  # all but the bucket's burst wait their turn
    assert len(clock.slept) >= paced and clock.now - start >= paced / rate
