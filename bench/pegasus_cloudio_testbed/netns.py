"""Worker "nodes" on one machine: network namespaces on a bridge (needs root and ``ip``).

``NetnsPool(n)`` creates a bridge in the root namespace with ``10.<a>.<b>.1/24`` and ``n``
namespaces, each joined to it by a veth pair and given ``10.<a>.<b>.<10+i>``, with a default
route through the bridge address (where the test bed's Redis and store proxy listen). Names
carry a random tag and the subnet is one no interface on the machine uses, both chosen and
claimed (the bridge created with its address) under a machine-wide lock file, so concurrent
test runs cannot collide on a name or an address; ``close`` removes everything
(deleting a namespace deletes its veth end, which deletes the pair). ``limit_rate`` caps a
node's egress with a token bucket (``tc tbf``; this kernel has no ``netem``).
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import subprocess
from dataclasses import dataclass
from typing import List, Sequence, Set

LOCK_FILE = "/run/lock/pegasus-cloudio-netns.lock"

__all__ = ["NetnsNode", "NetnsPool"]


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


@dataclass(frozen=True)
class NetnsNode:
    name: str        # node name (n0, n1, ...)
    netns: str       # namespace name
    address: str     # its address on the bridge
    host_veth: str   # the veth end in the root namespace
    veth: str        # the veth end inside the namespace

    def argv(self, command: Sequence[str]) -> List[str]:
        """``command`` run inside this node's namespace."""
        return ["ip", "netns", "exec", self.netns, *command]


def _used_subnets() -> Set[str]:
    """``10.231.<b>`` prefixes any interface or route of this machine uses now."""
    text = "".join(subprocess.run(["ip", "-o", "-4", *args], capture_output=True, text=True, timeout=30,
                                  check=False).stdout for args in (["addr", "show"], ["route", "show"]))
    return set(re.findall(r"\b(10\.231\.\d+)\.\d+", text))


def _used_names() -> str:
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30, check=False)
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False)
    return links.stdout + spaces.stdout


class NetnsPool:
    def __init__(self, count: int) -> None:
        self._count = count
        self._made: List[NetnsNode] = []
        self._bridge_made = False
        self._name(secrets.token_hex(3), 16 + secrets.randbelow(200))

    def _name(self, tag: str, octet: int) -> None:
        self.subnet = f"10.231.{octet}"
        self.gateway = f"{self.subnet}.1"
        self.bridge = f"pc{tag}br"
        self.nodes = [NetnsNode(f"n{i}", f"pc{tag}n{i}", f"{self.subnet}.{10 + i}", f"pc{tag}h{i}",
                                f"pc{tag}v{i}") for i in range(self._count)]

    def _claim(self) -> None:
        """Choose a tag and subnet nobody uses and create the bridge with its address, under
        the machine-wide lock (another run's choice is visible to the next one)."""
        os.makedirs(os.path.dirname(LOCK_FILE), exist_ok=True)
        with open(LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            used, names = _used_subnets(), _used_names()
            free = [o for o in range(16, 216) if f"10.231.{o}" not in used]
            if not free:
                raise RuntimeError("no free 10.231.x.0/24 subnet for a network-namespace pool")
            tag = secrets.token_hex(3)
            while f"pc{tag}" in names:
                tag = secrets.token_hex(3)
            self._name(tag, free[secrets.randbelow(len(free))])
            _ip("link", "add", self.bridge, "type", "bridge")
            self._bridge_made = True
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)

    @property
    def cidr(self) -> str:
        return f"{self.subnet}.0/24"

    def start(self) -> "NetnsPool":
        try:
            self._claim()
            _ip("link", "set", self.bridge, "up")
            for node in self.nodes:
                self._add(node)
        except BaseException:
            self.close()
            raise
        return self

    def _add(self, node: NetnsNode) -> None:
        _ip("netns", "add", node.netns)
        self._made.append(node)
        _ip("link", "add", node.host_veth, "type", "veth", "peer", "name", node.veth)
        _ip("link", "set", node.veth, "netns", node.netns)
        _ip("link", "set", node.host_veth, "master", self.bridge)
        _ip("link", "set", node.host_veth, "up")
        inside = ("netns", "exec", node.netns, "ip")
        _ip(*inside, "addr", "add", f"{node.address}/24", "dev", node.veth)
        _ip(*inside, "link", "set", node.veth, "up")
        _ip(*inside, "link", "set", "lo", "up")
        _ip(*inside, "route", "add", "default", "via", self.gateway)

    def limit_rate(self, node: NetnsNode, rate: str) -> None:
        """Cap ``node``'s egress to ``rate`` (e.g. ``40mbit``)."""
        done = subprocess.run(["ip", "netns", "exec", node.netns, "tc", "qdisc", "replace", "dev", node.veth,
                               "root", "tbf", "rate", rate, "burst", "64kbit", "latency", "2s"],
                              capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"tc on {node.netns} failed: {done.stderr.strip()}")

    def close(self) -> None:
        for node in self._made:
            subprocess.run(["ip", "netns", "del", node.netns], capture_output=True, timeout=30, check=False)
        self._made = []
        if self._bridge_made:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30, check=False)
            self._bridge_made = False

    def __enter__(self) -> "NetnsPool":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
