"""A command's end without the interpreter's teardown (:func:`pegasus_cloudio.ending.end`).

Each case runs a small program in its own interpreter: what a normal exit does that anyone
can observe (the exit status, buffered output, atexit callbacks, a thread still working)
must happen, and the teardown (an object freed only by it) must not, except where the
normal exit is taken on purpose.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = r'''
import atexit, os, sys
from pegasus_cloudio.ending import end

class Torn:
    def __del__(self):
        os.write(2, b"torn down\n")

torn = Torn()  # a module global: freed only by the interpreter's teardown
atexit.register(lambda: os.write(2, b"atexit ran\n"))
'''


def start(body: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("PYTHONUNBUFFERED", None)  # the standard streams buffered, as a job step has them
    return subprocess.Popen([sys.executable, "-c", PROGRAM + body], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def finish(proc: subprocess.Popen, stdin: bytes = b"") -> tuple:
    out, err = proc.communicate(stdin, timeout=60)
    return proc.returncode, out, err


def test_exit_code_output_and_atexit_kept_teardown_skipped() -> None:
    code, out, err = finish(start('sys.stdout.write("x" * 5000)\nend(3)\n'))
    assert code == 3
    assert out == b"x" * 5000  # buffered, never flushed by the program itself
    assert b"atexit ran" in err
    assert b"torn down" not in err


def test_a_running_thread_gets_the_normal_exit() -> None:
    proc = start(
        'import threading\n'
        'def work():\n'
        '    sys.stdin.readline()\n'
        '    os.write(1, b"thread done\\n")\n'
        'threading.Thread(target=work).start()\n'
        'os.write(1, b"ready\\n")\n'
        'end(4)\n')
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"  # end() is next; the thread waits for our line
    code, out, err = finish(proc, b"go\n")
    assert code == 4
    assert out == b"thread done\n"
    assert b"atexit ran" in err
    assert b"torn down" in err  # the interpreter's own exit, which waited for the thread


def test_output_that_cannot_be_flushed_exits_as_python_does() -> None:
    proc = start(
        'sys.stdout.write("unflushed")\n'
        'os.write(2, b"ready\\n")\n'
        'sys.stdin.readline()\n'
        'end(0)\n')
    assert proc.stderr is not None and proc.stdout is not None and proc.stdin is not None
    assert proc.stderr.readline() == b"ready\n"
    proc.stdout.close()  # the reader is gone: flushing stdout fails
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 120  # what CPython's exit gives when it cannot flush stdout
    assert b"BrokenPipeError" in err


@pytest.mark.parametrize("value, code, message", [(None, 0, b""), ("bad input: x.json", 1, b"bad input: x.json\n"),
                                                  (256, 0, b""), (-1, 255, b"")])
def test_codes_that_are_not_a_status_go_through_sys_exit(value: object, code: int, message: bytes) -> None:
    status, out, err = finish(start(f"end({value!r})\n"))
    assert status == code
    assert err.replace(b"atexit ran\n", b"").replace(b"torn down\n", b"") == message
    assert b"atexit ran" in err
