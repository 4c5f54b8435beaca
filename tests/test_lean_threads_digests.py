"""transfer._digests against hashlib and hmac, and transfer._threads against threading's
contracts (waiters woken, timeouts, bounds), on what a job step uses them for."""

from __future__ import annotations

import hashlib
import hmac
import random
import subprocess
import sys
import threading
import time
from typing import List

import pytest

from transfer import _digests, _threads


@pytest.mark.parametrize("seed", range(4))
def test_digests_match_hashlib_and_hmac_on_random_inputs(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        data = rng.randbytes(rng.choice([0, 1, 55, 56, 63, 64, 65, 127, 128, rng.randrange(5000)]))
        key = rng.randbytes(rng.choice([0, 1, 32, 63, 64, 65, 200]))
        assert _digests.sha256_hex(data) == hashlib.sha256(data).hexdigest()
        assert _digests.md5(data) == hashlib.md5(data).digest()
        assert _digests.hmac_sha256(key, data) == hmac.digest(key, data, "sha256")


def test_small_inputs_use_the_builtin_hashes_and_large_or_unknown_ones_openssl() -> None:
    small, large, unknown = _digests.new("sha256", 300), _digests.new("sha256", 2 << 20), _digests.new("md5")
    openssl = type(hashlib.sha256())  # _hashlib.HASH
    assert type(small) is not openssl and type(large) is openssl and type(unknown) is openssl
    for digest, data in ((small, b"a" * 300), (large, b"b" * 10), (unknown, b"c")):
        digest.update(data)
    assert small.hexdigest() == hashlib.sha256(b"a" * 300).hexdigest()
    assert large.hexdigest() == hashlib.sha256(b"b" * 10).hexdigest()
    assert unknown.hexdigest() == hashlib.md5(b"c").hexdigest()
    sha1 = _digests.new("sha1", 10)
    sha1.update(b"x")
    assert sha1.hexdigest() == hashlib.sha1(b"x").hexdigest()  # any hashlib name works


def test_signing_imports_neither_hashlib_nor_threading() -> None:
    code = ("import sys; from transfer.backends import _sigv4, s3; from transfer import engine; "
            "print(sorted({'hashlib', 'hmac', '_hashlib', 'threading'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_an_event_wakes_every_waiter_and_times_out_when_unset() -> None:
    event = _threads.Event()
    assert event.wait(0.01) is False and not event.is_set()
    woken: List[bool] = []
    waiters = [threading.Thread(target=lambda: woken.append(event.wait(30))) for _ in range(8)]
    for thread in waiters:
        thread.start()
    while len(event._waiters) < 8:  # every waiter is blocked on the event
        time.sleep(0.001)
    event.set()
    for thread in waiters:
        thread.join(30)
    assert woken == [True] * 8 and event.is_set() and event.wait(0) is True
    event.clear()
    assert not event.is_set() and event.wait(0.01) is False and event._waiters == []


def test_a_bounded_semaphore_bounds_hands_over_and_refuses_an_extra_release() -> None:
    slots = _threads.BoundedSemaphore(2)
    assert slots.acquire() and slots.acquire(timeout=0)
    assert slots.acquire(blocking=False) is False and slots.acquire(timeout=0.02) is False
    assert slots._waiters == []  # a timed-out waiter leaves nothing behind
    got: List[bool] = []
    waiter = threading.Thread(target=lambda: got.append(slots.acquire(timeout=30)))
    waiter.start()
    while not slots._waiters:
        time.sleep(0.001)
    slots.release()  # handed to the waiter
    waiter.join(30)
    assert got == [True] and slots.acquire(blocking=False) is False
    slots.release()
    slots.release()
    with pytest.raises(ValueError):
        slots.release()


def test_many_threads_never_hold_more_slots_than_the_bound() -> None:
    slots, lock = _threads.BoundedSemaphore(3), _threads.Lock()
    held, peak, done = [0], [0], []

    def work() -> None:
        for _ in range(200):
            with slots:
                with lock:
                    held[0] += 1
                    peak[0] = max(peak[0], held[0])
                with lock:
                    held[0] -= 1
        done.append(True)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(done) == 8 and peak[0] <= 3 and held[0] == 0
    assert [slots.acquire(blocking=False) for _ in range(4)] == [True, True, True, False]


def test_started_threads_are_named_when_threading_is_loaded_and_joinable_either_way() -> None:
    ran: List[str] = []
    thread = _threads.start(lambda: ran.append(threading.current_thread().name), "transfer_7")
    thread.join(30)
    assert ran == ["transfer_7"]
    code = ("import sys, _thread; from transfer import _threads; out = []; "
            "t = _threads.start(lambda: out.append(_thread.get_ident()), 'x'); t.join(30); t.join(1); "
            "print(len(out), out[0] != _thread.get_ident(), 'threading' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["1", "True", "False"], done.stderr
