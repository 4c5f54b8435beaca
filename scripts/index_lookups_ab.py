"""Peer-index lookups from one client: two source trees, alternating, on one redis-server.

    .venv/bin/python scripts/index_lookups_ab.py BEFORE_TREE [--rounds 6] [--batches 50]

``BEFORE_TREE`` is a source checkout (``git archive main transfer | tar -x -C DIR``); the other
contestant is this checkout. Each round runs, in a fresh process of each tree, what
``pegasus-cloudio bench p2p`` times as its index phase: one node registers 1,000 keys under a
reader's scope, then ``--batches`` lookups of all 1,000 (every key's index name, unsealing and
tag checked). Figures per tree, medians over the rounds: lookups per second (wall) and the
client's CPU per lookup (``process_time``), with the redis-server's own time per lookup
(``INFO commandstats``) and the load average, since on a shared machine the wall figure is
mostly the scheduler's; and ``replayed_us``, the client's CPU per lookup on one recorded reply
replayed without a socket (best of 5 runs of 10 lookups: the index's own work, no redis-py
reads, which loop more under load). A development measurement beside ``bench p2p`` (issue 37 item 9).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pegasus_cloudio_testbed.redis import RedisServer  # noqa: E402

CLIENT = r'''
import json, sys, time
from transfer.p2p import connect_redis
from transfer.p2p.index import NodeInfo, PeerIndex
from transfer.peers import Replica, derive_scope
url, batches = sys.argv[1], int(sys.argv[2])
def _cpu(run, times=10):
    started = time.process_time()
    for _ in range(times):
        run()
    return (time.process_time() - started) / times
client = connect_redis(url)
index = PeerIndex(client, "ab-lookups")
scope = derive_scope("bench-secret-key", "s3", "http://127.0.0.1", "bench", "bucket")
keys = {f"s3://bench/bucket/run/f{i:05d}": scope for i in range(1000)}
index.heartbeat([NodeInfo("n0/bench", "https://127.0.0.1:1/v1/bench")], 600)
index.register("n0/bench", [Replica(k, i, "ab" * 32, scope) for i, k in enumerate(keys)])
index.lookup(keys)
client.config_resetstat()
started, cpu = time.monotonic(), time.process_time()
for _ in range(batches):
    found = index.lookup(keys)
wall, cpu = time.monotonic() - started, time.process_time() - cpu
assert len(found.holders) == len(keys) and not found.problems, found.problems[:3]
server_us = client.info("commandstats").get("cmdstat_eval", {}).get("usec", 0)
n = batches * len(keys)
kept = {}
class Replay:  # the same lookup's replies, without the socket
    def __init__(self, replies): self.replies = replies
    def pipeline(self, transaction=False): return self
    def execute_command(self, *args): pass
    def execute(self): return self.replies
real = client.pipeline
def recording(**kw):
    pipe = real(**kw)
    execute = pipe.execute
    def keep():
        kept["replies"] = execute()
        return kept["replies"]
    pipe.execute = keep
    return pipe
client.pipeline = recording
index.lookup(keys)
replayed = PeerIndex(Replay(kept["replies"]), "ab-lookups")
best = min(_cpu(lambda: replayed.lookup(keys)) for _ in range(5))
print(json.dumps({"lookups_per_s": n / wall, "client_cpu_us": 1e6 * cpu / n, "server_us": server_us / n,
                  "replayed_us": 1e6 * best / len(keys)}))
'''


def one(tree: str, url: str, batches: int) -> Dict[str, float]:
    env = dict(os.environ, PYTHONPATH=tree)
    done = subprocess.run([sys.executable, "-c", CLIENT, url, str(batches)], env=env, cwd="/",
                          capture_output=True, text=True, check=True)
    figures: Dict[str, float] = json.loads(done.stdout)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="source checkout to compare with this one")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batches", type=int, default=50)
    args = parser.parse_args()
    trees = {"before": os.path.abspath(args.before),
             "this": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    runs: Dict[str, List[Dict[str, float]]] = {name: [] for name in trees}
    load = [os.getloadavg()[0]]
    with RedisServer() as server:
        for _ in range(args.rounds):
            for name, tree in trees.items():
                runs[name].append(one(tree, server.url, args.batches))
    load.append(os.getloadavg()[0])
    report = {name: {field: round(statistics.median(r[field] for r in rows), 2) for field in rows[0]}
              for name, rows in runs.items()}
    report["load_average"] = {"start": load[0], "end": load[1], "cpus": os.cpu_count()}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
