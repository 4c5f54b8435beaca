"""Worker "nodes" on one machine: network namespaces on a bridge (needs root and ``ip``).

``NetnsPool(n)`` creates a bridge in the root namespace with ``10.<a>.<b>.1/24`` and ``n``
namespaces, each joined to it by a veth pair and given ``10.<a>.<b>.<10+i>``, with a default
route through the bridge address (where the test bed's Redis and store proxy listen). Names
carry a random tag, so concurrent test runs do not collide; ``close`` removes everything
(deleting a namespace deletes its veth end, which deletes the pair). ``limit_rate`` caps a
node's egress with a token bucket (``tc tbf``; this kernel has no ``netem``).
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass
from typing import List, Sequence

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


class NetnsPool:
    def __init__(self, count: int) -> None:
        tag = secrets.token_hex(3)
        octet = 16 + secrets.randbelow(200)
        self.subnet = f"10.231.{octet}"
        self.gateway = f"{self.subnet}.1"
        self.bridge = f"pc{tag}br"
        self.nodes = [NetnsNode(f"n{i}", f"pc{tag}n{i}", f"{self.subnet}.{10 + i}", f"pc{tag}h{i}",
                                f"pc{tag}v{i}") for i in range(count)]
        self._made: List[NetnsNode] = []
        self._bridge_made = False

    @property
    def cidr(self) -> str:
        return f"{self.subnet}.0/24"

    def start(self) -> "NetnsPool":
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._bridge_made = True
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
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
