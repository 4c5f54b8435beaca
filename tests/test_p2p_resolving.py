"""A peer whose host name does not resolve costs a job one resolver timeout, not one per file.

Node URLs in the replica index are written by daemons' heartbeats, and anyone who can write
the index can rewrite them (``docs/security.md``): a name in a zone whose servers never
answer makes every lookup wait for the resolver's timeout. The client skips such a peer as
it skips one that timed out. Real resolver (glibc, ``/etc/resolv.conf``) against a DNS
server that counts queries and answers none, in a private network and mount namespace."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_SCRIPT = r"""
import socket, sys, threading
queries = []
server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
server.bind(("127.0.0.1", 53))
threading.Thread(target=lambda: [queries.append(server.recvfrom(4096)) for _ in iter(int, 1)], daemon=True).start()

from transfer.p2p.client import PeerClient
from transfer.peers import Replica
from p2p_support import SCOPE, MemorySink, client_config, holder

client = PeerClient(client_config())
counts = []
for i in range(4):
    replica = Replica(f"k{i}", 4, "00" * 32)
    report = client.fetch(replica.key, [holder("x", "http://peer.unanswered.test:8470/v1/alice", replica)],
                          MemorySink(), SCOPE)
    assert report.size is None, report
    counts.append(len(queries))
client.close()
print(*counts)
"""


def test_a_peer_whose_name_does_not_resolve_is_asked_about_once_per_job(tmp_path):
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    tests = Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]))
    shell = f'ip link set lo up && mount --bind "$1" /etc/resolv.conf && exec "$2" -c "$3"'
    done = subprocess.run(["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c", shell, "sh",
                           str(resolv), sys.executable, _SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    counts = [int(n) for n in done.stdout.split()]
    assert counts[0] > 0, "the resolver never asked the test's DNS server"
    assert counts[-1] == counts[0], f"queries after each of 4 files: {counts}"
