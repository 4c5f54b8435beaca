"""The cache daemon started as root serves each user's cache from a process running as that
user (``docs/security.md``). That user may signal her own process: what she does to it must
not reach the other users' sharing. Real daemon, real users (``useradd``), loopback."""

from __future__ import annotations

import http.client
import os
import pwd
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

TOKEN = "pool-token-0123456789"


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def users() -> Iterator[Dict[str, int]]:
    """Two new Unix users (name -> uid), removed after the test."""
    tag = secrets.token_hex(3)
    made: Dict[str, int] = {}
    try:
        for label in ("a", "b"):
            name = f"pcio{label}{tag}"
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                           check=True, capture_output=True)
            made[name] = pwd.getpwnam(name).pw_uid
        yield made
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True, check=False)


def status(port: int) -> int:
    """The daemon's answer to a request without the pool token (401 while it serves)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/v1/x/" + "0" * 64)
        return conn.getresponse().status
    finally:
        conn.close()


def answers(port: int) -> bool:
    try:
        return status(port) == 401
    except OSError:
        return False


def serving_process(daemon: int, uid: int) -> int:
    """The child of ``daemon`` running as ``uid``."""
    found: List[int] = []

    def one() -> bool:
        children = Path(f"/proc/{daemon}/task/{daemon}/children").read_text().split()
        found[:] = [int(c) for c in children if _uid_of(int(c)) == uid]
        return len(found) == 1
    wait_for(one, f"the process serving uid {uid}")
    return found[0]


def _uid_of(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return -1
    return int(re.search(r"^Uid:\s+(\d+)", text, re.M).group(1))


def kill_as(uid: int, pid: int) -> None:
    """``kill -KILL pid`` by a process of ``uid`` (what that user can do to her own process)."""
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.setgroups([])
            os.setuid(uid)
            os.kill(pid, signal.SIGKILL)
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(child, 0)[1] == 0


def test_a_user_killing_her_serving_process_does_not_stop_the_other_users_sharing(users, tmp_path):
    base = Path(tempfile.mkdtemp(prefix="pcio-serve-"))
    try:
        base.chmod(0o755)
        caches = {}
        for name, uid in users.items():
            caches[name] = base / name
            caches[name].mkdir(mode=0o700)
            os.chown(caches[name], uid, uid)
        token = tmp_path / "token"
        token.write_text(TOKEN)
        token.chmod(0o600)
        env = dict(os.environ, PEGASUS_CLOUDIO_CONFIG=os.devnull, PEGASUS_CLOUDIO_P2P_BIND="127.0.0.1:0",
                   PEGASUS_CLOUDIO_P2P_PLAIN_HTTP="1", PEGASUS_CLOUDIO_P2P_TOKEN_FILE=str(token),
                   PEGASUS_CLOUDIO_P2P_USERS=",".join(f"{n}={c}" for n, c in caches.items()))
        env.pop("PEGASUS_CLOUDIO_P2P_REDIS", None)
        daemon = subprocess.Popen([sys.executable, "-m", "pegasus_cloudio.cli", "serve"], env=env,
                                  stderr=subprocess.PIPE, text=True)
        log: List[str] = []
        reader = threading.Thread(target=lambda: log.extend(daemon.stderr), daemon=True)
        reader.start()
        try:
            wait_for(lambda: any(" serving " in line for line in log), "the daemon to serve")
            served = next(line for line in log if " serving " in line)
            ports = {name: int(re.search(rf":(\d+)/v1/{name}\b", served).group(1)) for name in users}
            alice, bob = sorted(users)
            assert answers(ports[alice]) and answers(ports[bob])

            kill_as(users[alice], serving_process(daemon.pid, users[alice]))
            wait_for(lambda: any(f"serving {alice} exited" in line for line in log), "the daemon to notice")
            assert daemon.poll() is None, "".join(log)
            assert answers(ports[bob]), "".join(log)  # Bob's sharing is untouched
            wait_for(lambda: answers(ports[alice]), "Alice's cache to be served again")  # and hers comes back
            assert _uid_of(serving_process(daemon.pid, users[alice])) == users[alice]
            assert daemon.poll() is None and answers(ports[bob]), "".join(log)
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
