"""The cache daemon started as root serves each user's cache from a process running as that
user (``docs/security.md``). That user may signal her own process: what she does to it must
not reach the other users' sharing. Real daemon, real users (``useradd``), loopback."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Sequence

import pytest

from unix_users import new_users

from pegasus_cloudio_testbed.redis import RedisServer
from test_stager_trust import as_user
from transfer.p2p import connect_redis
from transfer.p2p.index import PeerIndex

TOKEN = "pool-token-0123456789"
TTL = 3  # seconds a heartbeat keeps a node in the index


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def users() -> Iterator[Dict[str, int]]:
    """Two new Unix users (name -> uid), removed after the test."""
    with new_users(2) as made:
        yield {user.pw_name: user.pw_uid for user in made}


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

    NAMESPACE = f"serve{os.getpid()}"

    def __init__(self, users: Dict[str, int], base: Path, token: Path, redis_url: str = "",
                 prefix: Sequence[str] = ()) -> None:
        """``redis_url``: the index it heartbeats into ("": none; namespace :attr:`NAMESPACE`,
        TTL :data:`TTL`); ``prefix``: what runs the command (``unshare ...``)."""
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
        if redis_url:
            env.update(PEGASUS_CLOUDIO_P2P_REDIS=redis_url, PEGASUS_CLOUDIO_P2P_NAMESPACE=self.NAMESPACE,
                       PEGASUS_CLOUDIO_P2P_HEARTBEAT_TTL=str(TTL))
        self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "pegasus_cloudio.cli", "serve"], env=env,
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


def test_a_serving_process_is_started_again_from_a_single_threaded_root_that_looks_nothing_up(users, tmp_path):
    """The root process forks a user's serving process again whenever she kills hers. A
    child forked while another thread of the parent held a lock (the heartbeat's, one in an
    NSS module or the C library) would wait on it for ever, as root, before dropping to her:
    so the root forks only while it is its one thread (heartbeats go out from its loop), and
    the child looks nothing up (her uid and gid were resolved at start). Shown here with the
    user database made to hang once the daemon serves (``/etc/passwd`` a FIFO, in the
    daemon's own mount namespace: a lookup in the child would never return)."""
    alice, bob = sorted(users)
    base = Path(tempfile.mkdtemp(prefix="pcio-serve-"))
    base.chmod(0o755)
    fifo = tmp_path / "passwd.fifo"
    os.mkfifo(fifo)
    prefix = ["unshare", "--mount", "--propagation", "private"]
    try:
        with RedisServer() as redis_server:
            started = time.monotonic()
            daemon = RootDaemon(users, base, tmp_path / "token", redis_server.url, prefix)
            index = PeerIndex(connect_redis(redis_server.url), RootDaemon.NAMESPACE)

            def both_live() -> bool:
                return {node.rpartition("/")[2] for node in index.live_nodes()} == {alice, bob}
            try:
                tasks = os.listdir(f"/proc/{daemon.proc.pid}/task")
                assert len(tasks) == 1, f"the root process runs {len(tasks)} threads"
                subprocess.run(["nsenter", f"--mount=/proc/{daemon.proc.pid}/ns/mnt", "mount", "--bind", str(fifo),
                                "/etc/passwd"], check=True, capture_output=True)
                kill_as(users[alice], serving_process(daemon.proc.pid, users[alice]))
                wait_for(lambda: daemon.logged(f"serving {alice} exited; started it again"), "the daemon to notice")
                wait_for(lambda: answers(daemon.ports[alice]), "Alice's cache to be served again")
                assert _uid_of(serving_process(daemon.proc.pid, users[alice])) == users[alice]
                assert answers(daemon.ports[bob]) and daemon.proc.poll() is None, "".join(daemon.log)
                # the first heartbeat has expired by now: the root's loop sent the later ones
                wait_for(lambda: time.monotonic() - started > 2 * TTL and both_live(), "heartbeats from the loop")
                assert len(os.listdir(f"/proc/{daemon.proc.pid}/task")) == 1
            finally:
                _release(fifo)  # a reader stuck on it (a child that looked up) reads the end and exits
                daemon.stop()
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _release(fifo: Path) -> None:
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # nobody is reading it
        pass
