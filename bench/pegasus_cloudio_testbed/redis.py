"""Real Debian ``redis-server`` processes for the replica index: one node, or a Redis Cluster
of three masters, all bound to one address (loopback by default) on free ports.

No persistence (``--save ''``, no AOF), protected mode off only because the bind address is
explicit. ``start`` waits for ``PING`` (and for the cluster to report ``cluster_state:ok``)
and raises RuntimeError with the log tail otherwise; there is no skip when redis-server is
missing (``scripts/system-deps.sh`` installs it).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import List, Optional, Sequence

from .ports import free_port
from .process import ServerProcess

__all__ = ["RedisCluster", "RedisServer", "redis_binary"]

_START_TIMEOUT_S = 20.0


def redis_binary(name: str = "redis-server") -> str:
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if found is None:
        raise RuntimeError(f"{name} not found: install the Debian package redis-server "
                           "(scripts/system-deps.sh)")
    return found


def _ping(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer(ServerProcess):
    """One redis-server on ``host``:<free port>. ``url`` is ``redis://host:port/0``."""

    LOG_NAME = "redis.log"
    STOP_GRACE = 5.0

    def __init__(self, host: str = "127.0.0.1", *, cluster: bool = False,
                 base_dir: Optional[str] = None) -> None:
        super().__init__()
        self.host = host
        self.port = 0
        self.cluster = cluster
        self._base_dir = base_dir

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> "RedisServer":
        tmp = self._make_tmp("pegasus-cloudio-redis-", self._base_dir)
        self.port = free_port()
        cmd = [redis_binary(), "--bind", self.host, "--port", str(self.port), "--save", "",
               "--appendonly", "no", "--protected-mode", "no", "--dir", str(tmp),
               "--daemonize", "no", "--loglevel", "warning"]
        if self.cluster:
            cmd += ["--cluster-enabled", "yes", "--cluster-config-file", str(tmp / "nodes.conf"),
                    "--cluster-node-timeout", "2000", "--cluster-port", str(free_port())]
        self._spawn_logged(cmd, {"PATH": "/usr/bin:/bin"})
        if not self._wait_until(time.monotonic() + _START_TIMEOUT_S, lambda: _ping(self.host, self.port)):
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"redis-server did not answer PING on {self.host}:{self.port}:\n{tail}")
        return self

    def kill(self) -> None:
        """Stop the process at once (an index outage), keeping the object for restart."""
        self._discard_process()


class RedisCluster:
    """Three master redis-server processes joined into one cluster (no replicas)."""

    def __init__(self, host: str = "127.0.0.1", masters: int = 3) -> None:
        self.host = host
        self.nodes: List[RedisServer] = [RedisServer(host, cluster=True) for _ in range(masters)]

    @property
    def url(self) -> str:
        """A startup node; the client discovers the others."""
        return self.nodes[0].url

    @property
    def ports(self) -> Sequence[int]:
        return [n.port for n in self.nodes]

    def start(self) -> "RedisCluster":
        try:
            for node in self.nodes:
                node.start()
            self._create()
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self) -> None:
        addresses = [f"{self.host}:{n.port}" for n in self.nodes]
        done = subprocess.run([redis_binary("redis-cli"), "--cluster", "create", *addresses,
                               "--cluster-replicas", "0", "--cluster-yes"],
                              capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-2000:]}{done.stderr}")
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if all(self._state_ok(n) for n in self.nodes):
                return
            time.sleep(0.1)
        raise RuntimeError("the Redis cluster did not reach cluster_state:ok")

    def _state_ok(self, node: RedisServer) -> bool:
        done = subprocess.run([redis_binary("redis-cli"), "-h", self.host, "-p", str(node.port),
                               "cluster", "info"], capture_output=True, text=True, timeout=10,
                              check=False)
        return "cluster_state:ok" in done.stdout

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> "RedisCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
