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


def _fresh(code: str) -> "subprocess.CompletedProcess[str]":
    """``code`` run by a fresh interpreter (nothing loaded yet), which must succeed."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


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
    done = _fresh(code)
    # built-in while small and hashlib unloaded; OpenSSL's HASH when large, unknown, after
    # something loaded hashlib, or for an algorithm without a built-in stand-in
    assert done.stdout.split() == ["sha256", "md5", "False", "HASH", "HASH", "HASH", "HASH"]


def test_many_small_sha256_hashes_load_openssl_and_small_md5_stays_builtin() -> None:
    code = ("import sys; from transfer import _digests as d; "
            "kinds = [type(d.new('sha256', 300)).__name__ for _ in range(d.BUILTIN_SHA256 + 1)]; "
            "print(kinds.count('sha256'), kinds[-1], d.sha256_openssl, 'hashlib' in sys.modules, "
            "type(d.new('md5', d.SMALL_MD5)).__name__, type(d.new('md5', d.SMALL_MD5 + 1)).__name__, "
            "d.sha256_hex(b'abc'))")
    done = _fresh(code)
    # the first BUILTIN_SHA256 built-in, the next OpenSSL's, and from then on; MD5 of a few KiB
    # built-in still (the faster one there), larger OpenSSL's
    assert done.stdout.split() == [str(_digests.BUILTIN_SHA256), "HASH", "True", "True", "md5", "HASH",
                                   hashlib.sha256(b"abc").hexdigest()]


def test_a_signer_signs_alike_across_the_switch_to_openssl() -> None:
    # the signer keeps keyed HMAC states; once OpenSSL serves SHA-256 it makes them again
    code = ("from transfer import _digests as d; from transfer.backends._sigv4 import SigV4Signer; "
            "from transfer.credentials import Credentials; "
            "signer = SigV4Signer(Credentials('AKID', 'secret'), 'us-east-1', clock=lambda: 1.7e9); "
            "first = signer.sign('GET', 'h:9000', '/b/k'); "
            "[d.new('sha256', 3) for _ in range(d.BUILTIN_SHA256)]; "
            "second = signer.sign('GET', 'h:9000', '/b/k'); "
            "print(first == second, d.sha256_openssl, type(signer._state[5]).__name__, first[-1][1])")
    done = _fresh(code)
    same, switched, kind, authorization = done.stdout.split(" ", 3)
    assert (same, switched, kind) == ("True", "True", "HASH")
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=AKID/20231114/us-east-1/s3/aws4_request")


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
    done = _fresh(code)
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
