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
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from test_stager_trust import as_user

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
    as_user(uid, lambda: os.kill(pid, signal.SIGKILL))


class RootDaemon:
    """``pegasus-cloudio serve`` run as root for ``users`` (plain HTTP on loopback): its
    process, its log lines as they come, each user's port."""

    def __init__(self, users: Dict[str, int], base: Path, token: Path) -> None:
        caches = {}
        for name, uid in users.items():
            caches[name] = base / name
            caches[name].mkdir(mode=0o700)
            os.chown(caches[name], uid, uid)
        token.write_text(TOKEN)
        token.chmod(0o600)
        env = dict(os.environ, PEGASUS_CLOUDIO_CONFIG=os.devnull, PEGASUS_CLOUDIO_P2P_BIND="127.0.0.1:0",
                   PEGASUS_CLOUDIO_P2P_PLAIN_HTTP="1", PEGASUS_CLOUDIO_P2P_TOKEN_FILE=str(token),
                   PEGASUS_CLOUDIO_P2P_USERS=",".join(f"{n}={c}" for n, c in caches.items()))
        env.pop("PEGASUS_CLOUDIO_P2P_REDIS", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "pegasus_cloudio.cli", "serve"], env=env,
                                     stderr=subprocess.PIPE, text=True)
        self.log: List[str] = []
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
        wait_for(lambda: any(" serving " in line for line in self.log), "the daemon to serve")
        served = next(line for line in self.log if " serving " in line)
        self.ports = {name: int(re.search(rf":(\d+)/v1/{name}\b", served).group(1)) for name in users}

    def logged(self, text: str) -> bool:
        return any(text in line for line in self.log)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def daemon(users, tmp_path) -> Iterator[RootDaemon]:
    base = Path(tempfile.mkdtemp(prefix="pcio-serve-"))
    base.chmod(0o755)
    try:
        running = RootDaemon(users, base, tmp_path / "token")
        try:
            yield running
        finally:
            running.stop()
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_user_killing_her_serving_process_does_not_stop_the_other_users_sharing(users, daemon):
    alice, bob = sorted(users)
    ports = daemon.ports
    assert answers(ports[alice]) and answers(ports[bob])

    kill_as(users[alice], serving_process(daemon.proc.pid, users[alice]))
    wait_for(lambda: daemon.logged(f"serving {alice} exited"), "the daemon to notice")
    assert daemon.proc.poll() is None, "".join(daemon.log)
    assert answers(ports[bob]), "".join(daemon.log)  # Bob's sharing is untouched
    wait_for(lambda: answers(ports[alice]), "Alice's cache to be served again")  # and hers comes back
    assert _uid_of(serving_process(daemon.proc.pid, users[alice])) == users[alice]
    assert daemon.proc.poll() is None and answers(ports[bob]), "".join(daemon.log)


def test_a_user_taking_her_port_after_killing_her_process_leaves_the_others_served(users, daemon):
    """She kills her serving process and listens on its port herself: the daemon cannot
    serve her there any more (and she has no certificate of the pool to fool readers with);
    it says so and serves the others on."""
    alice, bob = sorted(users)
    port = daemon.ports[alice]
    ready_r, ready_w = os.pipe()
    squatter = os.fork()
    if squatter == 0:
        code = 1
        try:
            os.close(ready_r)
            os.setgroups([])
            os.setuid(users[alice])
            os.kill(serving_process(daemon.proc.pid, users[alice]), signal.SIGKILL)
            listener = None
            while listener is None:  # until her serving process has let the port go
                try:
                    listener = socket.create_server(("127.0.0.1", port))
                except OSError:
                    time.sleep(0.001)
            os.write(ready_w, b"1")
            time.sleep(60)
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"1"
        wait_for(lambda: daemon.logged(f"serving {alice} exited and cannot be started again"), "the daemon to notice")
        assert daemon.proc.poll() is None, "".join(daemon.log)
        assert answers(daemon.ports[bob]), "".join(daemon.log)
    finally:
        os.kill(squatter, signal.SIGKILL)
        os.waitpid(squatter, 0)
        os.close(ready_r)
