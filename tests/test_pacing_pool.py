"""One rate per pool (transfer/pacing_pool.py) on a real redis-server: nodes share a prefix's
bucket, it stays below its share of the store's documented rate, a value no holder of the
scope wrote is ignored, and Redis going down mid-run costs one warning, not the job."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator, List

import pytest
import redis

from pegasus_cloudio_testbed.redis import RedisServer
from transfer import parse_url
from transfer.node import open_pacer
from transfer.pacing import BETA, BURST_SECONDS, Pacer, prefix_key
from transfer.pacing_node import NodeStates
from transfer.pacing_pool import PoolStates
from transfer.peers import derive_scope

URL = parse_url("s3://alice@site/bucket/run/a.dat")
KEY = prefix_key(URL)
ALICE = derive_scope("alice-secret", "s3", "http://store", "alice", "bucket")
MALLORY = derive_scope("mallory-secret", "s3", "http://store", "mallory", "bucket")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0
        self.slept: List[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


def node(server_url: str, directory: Path, clock: FakeClock, scope=ALICE, ceiling=None) -> Pacer:  # type: ignore[no-untyped-def]
    client = redis.Redis.from_url(server_url, socket_timeout=1, socket_connect_timeout=1)
    states = PoolStates(client, "t", lambda key: scope, NodeStates(str(directory), clock), clock)
    return Pacer(states, clock, clock.sleep, ceiling=ceiling)


def test_two_nodes_share_one_bucket(server: RedisServer, tmp_path: Path) -> None:
    redis.Redis.from_url(server.url).flushdb()
    clock = FakeClock()
    one = node(server.url, tmp_path / "n1", clock).pace(URL)
    one.sent = 100
    clock.now += 1.0
    one.throttled(clock.now)
    two = node(server.url, tmp_path / "n2", clock).pace(URL)
    assert two.limited  # the other node learned it from the pool, not its own file
    assert not (tmp_path / "n2").exists()
    for pace in (one, two) * 5:
        pace.acquire()
    assert sorted(clock.slept) == pytest.approx([(n + 1) / (BETA * 100) for n in range(10)], rel=0.05)
    assert sorted(clock.slept) == sorted(set(clock.slept))  # one bucket: each wait once


def test_the_pool_stays_below_its_share_of_the_documented_rate(server: RedisServer, tmp_path: Path) -> None:
    redis.Redis.from_url(server.url).flushdb()
    clock = FakeClock()
    pace = node(server.url, tmp_path / "n", clock, ceiling=lambda key: 0.5 * 5500).pace(URL)
    pace.sent = 100_000  # a burst far above the limit
    clock.now += 1.0
    pace.throttled(clock.now)
    clock.now += 50  # long after the cut, idle: the cubic alone would be at 23,000/s (it waited, see epoch)
    for _ in range(400):
        pace.acquire()
    ceiling = 0.5 * 5500
    capacity = ceiling * BURST_SECONDS  # at most a full bucket at the ceiling's rate, then one token per 1/ceiling
    assert max(clock.slept) >= (400 - capacity) / ceiling  # never faster than the ceiling
    assert max(clock.slept) <= 400 / (BETA * ceiling)  # cut from the ceiling, not from the burst's 100,000/s


def test_another_scope_cannot_slow_a_users_jobs(server: RedisServer, tmp_path: Path) -> None:
    client = redis.Redis.from_url(server.url)
    client.flushdb()
    clock = FakeClock()
    mallory = node(server.url, tmp_path / "m", clock, scope=MALLORY).pace(URL)
    mallory.sent = 1
    mallory.throttled(clock.now)  # mallory's own state: another name
    for name in client.keys("t:rate:*"):  # and garbage, or a copied value, under every name there is
        client.set(name.decode().replace(MALLORY.rate_name(KEY), ALICE.rate_name(KEY)),
                   f"0.5 {clock.now} -1e9 {clock.now} 0 {'0' * 32}")
    alice = node(server.url, tmp_path / "a", clock).pace(URL)
    assert not alice.limited
    alice.acquire()
    assert clock.slept == []


def test_redis_down_mid_run_falls_back_to_the_node_with_one_line(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    with RedisServer() as own:
        pacer = node(own.url, tmp_path / "n", clock)
        pace = pacer.pace(URL)
        pace.sent = 50
        clock.now += 1.0
        pace.throttled(clock.now)
        own.kill()
        with caplog.at_level(logging.WARNING):
            for _ in range(5):
                pace.acquire()
            clock.now += 1.0
            pace.throttled(clock.now)  # the node's file takes over
            for _ in range(5):
                pace.acquire()
    lines = [r.getMessage() for r in caplog.records if "Redis" in r.getMessage()]
    assert len(lines) == 1 and "pacing by this node's rate" in lines[0], lines
    assert (tmp_path / "n" / "rates").read_text().split("\n")[1].startswith(KEY)  # (after the header)
    assert pace.limited and clock.slept  # still paced, by the node


def test_open_pacer_is_off_by_default_and_survives_a_dead_redis(tmp_path: Path) -> None:
    env = {"XDG_RUNTIME_DIR": str(tmp_path), "PEGASUS_CLOUDIO_P2P_REDIS": "redis://127.0.0.1:1/0"}
    assert type(open_pacer(env, 0.0, lambda key: ALICE)._states).__name__ == "NodeStates"
    pacer = open_pacer(env, 0.8, lambda key: ALICE)
    pace = pacer.pace(URL)  # Redis refuses the connection: the node's rate, no exception
    assert not pace.limited
