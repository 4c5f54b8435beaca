"""Peer-to-peer sharing: nodes x jobs reading a shared input set, with and without peers.

In one run, on loopback: an embedded MinIO behind a proxy adding ``--store-rtt-ms`` (20 ms),
one redis-server, and ``--nodes`` nodes, each a node-cache directory with its
``pegasus-cloudio serve`` daemon process (TLS, pool token) behind a proxy adding
``--peer-rtt-ms`` (0.5 ms). Jobs are engine batches in threads of this process (one per node
at a time), each with its own Session (fresh connections, as a job process has).

* index lookups per second from one client, in batches of ``--batch`` keys (seed RIS: 650/s),
  each key under the reading identity's scope (index name and tag checked per key);
* the CPU per file of the trust checks (``docs/security.md``): the HMACs a reader and a
  producer compute for one file (index name, tag, capability, proof); they add no request;
* store requests (GET, HEAD, LIST: every request the store proxy sees) per distinct file for
  the whole pool when every node starts reading the shared set at once (Broadband-like
  reuse), with peers (in-flight claims) and without (about one per node);
* fetch time of one file from the store vs from a peer, for 300 B, 1 MB and 100 MB (median);
* makespan of a Montage-like run (every node projects its images and uploads them, then one
  node co-adds all of them: a fan-in), with and without peers.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import getpass
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from pegasus_cloudio_bench.harness import Progress, add_params_arguments, params_from_args, ratio, tool_env
from pegasus_cloudio_testbed.certs import TlsFiles, make_tls_files
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.ports import free_port
from pegasus_cloudio_testbed.process import terminate
from pegasus_cloudio_testbed.proxy import TcpProxy
from pegasus_cloudio_testbed.redis import RedisServer
from transfer import Engine, Session, Settings, Transfer, parse_url
from transfer.ops import Mkdir
from transfer.cache import CacheConfig, NodeCache
from transfer.p2p import connect_redis, describer
from transfer.p2p.client import PeerClient
from transfer.p2p.config import PeerConfig, node_id, parse_networks
from transfer.p2p.index import NodeInfo, PeerIndex
from transfer.p2p.source import PeerIndexSource
from transfer.peers import Replica, derive_scope, proof

BUCKET = "bench-p2p"
SITE = "minio"
TOKEN = "bench-pool-token"
MB = 1_000_000
USER = getpass.getuser()  # the daemon serves this user's caches (as this user)
TARGET_STORE_REQUESTS_PER_FILE = 1.05
TARGET_LOOKUPS_PER_S = 50_000
SEED_RIS_OPS_PER_S = 650


@dataclass(frozen=True)
class Params:
    nodes: int = 4
    shared_files: int = 40
    shared_kib: int = 256
    batch: int = 1000
    lookup_batches: int = 50
    sizes: str = "300,1000000,100000000"
    repeats: int = 3
    images_per_node: int = 4
    image_kib: int = 1024
    store_rtt_ms: float = 20.0
    peer_rtt_ms: float = 0.5
    peer_plain_http: bool = False


_HELP = {
    "nodes": "worker nodes, each with a cache and a daemon",
    "shared_files": "files of the shared input set every node reads",
    "shared_kib": "size of each shared file, KiB",
    "batch": "keys per index lookup (one job's inputs)",
    "lookup_batches": "lookup batches timed",
    "sizes": "comma-separated file sizes (bytes) for store vs peer fetch time",
    "repeats": "fetches per size (median reported)",
    "images_per_node": "Montage-like run: images each node projects",
    "image_kib": "Montage-like run: size of one projected image, KiB",
    "store_rtt_ms": "round trip added to store traffic",
    "peer_rtt_ms": "round trip added to peer traffic",
    "peer_plain_http": "daemons serve plain HTTP instead of HTTPS (a trusted network)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_params_arguments(parser, Params(), _HELP)


def run_from_args(args: argparse.Namespace) -> Dict[str, object]:
    return run(params_from_args(Params, args), Progress())


class _Node:
    """A node: a cache directory, its daemon (a ``pegasus-cloudio serve`` process, as on a real
    worker) behind a delaying proxy, and its peer settings. Each job opens its own Session,
    as a job process would."""

    def __init__(self, name: str, root: str, env: Dict[str, str], redis_url: str, tls: TlsFiles,
                 params: Params, token_file: str) -> None:
        self.name, self.env = name, env
        self.cache_dir = os.path.join(root, f"cache-{name}")
        self.cache = _new_cache(self.cache_dir)
        port = free_port()
        self.proxy = TcpProxy(("127.0.0.1", port), delay_ms=params.peer_rtt_ms / 2).start()
        plain = params.peer_plain_http
        security = ({"PEGASUS_CLOUDIO_P2P_PLAIN_HTTP": "1"} if plain else
                    {"PEGASUS_CLOUDIO_P2P_CERT": str(tls.cert), "PEGASUS_CLOUDIO_P2P_KEY": str(tls.key)})
        self.index = PeerIndex(connect_redis(redis_url), "bench")
        self.log = open(os.path.join(root, f"daemon-{name}.log"), "ab")
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "pegasus_cloudio.cli", "serve"], stdout=self.log, stderr=subprocess.STDOUT,
            env=dict(env, PEGASUS_CLOUDIO_P2P_REDIS=redis_url, PEGASUS_CLOUDIO_P2P_NAMESPACE="bench",
                     PEGASUS_CLOUDIO_P2P_TOKEN_FILE=token_file, PEGASUS_CLOUDIO_P2P_NODE=name,
                     PEGASUS_CLOUDIO_P2P_BIND=f"127.0.0.1:{port}", PEGASUS_CLOUDIO_P2P_USERS=f"{USER}={self.cache_dir}",
                     PEGASUS_CLOUDIO_P2P_URL=self.proxy.url("http" if plain else "https"),
                     PEGASUS_CLOUDIO_P2P_HEARTBEAT_TTL="60", **security))
        self._wait_for_daemon(root)
        self.config = PeerConfig(redis_url, TOKEN, ca_file=str(tls.ca_cert), networks=parse_networks("127.0.0.0/8"),
                                 node=name, user=USER, connect_timeout=2.0, first_byte_timeout=5.0,
                                 read_timeout=10.0, claim_seconds=30.0, plain_http=plain)

    def _wait_for_daemon(self, root: str) -> None:
        deadline = time.monotonic() + 30
        while node_id(self.name, USER) not in self.index.live_nodes():
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(root, f"daemon-{self.name}.log"), encoding="utf-8", errors="replace") as fh:
                    raise RuntimeError(f"the daemon of {self.name} did not start:\n{fh.read()[-2000:]}")
            time.sleep(0.05)

    def reset_cache(self) -> None:
        shutil.rmtree(self.cache_dir, ignore_errors=True)
        self.cache = _new_cache(self.cache_dir)

    def run(self, ops: Sequence[Transfer], peers: bool) -> float:
        """One job; its wall time. Raises if any transfer failed."""
        source = (PeerIndexSource(self.index, PeerClient(self.config), node_id(self.name, USER),
                                  claim_seconds=self.config.claim_seconds, describe=describer(self.cache),
                                  grant=self.cache.grant)
                  if peers else None)
        started = time.monotonic()
        try:
            with Session(Settings(threads=8), self.env) as session:
                results = Engine(session, cache=self.cache, peers=source).run(ops)
        finally:
            if source is not None:
                source.close()
        wall = time.monotonic() - started
        failed = [r for r in results if not r.ok]
        if failed:
            raise RuntimeError(f"node {self.name}: {failed[0].error}")
        return wall

    def close(self) -> None:
        terminate(self.daemon)
        self.log.close()
        self.proxy.stop()


def _new_cache(directory: str) -> NodeCache:
    return NodeCache(CacheConfig(directory, max_bytes=8 << 30, min_free_bytes=0, fsync=False))


def run(params: Params, progress: Progress) -> Dict[str, object]:
    root = tempfile.mkdtemp(prefix="pegasus-cloudio-bench-p2p-")
    nodes: List[_Node] = []
    try:
        with MinioServer() as server, RedisServer() as redis_server, \
                TcpProxy((server.host, server.port), delay_ms=params.store_rtt_ms / 2) as store:
            creds = server.write_pegasus_credentials(os.path.join(root, "credentials.conf"), site=SITE,
                                                     user="bench", endpoint=store.url())
            env = tool_env({"PEGASUS_CREDENTIALS": str(creds), "PEGASUS_CLOUDIO_CONFIG": os.devnull})
            direct = server.write_pegasus_credentials(os.path.join(root, "direct.conf"), site=SITE, user="bench")
            direct_env = tool_env({"PEGASUS_CREDENTIALS": str(direct), "PEGASUS_CLOUDIO_CONFIG": os.devnull})
            tls = make_tls_files(os.path.join(root, "tls"))
            token = os.path.join(root, "token")
            with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w", encoding="ascii") as fh:
                fh.write(TOKEN)
            nodes = [_Node(f"n{i}", root, env, redis_server.url, tls, params, token)
                     for i in range(params.nodes)]
            bench = _Bench(root, params, Session(Settings(), direct_env), store, nodes)
            result: Dict[str, Any] = {
                "benchmark": "p2p", "params": dataclasses.asdict(params),
                "lookups": bench.lookups(redis_server.url, progress),
                "shared_reads": [bench.shared(peers, progress) for peers in (False, True)],
                "fetch_ms": bench.fetch_times(progress),
                "montage": [bench.montage(peers, progress) for peers in (False, True)],
            }
            result["targets"] = _targets(result)
            return result
    finally:
        for node in nodes:
            node.close()
        progress.done()
        shutil.rmtree(root, ignore_errors=True)


class _Bench:
    def __init__(self, root: str, params: Params, direct: Session, store: TcpProxy,
                 nodes: List[_Node]) -> None:
        """``direct``: a session to the store that bypasses the proxy (setting up inputs)."""
        self.root, self.params, self.store, self.nodes = root, params, store, nodes
        self._direct = direct
        self._run = 0
        self._mkbucket()

    def _mkbucket(self) -> None:
        [result] = Engine(self._direct).run([Mkdir(parse_url(f"s3://bench@{SITE}/{BUCKET}", site_label=SITE))])
        if not result.ok:
            raise RuntimeError(f"cannot create the bucket: {result.error}")

    def put(self, name: str, size: int) -> None:
        """Place an input in the store, outside the measured traffic."""
        path = os.path.join(self.root, "input.tmp")
        with open(path, "wb") as fh:
            fh.write(os.urandom(size))
        [result] = Engine(self._direct).run([Transfer((parse_url(path),), parse_url(
            f"s3://bench@{SITE}/{BUCKET}/{name}", site_label=SITE))])
        if not result.ok:
            raise RuntimeError(f"cannot place {name} in the store: {result.error}")

    def reads(self, names: Sequence[str], job: str) -> List[Transfer]:
        return [Transfer((parse_url(f"s3://bench@{SITE}/{BUCKET}/{n}", site_label=SITE),),
                         parse_url(f"file://{self.root}/jobs/{job}/{n}")) for n in names]

    # -- index ---------------------------------------------------------------------------

    def lookups(self, redis_url: str, progress: Progress) -> Dict[str, Any]:
        progress.phase(f"index: {self.params.lookup_batches} lookups of {self.params.batch} keys")
        index = PeerIndex(connect_redis(redis_url), "bench-lookups")
        scope = derive_scope("bench-secret-key", "s3", "http://127.0.0.1", "bench", BUCKET)
        keys = {f"s3://bench/{BUCKET}/run/f{i:05d}": scope for i in range(self.params.batch)}
        index.heartbeat([NodeInfo("n0/bench", "https://127.0.0.1:1/v1/bench")], 60)
        index.register("n0/bench", [Replica(k, i, "ab" * 32, scope) for i, k in enumerate(keys)])
        index.lookup(keys)  # connect
        started, cpu = time.monotonic(), time.process_time()
        for _ in range(self.params.lookup_batches):
            found = index.lookup(keys)
        wall, cpu = time.monotonic() - started, time.process_time() - cpu
        if len(found.holders) != len(keys):
            raise RuntimeError(f"lookup found {len(found.holders)} of {len(keys)} keys")
        total = self.params.lookup_batches * len(keys)
        return {"batch": len(keys), "batches": self.params.lookup_batches, "seconds": round(wall, 4),
                "lookups_per_s": round(total / wall), "client_cpu_us_per_lookup": round(1e6 * cpu / total, 2),
                "load_average": round(os.getloadavg()[0], 1), "cpus": os.cpu_count(),
                "seed_ris_ops_per_s": SEED_RIS_OPS_PER_S, "trust_checks": _trust_cost(list(keys), scope)}

    # -- shared reads -------------------------------------------------------------------

    def shared(self, peers: bool, progress: Progress) -> Dict[str, Any]:
        p = self.params
        self._run += 1
        names = [f"shared{self._run}/f{i:04d}" for i in range(p.shared_files)]
        progress.phase(f"shared reads, {'with' if peers else 'without'} peers: {p.nodes} nodes x "
                       f"{p.shared_files} files")
        for n in names:
            self.put(n, p.shared_kib << 10)
        for node in self.nodes:
            node.reset_cache()
        self.store.reset_counters()
        wall = self._together([functools.partial(node.run, self.reads(names, f"s{self._run}-{node.name}"), peers)
                               for node in self.nodes])
        requests = self.store.snapshot()["requests"]
        return {"mode": "peers" if peers else "store only", "nodes": p.nodes, "files": len(names),
                "store_requests": requests, "requests_by_method": self.store.requests_by_method,
                "store_requests_per_file": round(requests / len(names), 3), "wall_s": round(wall, 3)}

    def _together(self, jobs: Sequence[Callable[[], float]]) -> float:
        """Run ``jobs`` in threads released at once; the wall time of the slowest."""
        barrier = threading.Barrier(len(jobs) + 1)
        errors: List[BaseException] = []

        def body(job: Callable[[], float]) -> None:
            barrier.wait()
            try:
                job()
            except BaseException as err:  # noqa: BLE001 - re-raised below
                errors.append(err)
        threads = [threading.Thread(target=body, args=(job,)) for job in jobs]
        for t in threads:
            t.start()
        barrier.wait()
        started = time.monotonic()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return time.monotonic() - started

    # -- single fetches -----------------------------------------------------------------

    def fetch_times(self, progress: Progress) -> List[Dict[str, Any]]:
        rows = []
        holder, reader = self.nodes[0], self.nodes[1]
        for size in (int(s) for s in self.params.sizes.split(",") if s.strip()):
            progress.phase(f"fetch time, {size} B: store vs peer")
            store_ms, peer_ms = [], []
            for i in range(self.params.repeats):
                name = f"single/{size}-{i}"
                self.put(name, size)
                reader.reset_cache()
                store_ms.append(1000 * reader.run(self.reads([name], f"fs{i}"), peers=False))
                holder.run(self.reads([name], f"fh{i}"), peers=True)  # the holder registers its copy
                reader.reset_cache()
                peer_ms.append(1000 * reader.run(self.reads([name], f"fp{i}"), peers=True))
                shutil.rmtree(os.path.join(self.root, "jobs"), ignore_errors=True)
            store, peer = statistics.median(store_ms), statistics.median(peer_ms)
            rows.append({"size": size, "store_ms": round(store, 2), "peer_ms": round(peer, 2),
                         "peer_speedup": round(ratio(store, peer) or 0.0, 2)})
        holder.reset_cache()
        reader.reset_cache()
        return rows

    # -- Montage-like -------------------------------------------------------------------

    def montage(self, peers: bool, progress: Progress) -> Dict[str, Any]:
        p = self.params
        self._run += 1
        tag = f"m{self._run}"
        progress.phase(f"Montage-like run, {'with' if peers else 'without'} peers")
        for node in self.nodes:
            node.reset_cache()
        raw = {node.name: [f"{tag}/raw/{node.name}-{i}" for i in range(p.images_per_node)] for node in self.nodes}
        for names in raw.values():
            for n in names:
                self.put(n, p.image_kib << 10)
        self.put(f"{tag}/region.hdr", 2000)
        self.store.reset_counters()
        started = time.monotonic()
        self._together([functools.partial(self._project, node, tag, raw[node.name], peers) for node in self.nodes])
        projected = [f"{tag}/proj/{n.split('/')[-1]}" for names in raw.values() for n in names]
        self.nodes[0].run(self.reads(projected + [f"{tag}/region.hdr"], f"{tag}-add"), peers)  # mAdd: fan-in
        makespan = time.monotonic() - started
        return {"mode": "peers" if peers else "store only", "nodes": p.nodes,
                "images": len(projected), "makespan_s": round(makespan, 3),
                "store_requests": self.store.snapshot()["requests"]}

    def _project(self, node: _Node, tag: str, names: Sequence[str], peers: bool) -> float:
        """mProject-like job: read the region header and the node's raw images, write and upload
        one projected image each (the upload writes through the node's cache)."""
        wall = node.run(self.reads(list(names) + [f"{tag}/region.hdr"], f"{tag}-{node.name}"), peers)
        out_dir = os.path.join(self.root, "out", tag, node.name)
        os.makedirs(out_dir, exist_ok=True)
        ups = []
        for n in names:
            path = os.path.join(out_dir, n.split("/")[-1])
            with open(path, "wb") as fh:
                fh.write(os.urandom(self.params.image_kib << 10))
            ups.append(Transfer((parse_url(path),), parse_url(
                f"s3://bench@{SITE}/{BUCKET}/{tag}/proj/{n.split('/')[-1]}", site_label=SITE)))
        return wall + node.run(ups, peers)


def _trust_cost(keys: Sequence[str], scope: Any) -> Dict[str, Any]:
    """CPU per file of the HMACs peer sharing adds (``docs/security.md``): the reader's index
    name, unsealing and tag check and proof, the producer's sealed tag and capability (a daemon's proof check is
    one more HMAC per granted scope). Requests added: none."""
    sha = "ab" * 32
    started = time.process_time()
    for key in keys:
        scope.index_name(key)
        sealed = scope.seal("n0/bench", key, 1, sha)  # producer's registration
        scope.unseal("n0/bench", key, sealed)  # reader's check
        proof(scope.capability(key), "tls:" + sha, sha)  # reader; the daemon computes it again
        proof(scope.capability(key), "tls:" + sha, sha)
    cpu = time.process_time() - started
    return {"cpu_us_per_file": round(1e6 * cpu / len(keys), 2), "store_requests_added": 0,
            "index_round_trips_added": 0}


def _targets(result: Dict[str, Any]) -> Dict[str, Optional[bool]]:
    with_peers = next(r for r in result["shared_reads"] if r["mode"] == "peers")
    return {
        "store_requests_per_file_at_most_1.05": with_peers["store_requests_per_file"] <= TARGET_STORE_REQUESTS_PER_FILE,
        "lookups_per_s_at_least_50000": result["lookups"]["lookups_per_s"] >= TARGET_LOOKUPS_PER_S,
    }


def format_table(result: Dict[str, Any]) -> str:
    p = result["params"]
    look = result["lookups"]
    rows = [f"store RTT {p['store_rtt_ms']} ms (plain HTTP), peer RTT {p['peer_rtt_ms']} ms "
            f"({'plain HTTP' if p.get('peer_plain_http') else 'HTTPS'}), {p['nodes']} nodes",
            f"index lookups: {look['lookups_per_s']:,}/s in batches of {look['batch']} "
            f"(client CPU {look['client_cpu_us_per_lookup']} us/lookup; load average {look['load_average']} on "
            f"{look['cpus']} CPUs; seed RIS: {look['seed_ris_ops_per_s']} ops/s)",
            f"trust checks: {look['trust_checks']['cpu_us_per_file']} us of CPU per file, no request added"
            if "trust_checks" in look else "", "",
            f"{'shared reads (all start together)':<36} {'files':>6} {'store req':>10} {'req/file':>9} {'wall s':>8}"]
    for r in result["shared_reads"]:
        rows.append(f"{r['mode']:<36} {r['files']:>6} {r['store_requests']:>10} "
                    f"{r['store_requests_per_file']:>9.3f} {r['wall_s']:>8.2f}")
    rows += ["", f"{'fetch one file':<16} {'store ms':>10} {'peer ms':>10} {'peer speed-up':>14}"]
    for r in result["fetch_ms"]:
        rows.append(f"{_size(r['size']):<16} {r['store_ms']:>10.2f} {r['peer_ms']:>10.2f} {r['peer_speedup']:>13.2f}x")
    rows += ["", f"{'Montage-like (project, fan-in)':<36} {'images':>7} {'makespan s':>11} {'store req':>10}"]
    for r in result["montage"]:
        rows.append(f"{r['mode']:<36} {r['images']:>7} {r['makespan_s']:>11.2f} {r['store_requests']:>10}")
    for name, ok in result["targets"].items():
        rows.append(f"target {name}: {'n/a' if ok is None else ('met' if ok else 'NOT MET')}")
    return "\n".join(rows)


def _size(size: int) -> str:
    if size >= MB:
        return f"{size / MB:g} MB"
    return f"{size} B"
