"""The node's rate file (transfer/pacing_node.py): jobs (processes) share one bucket per
prefix; the file is private, bounded, never followed through a link, and a job whose file is
unusable paces alone after one warning."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from transfer import parse_url
from transfer.pacing import BETA, Pacer, RateState, wait_for
from transfer.pacing_node import MAX_BYTES, NodeStates, node_rate_dir

URL = parse_url("s3://u@site/bucket/run/a.dat")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0
        self.slept: list = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def _pacer(directory: Path, clock: FakeClock) -> Pacer:
    return Pacer(NodeStates(str(directory), clock), clock, clock.sleep)


def test_no_file_until_a_prefix_is_throttled(tmp_path: Path) -> None:
    clock = FakeClock()
    pace = _pacer(tmp_path / "node", clock).pace(URL)
    for _ in range(10):
        pace.acquire()
    assert not (tmp_path / "node").exists()


def test_two_jobs_share_one_bucket(tmp_path: Path) -> None:
    clock = FakeClock()
    first = _pacer(tmp_path / "node", clock).pace(URL)
    first.sent = 100
    clock.now += 1.0
    first.throttled(clock.now)
    assert oct((tmp_path / "node").stat().st_mode & 0o777) == "0o700"
    assert oct((tmp_path / "node" / "rates").stat().st_mode & 0o777) == "0o600"
    second = _pacer(tmp_path / "node", clock).pace(parse_url("s3://u@site/bucket/run/b.dat"))
    assert second.limited  # a job that starts while the prefix is throttled starts paced
    for pace in (first, second) * 10:
        pace.acquire()
    state = RateState(100.0, clock.now, 0.0, clock.now)  # the cut's rate and time: what the waits grow from
    # one bucket: 20 reservations at one instant wait for 1 .. 20 tokens, about 1/rate .. 20/rate
    assert sorted(clock.slept) == pytest.approx([wait_for(state, clock.now, n + 1) for n in range(20)])
    assert sorted(clock.slept) == pytest.approx([(n + 1) / (BETA * 100) for n in range(20)], rel=0.05)


def test_a_real_second_process_sees_the_cut(tmp_path: Path) -> None:
    clock = FakeClock()
    first = _pacer(tmp_path / "node", clock).pace(URL)
    first.throttled(clock.now)
    code = ("import sys, time; from transfer import parse_url; from transfer.node import open_pacer; "
            "print(open_pacer({'XDG_RUNTIME_DIR': sys.argv[1]}).pace(parse_url(sys.argv[2])).limited)")
    os.rename(tmp_path / "node", tmp_path / "pegasus-cloudio")
    clock.now = __import__("time").time()
    (tmp_path / "pegasus-cloudio" / "rates").write_text(
        f"s3://u@site/bucket/run/\t50.0\t{clock.now}\t0.0\t{clock.now}\t{clock.now}\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(URL)], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "True", done.stderr
    assert node_rate_dir({"XDG_RUNTIME_DIR": str(tmp_path)}) == str(tmp_path / "pegasus-cloudio")
    assert node_rate_dir({}) == f"/tmp/pegasus-cloudio-{os.getuid()}"


@pytest.mark.parametrize("make", ["symlink", "fifo", "open_dir"])
def test_an_unsafe_file_is_not_used(tmp_path: Path, make: str, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "node"
    directory.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    if make == "symlink":
        (directory / "rates").symlink_to(victim)
    elif make == "fifo":
        os.mkfifo(directory / "rates", 0o600)
    else:
        os.chmod(directory, 0o777)
    clock = FakeClock()
    pacer = _pacer(directory, clock)
    with caplog.at_level(logging.WARNING):
        for n in range(3):
            pace = pacer.pace(parse_url(f"s3://u@site/bucket/d{n}/x"))
            pace.throttled(clock.now)
            pace.acquire()
    assert victim.read_text() == "keep\n"
    assert len([r for r in caplog.records if "rate file" in r.getMessage()]) == 1
    assert pace.limited  # paced alone all the same


def test_the_file_stays_bounded_and_drops_nonsense(tmp_path: Path) -> None:
    directory = tmp_path / "node"
    directory.mkdir(mode=0o700)
    clock = FakeClock()
    junk = "".join(f"s3://u@site/b/{n}/\t-5\t{clock.now}\t0\t{clock.now}\t0\n" for n in range(100))
    junk += f"s3://u@site/b/future/\t5\t{clock.now + 1e6}\t0\t{clock.now}\t0\n" + "y" * (MAX_BYTES * 2)
    (directory / "rates").write_text(junk)
    pacer = _pacer(directory, clock)
    for n in range(400):
        pacer.pace(parse_url(f"s3://u@site/bucket/{'k' * 200}{n}/x")).throttled(clock.now)
        clock.now += 0.001
    data = (directory / "rates").read_bytes()
    assert len(data) <= MAX_BYTES
    assert b"\t-5\t" not in data and b"/future/" not in data and b"yyy" not in data
    assert not pacer.pace(parse_url("s3://u@site/b/future/x")).limited


def test_a_state_owing_years_of_tokens_waits_at_most_a_minute(tmp_path: Path) -> None:
    directory = tmp_path / "node"
    directory.mkdir(mode=0o700)
    clock = FakeClock()
    state = RateState(1.0, clock.now, -1e12, clock.now)
    (directory / "rates").write_text(f"s3://u@site/bucket/run/\t{state.last_max}\t{state.cut_at}\t{state.tokens}"
                                     f"\t{state.stamp}\t{state.epoch}\n")
    pace = _pacer(directory, clock).pace(URL)
    pace.acquire()
    assert clock.slept and 0 < clock.slept[0] <= 60.0


def test_a_look_waits_for_no_lock_and_a_torn_file_is_read_under_it(tmp_path: Path) -> None:
    import fcntl
    clock = FakeClock()
    states = NodeStates(str(tmp_path / "node"), clock)
    job = Pacer(states, clock, clock.sleep).pace(URL)
    job.sent = 100
    clock.now += 1.0
    job.throttled(clock.now)
    rates = tmp_path / "node" / "rates"
    written = rates.read_bytes()
    assert written.startswith(b"#v1 ")
    holder = os.open(rates, os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # a writer the CPU set aside: a look must not queue behind it
        state = states.peek(job.key)
        assert state is not None and state.last_max == pytest.approx(100.0) and state.cut_at == clock.now
        job.throttled(clock.now)  # an answer of the same round: decided from a look, no lock
        job.learn()  # the look every LEARN_EVERY requests
        assert job.limited
    finally:
        os.close(holder)
    # a look that overlaps a write (new lines over the old, not yet truncated) fails the check and reads
    # under the lock: what the header vouches for, never a line spliced from the two
    torn = written.replace(b"\t100.0\t", b"\t900.0\t")
    rates.write_bytes(torn + b"s3://u@site/other/\t5.0\t%r\t0.0\t%r\t%r\n" % ((clock.now,) * 3))
    assert states.peek("s3://u@site/other/") is not None  # (checked under the lock: an older release's file)
    rates.write_bytes(written + b"s3://u@site/other/\t5.0\t%r\t0.0\t%r\t%r\n" % ((clock.now,) * 3))
    assert states.peek("s3://u@site/other/") is None  # past the header's length: the old file's tail
    assert states.peek(job.key) == state
