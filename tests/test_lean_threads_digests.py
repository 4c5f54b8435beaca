"""transfer._digests against hashlib and hmac, and transfer._threads against threading's
contracts (waiters woken, timeouts, joins), on what a job step uses them for."""

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


def test_small_inputs_use_the_builtin_hashes_until_hashlib_is_loaded() -> None:
    code = ("import sys; from transfer import _digests as d; "
            "kinds = [type(d.new('sha256', 300)).__name__, type(d.new('md5', d.SMALL)).__name__, "
            "'hashlib' in sys.modules, type(d.new('sha256', d.SMALL + 1)).__name__, "
            "type(d.new('md5')).__name__, type(d.new('sha256', 300)).__name__, type(d.new('sha1', 3)).__name__]; "
            "print(*kinds)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # built-in while small and hashlib unloaded; OpenSSL's HASH when large, unknown, after
    # something loaded hashlib, or for an algorithm without a built-in stand-in
    assert done.stdout.split() == ["sha256", "md5", "False", "HASH", "HASH", "HASH", "HASH"]


@pytest.mark.parametrize("sizes", [[], [0], [300], [100, 0, 200], [_digests.SMALL], [_digests.SMALL, 1],
                                   [1, _digests.SMALL], [70000] * 9])
def test_a_stream_hashes_what_hashlib_does_whatever_the_pieces(sizes: List[int]) -> None:
    rng = random.Random(len(sizes))
    pieces = [rng.randbytes(n) for n in sizes]
    stream, buffer = _digests.Stream(), bytearray()
    for piece in pieces:
        buffer[:] = piece  # one reused buffer, as a socket reader passes it
        stream.update(memoryview(buffer))
    whole = b"".join(pieces)
    assert stream.hexdigest() == hashlib.sha256(whole).hexdigest()
    stream.update(b"more")  # like hashlib: updates after a digest go on from there
    assert stream.digest() == hashlib.sha256(whole + b"more").digest()


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
