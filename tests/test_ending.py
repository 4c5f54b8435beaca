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
from pathlib import Path
from typing import List

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
        'try:\n'
        '    end(4)\n'
        'except SystemExit:  # end() chose the normal exit: the thread was running when it looked\n'
        '    os.write(1, b"normal exit\\n")\n'
        '    raise\n')
    assert proc.stdout is not None
    # Only now may the thread finish: sent before end() looks (a loaded machine can pause the
    # main thread that long), the line let the thread end first and end() rightly skip the wait.
    assert proc.stdout.readline() == b"normal exit\n"
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


# --------------------------------------------------------------------------- the installed commands

# A site hook (a .pth line, as coverage's, a monitoring agent's or a site's own sitecustomize
# add) whose atexit callback fails: the normal exit prints its traceback once and keeps the status.
FAILING_HOOK = "import atexit; atexit.register(lambda: 1 / 0)\n"
# Each command ends through end() with status 0 here, before any network or job file.
ENDING_COMMANDS = [("pegasus-cloudio-transfer", [], "[]"), ("pegasus-cloudio-s3", ["help"], ""),
                   ("pegasus-cloudio-condor-plugin", ["--version"], "")]


@pytest.fixture(scope="module")
def oldest_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The wheel installed for the oldest Python we support (RHEL 9's system python3 is 3.9),
    in a venv with :data:`FAILING_HOOK`."""
    from test_worker_bundle import MIN, interpreters

    from pegasus_cloudio_testbed.wheel import build_wheel
    supported = [path for version, path in interpreters() if version >= MIN]
    assert supported, "no python3 >= 3.9 outside a venv on this machine"
    root = str(tmp_path_factory.mktemp("ending-oldest"))
    venv = os.path.join(root, "venv")
    steps = [[supported[0], "-m", "venv", "--without-pip", venv],
             [sys.executable, "-m", "pip", "--python", os.path.join(venv, "bin", "python"), "install", "--quiet",
              "--no-deps", "--no-index", build_wheel(root)]]
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    [site] = [os.path.join(venv, "lib", n, "site-packages") for n in os.listdir(os.path.join(venv, "lib"))]
    with open(os.path.join(site, "failing-exit-hook.pth"), "w") as fh:
        fh.write(FAILING_HOOK)
    return os.path.join(venv, "bin")


@pytest.mark.parametrize("command, argv, stdin", ENDING_COMMANDS, ids=[c for c, _, _ in ENDING_COMMANDS])
def test_a_failing_atexit_callback_leaves_the_status_as_the_normal_exit_does(
        oldest_bin: str, tmp_path: Path, command: str, argv: List[str], stdin: str) -> None:
    """Python 3.9's ``atexit._run_exitfuncs`` prints a failing callback's error, then raises it
    again: end() must not turn that into exit 1 (a failed job step, a held job)."""
    from installed import clean_env, run

    env = clean_env(oldest_bin, {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
                                 "PEGASUS_CLOUDIO_CACHE_DIR": "off"})
    normal = run([os.path.join(oldest_bin, "python"), "-c", "import sys; sys.exit(0)"], env, tmp_path)
    assert normal.returncode == 0 and "ZeroDivisionError" in normal.stderr, normal
    done = run([os.path.join(oldest_bin, command), *argv], env, tmp_path, stdin=stdin, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("ZeroDivisionError") == normal.stderr.count("ZeroDivisionError"), done.stderr
