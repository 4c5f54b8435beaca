"""Peer sharing between three worker nodes, each in its own network namespace (veth pairs on
a bridge, created and removed here; needs root) with its own cache directory and
``pegasus-cloudio serve`` daemon; one redis-server and one MinIO (behind a counting proxy)
on the bridge address. Jobs are the real drop-in, run inside the namespaces."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
import redis

from pegasus_cloudio_testbed.certs import make_tls_files
from pegasus_cloudio_testbed.netns import NetnsPool
from pegasus_cloudio_testbed.proxy import TcpProxy
from pegasus_cloudio_testbed.redis import RedisServer
from transfer.cache.layout import Layout, digest_of, read_meta
from transfer.p2p.index import PeerIndex
from p2p_support import TOKEN
from waiting import wait_for
from test_dropin import transfer

TTL = 3
RACKS = {"n0": "r2", "n1": "r1", "n2": "r1"}


class World:
    def __init__(self, tmp, pool, redis_server, proxy, minio):
        self.tmp, self.pool, self.redis, self.proxy = tmp, pool, redis_server, proxy
        self.tls = make_tls_files(tmp / "tls", ips=[n.address for n in pool.nodes])
        self.token = tmp / "token"
        self.token.write_text(TOKEN)
        self.token.chmod(0o600)
        self.creds = minio.write_pegasus_credentials(tmp / "creds.conf", site="minio", user="test",
                                                     endpoint=proxy.url())
        self.namespace = f"nn{uuid.uuid4().hex[:6]}"
        self.daemons = {}

    def node(self, name):
        return next(n for n in self.pool.nodes if n.name == name)

    def cache_dir(self, name):
        return self.tmp / f"cache-{name}"

    def env(self, name, **extra):
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
               "HOME": str(self.tmp), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
               "PEGASUS_CREDENTIALS": str(self.creds), "AWS_EC2_METADATA_DISABLED": "true",
               "PEGASUS_CLOUDIO_CACHE_DIR": str(self.cache_dir(name)),
               "PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES": "0",
               "PEGASUS_CLOUDIO_P2P_REDIS": self.redis.url, "PEGASUS_CLOUDIO_P2P_NAMESPACE": self.namespace,
               "PEGASUS_CLOUDIO_P2P_TOKEN_FILE": str(self.token), "PEGASUS_CLOUDIO_P2P_CA_FILE": str(self.tls.ca_cert),
               "PEGASUS_CLOUDIO_P2P_NETWORKS": self.pool.cidr, "PEGASUS_CLOUDIO_P2P_NODE": name,
               "PEGASUS_CLOUDIO_P2P_RACK": RACKS[name], "PEGASUS_CLOUDIO_P2P_READ_TIMEOUT": "2"}
        env.update(extra)
        return env

    def start_daemon(self, name):
        node = self.node(name)
        env = self.env(name, PEGASUS_CLOUDIO_P2P_BIND=f"{node.address}:8470",
                       PEGASUS_CLOUDIO_P2P_CERT=str(self.tls.cert), PEGASUS_CLOUDIO_P2P_KEY=str(self.tls.key),
                       PEGASUS_CLOUDIO_P2P_USERS=f"root={self.cache_dir(name)}",
                       PEGASUS_CLOUDIO_P2P_HEARTBEAT_TTL=str(TTL))
        log = open(self.tmp / f"daemon-{name}.log", "ab")
        proc = subprocess.Popen(node.argv([sys.executable, "-m", "pegasus_cloudio.cli", "serve"]), env=env,
                                stdout=log, stderr=subprocess.STDOUT)
        self.daemons[name] = proc
        client = redis.Redis.from_url(self.redis.url)
        deadline = time.monotonic() + 20
        while not client.hexists(f"{self.namespace}:{{n}}:nodes", f"{name}/root"):
            assert proc.poll() is None and time.monotonic() < deadline, (self.tmp / f"daemon-{name}.log").read_text()
            time.sleep(0.05)

    def kill_daemon(self, name):
        proc = self.daemons.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def job(self, name, entries, wait=True, **extra):
        argv = self.node(name).argv([sys.executable, "-m", "pegasus_cloudio.dropin"])
        proc = subprocess.Popen(argv, env=self.env(name, **extra), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=str(self.tmp))
        proc.stdin.write(json.dumps(entries))
        proc.stdin.close()
        if not wait:
            return proc
        return finish(proc)


def finish(proc):
    err = proc.stderr.read()
    proc.wait(timeout=120)
    return proc.returncode, err


@pytest.fixture(scope="module")
def world(minio, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("netns")
    tmp.chmod(0o755)
    with NetnsPool(3) as pool, RedisServer(pool.gateway) as redis_server, \
            TcpProxy((minio.host, minio.port), host=pool.gateway) as proxy:
        w = World(tmp, pool, redis_server, proxy, minio)
        try:
            for name in RACKS:
                w.start_daemon(name)
            yield w
        finally:
            for name in list(w.daemons):
                w.kill_daemon(name)


def put_object(minio, bucket, key, data):
    import boto3
    boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                 aws_secret_access_key=minio.secret_key, region_name="us-east-1").put_object(
        Bucket=bucket, Key=key, Body=data)


def read(world, node, bucket, key):
    dest = world.tmp / node / key
    return transfer(f"s3://test@minio/{bucket}/{key}", f"file://{dest}", key, "minio", "local"), dest


def gets(world):
    return world.proxy.requests_by_method.get("GET", 0)


def test_a_file_read_on_a_then_on_b_and_c_costs_one_store_get(world, minio, bucket):
    data = os.urandom(1 << 20)
    put_object(minio, bucket, "one.dat", data)
    before = gets(world)
    for name in ("n0", "n1", "n2"):
        entry, dest = read(world, name, bucket, "one.dat")
        rc, err = world.job(name, [entry])
        assert rc == 0 and dest.read_bytes() == data, err
        assert "WARNING" not in err, err
    assert gets(world) - before == 1


def test_a_file_produced_on_a_is_read_on_b_and_c_without_a_store_get(world, bucket):
    data = os.urandom(300_000)
    src = world.tmp / "produced.dat"
    src.write_bytes(data)
    rc, err = world.job("n0", [transfer(f"file://{src}", f"s3://test@minio/{bucket}/produced.dat", "produced.dat")])
    assert rc == 0, err
    before = gets(world)
    for name in ("n1", "n2"):
        entry, dest = read(world, name, bucket, "produced.dat")
        rc, err = world.job(name, [entry])
        assert rc == 0 and dest.read_bytes() == data, err
    assert gets(world) == before


def test_a_peer_serving_corrupt_bytes_is_caught_and_the_store_serves(world, minio, bucket):
    data = os.urandom(200_000)
    put_object(minio, bucket, "bad.dat", data)
    entry, _ = read(world, "n0", bucket, "bad.dat")
    assert world.job("n0", [entry])[0] == 0
    layout = Layout(str(world.cache_dir("n0")))
    [path] = [os.path.join(shard, f) for shard in layout.shards() for f in os.listdir(shard)
              if f.endswith(".meta") and read_meta(os.path.join(shard, f)).key.endswith("/bad.dat")]
    data_path = path[:-5]
    st = os.stat(data_path)
    os.chmod(data_path, 0o644)
    with open(data_path, "r+b") as fh:
        fh.write(b"\0" * 16)
    os.utime(data_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    before = gets(world)
    entry, dest = read(world, "n1", bucket, "bad.dat")
    rc, err = world.job("n1", [entry])
    assert rc == 0 and dest.read_bytes() == data, err
    assert gets(world) - before == 1 and "do not match the registered SHA-256" in err


def test_a_wrong_token_gets_nothing_and_the_job_reads_the_store(world, minio, bucket):
    data = os.urandom(5000)
    put_object(minio, bucket, "tok.dat", data)
    assert world.job("n0", [read(world, "n0", bucket, "tok.dat")[0]])[0] == 0
    wrong = world.tmp / "wrong-token"
    wrong.write_text("not-the-pool-token")
    wrong.chmod(0o600)
    before = gets(world)
    entry, dest = read(world, "n2", bucket, "tok.dat")
    rc, err = world.job("n2", [entry], PEGASUS_CLOUDIO_P2P_TOKEN_FILE=str(wrong))
    assert rc == 0 and dest.read_bytes() == data
    assert gets(world) - before == 1 and "401" in err and err.count("WARNING") == 1, err


def received(cache_dir):
    """Bytes in the cache's partial downloads (``*.part``) under ``cache_dir``."""
    total = 0
    for root, _dirs, files in os.walk(cache_dir):
        for name in files:
            if name.endswith(".part"):
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except OSError:
                    pass  # renamed into place meanwhile
    return total


def test_a_peer_killed_mid_serve_is_continued_from_another(world, minio, bucket):
    data = os.urandom(16 << 20)
    put_object(minio, bucket, "big.dat", data)
    for name in ("n0", "n1"):  # n0 from the store, n1 from n0: both hold it
        assert world.job(name, [read(world, name, bucket, "big.dat")[0]])[0] == 0
    before = gets(world)
    world.pool.limit_rate(world.node("n1"), "40mbit")  # n1 (n2's rack) serves slowly...
    entry, dest = read(world, "n2", bucket, "big.dat")
    proc = world.job("n2", [entry], wait=False)
    wait_for(lambda: received(world.cache_dir("n2")) >= 1 << 20, "n2 to receive 1 MiB from n1")
    world.kill_daemon("n1")  # ... and dies part-way
    rc, err = finish(proc)
    assert rc == 0 and dest.read_bytes() == data, err
    assert gets(world) == before  # n0 sent the rest with a Range request
    assert "another peer sent the rest" in err
    world.start_daemon("n1")


def test_a_node_whose_heartbeat_expired_is_never_asked(world, minio, bucket):
    data = os.urandom(5000)
    put_object(minio, bucket, "hb.dat", data)
    assert world.job("n0", [read(world, "n0", bucket, "hb.dat")[0]])[0] == 0
    world.kill_daemon("n0")  # no clean retirement: the heartbeat just stops
    index = PeerIndex(redis.Redis.from_url(world.redis.url), world.namespace)
    wait_for(lambda: "n0/root" not in index.live_nodes(), "n0's heartbeat to expire", timeout=TTL + 30)
    before = gets(world)
    entry, dest = read(world, "n1", bucket, "hb.dat")
    rc, err = world.job("n1", [entry])
    world.start_daemon("n0")
    assert rc == 0 and dest.read_bytes() == data
    assert gets(world) - before == 1 and "WARNING" not in err, err  # no failed attempt at n0


def test_redis_down_falls_back_to_the_store_with_one_warning(world, minio, bucket):
    data = os.urandom(5000)
    put_object(minio, bucket, "down.dat", data)
    world.redis.kill()
    before = gets(world)
    entry, dest = read(world, "n1", bucket, "down.dat")
    rc, err = world.job("n1", [entry])
    assert rc == 0 and dest.read_bytes() == data
    assert gets(world) - before >= 1 and err.count("WARNING") == 1 and "peer index unavailable" in err, err
