"""Peer sharing between two Unix users with two store identities of different rights, on
the network-namespace pool (``docs/security.md``).

Three worker nodes (network namespaces on a bridge; root needed), each running one
``pegasus-cloudio serve`` as root for both users (it forks one serving process per user
and drops to that user); one redis-server and one MinIO behind a counting proxy. Alice's
identity may read and write bucket X only, Bob's bucket Y only (MinIO temporary credentials
from AssumeRole with a session policy). Jobs are the real drop-in, run as Alice or Bob
(``setpriv``) inside the namespaces, with the system Python 3.11 and this tree's packages
(the test bed's own Python lives under /root, which other users cannot enter).

Bob tries what the issue lists: reading Alice's object by naming its URL in his job, and by
asking Alice's daemon for it by its key, and planting his own bytes in the index for her
input. Every attempt is refused and nothing wrong reaches a destination or a cache, while
Alice's own jobs still share (one store GET per file for the pool).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import boto3
import pytest
import redis

from pegasus_cloudio_testbed.certs import make_tls_files
from pegasus_cloudio_testbed.netns import NetnsPool
from pegasus_cloudio_testbed.proxy import TcpProxy
from pegasus_cloudio_testbed.redis import RedisServer
from transfer.cache.layout import Layout, digest_of, read_meta
from test_dropin import transfer

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "pool-token-" + "7" * 20
NODES = ("n0", "n1", "n2")


def _site_packages() -> str:
    import sysconfig
    return sysconfig.get_paths()["purelib"]


def portable_python(dest: Path) -> Path:
    """A copy of this interpreter and its standard library under ``dest``, readable by
    every user (run it with ``LD_LIBRARY_PATH=dest/lib``)."""
    import sys
    prefix, version = Path(sys.base_prefix), f"{sys.version_info[0]}.{sys.version_info[1]}"
    (dest / "bin").mkdir(parents=True)
    (dest / "lib").mkdir()
    python = dest / "bin" / f"python{version}"
    shutil.copy2(prefix / "bin" / f"python{version}", python)
    for lib in (prefix / "lib").glob("libpython*"):
        shutil.copy2(lib, dest / "lib" / lib.name)
    shutil.copytree(prefix / "lib" / f"python{version}", dest / "lib" / f"python{version}", symlinks=True,
                    ignore=shutil.ignore_patterns("site-packages", "test", "idlelib", "tkinter", "turtledemo",
                                                  "ensurepip", "lib2to3"))
    subprocess.run(["chmod", "-R", "a+rX", str(dest)], check=True)
    return python


def _policy(bucket: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": ["s3:*"],
        "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]})


class User:
    def __init__(self, name: str, label: str, base: Path):
        self.name, self.label = name, label  # Unix user, identity label in URLs (alice/bob)
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        "--home-dir", str(base / label), name], check=True, capture_output=True)
        entry = pwd.getpwnam(name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid
        self.home = base / label
        self.home.mkdir(mode=0o700)
        os.chown(self.home, self.uid, self.gid)

    def own(self, path: Path, mode: int) -> Path:
        os.chown(path, self.uid, self.gid)
        path.chmod(mode)
        return path

    def cache(self, node: str) -> Path:
        return self.home / f"cache-{node}"

    def remove(self) -> None:
        subprocess.run(["userdel", self.name], capture_output=True, check=False)


class World:
    def __init__(self, base: Path, pool: NetnsPool, redis_server: RedisServer, proxy: TcpProxy, minio):
        self.base, self.pool, self.redis, self.proxy, self.minio = base, pool, redis_server, proxy, minio
        tag = secrets.token_hex(3)
        self.namespace = f"tr{tag}"
        self.buckets = {"alice": f"x-{tag}", "bob": f"y-{tag}"}
        root = self.s3(minio.access_key, minio.secret_key)
        for name in self.buckets.values():
            root.create_bucket(Bucket=name)
        self.tls = make_tls_files(base / "tls", ips=[n.address for n in pool.nodes])
        for path in (self.tls.ca_cert, self.tls.cert):
            path.chmod(0o644)
        (base / "tls").chmod(0o755)
        self.pool_token = base / "pool.token"
        self.pool_token.write_text(TOKEN)
        self.pool_token.chmod(0o600)
        self.users: dict = {}
        try:
            for label in ("alice", "bob"):
                self.users[label] = User(f"pc{label[0]}{tag}", label, base)
                self._credentials(self.users[label], self.buckets[label])
        except BaseException:
            self.remove_users()
            raise
        self.daemons: dict = {}
        self.python = str(portable_python(base / "python"))

    @staticmethod
    def s3(key_id, secret, token=None):
        return boto3.client("s3", endpoint_url=World.endpoint, aws_access_key_id=key_id,
                            aws_secret_access_key=secret, aws_session_token=token, region_name="us-east-1")

    def _credentials(self, user: User, bucket: str) -> None:
        """A temporary identity allowed on ``bucket`` only, in the user's credentials file,
        and the user's own copy of the pool token."""
        sts = boto3.client("sts", endpoint_url=self.minio.endpoint, aws_access_key_id=self.minio.access_key,
                           aws_secret_access_key=self.minio.secret_key, region_name="us-east-1")
        got = sts.assume_role(RoleArn="arn:xxx:xxx:xxx:xxxx", RoleSessionName=user.label,
                              Policy=_policy(bucket), DurationSeconds=3600)["Credentials"]
        user.keys = (got["AccessKeyId"], got["SecretAccessKey"], got["SessionToken"])
        creds = user.home / "credentials.conf"
        creds.write_text(f"[minio]\nendpoint = {self.proxy.url()}\n[{user.label}@minio]\n"
                         f"access_key = {got['AccessKeyId']}\nsecret_key = {got['SecretAccessKey']}\n"
                         f"session_token = {got['SessionToken']}\n")
        user.own(creds, 0o600)
        token = user.home / "pool.token"
        token.write_text(TOKEN)
        user.own(token, 0o600)

    def remove_users(self):
        for user in self.users.values():
            user.remove()

    def node(self, name):
        return next(n for n in self.pool.nodes if n.name == name)

    def python_env(self, **extra):
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": f"{ROOT}:{_site_packages()}",
               "LD_LIBRARY_PATH": str(Path(self.python).parents[1] / "lib"),
               "PEGASUS_CLOUDIO_CONFIG": os.devnull, "AWS_EC2_METADATA_DISABLED": "true",
               "PEGASUS_CLOUDIO_P2P_REDIS": self.redis.url, "PEGASUS_CLOUDIO_P2P_NAMESPACE": self.namespace,
               "PEGASUS_CLOUDIO_P2P_CA_FILE": str(self.tls.ca_cert),
               "PEGASUS_CLOUDIO_P2P_NETWORKS": self.pool.cidr, "PEGASUS_CLOUDIO_P2P_READ_TIMEOUT": "2"}
        env.update(extra)
        return env

    def start_daemon(self, name):
        node = self.node(name)
        users = ",".join(f"{u.name}={u.cache(name)}" for u in self.users.values())
        for user in self.users.values():  # what the user's first job would do: a private cache
            path = user.cache(name)
            if not path.exists():
                path.mkdir(mode=0o700)
                user.own(path, 0o700)
        env = self.python_env(PEGASUS_CLOUDIO_P2P_BIND=f"{node.address}:8470",
                              PEGASUS_CLOUDIO_P2P_CERT=str(self.tls.cert), PEGASUS_CLOUDIO_P2P_KEY=str(self.tls.key),
                              PEGASUS_CLOUDIO_P2P_USERS=users, PEGASUS_CLOUDIO_P2P_NODE=name,
                              PEGASUS_CLOUDIO_P2P_TOKEN_FILE=str(self.pool_token),
                              PEGASUS_CLOUDIO_P2P_HEARTBEAT_TTL="3")
        log = open(self.base / f"daemon-{name}.log", "ab")
        proc = subprocess.Popen(node.argv([self.python, "-m", "pegasus_cloudio.cli", "serve"]), env=env,
                                stdout=log, stderr=subprocess.STDOUT)
        self.daemons[name] = proc
        client = redis.Redis.from_url(self.redis.url)
        deadline = time.monotonic() + 30
        wanted = {f"{name}/{u.name}" for u in self.users.values()}
        while not wanted <= {k.decode() for k in client.hkeys(f"{self.namespace}:{{n}}:nodes")}:
            assert proc.poll() is None and time.monotonic() < deadline, (self.base / f"daemon-{name}.log").read_text()
            time.sleep(0.05)

    def stop_daemons(self):
        for proc in self.daemons.values():
            proc.terminate()
        for proc in self.daemons.values():
            proc.wait(timeout=30)

    def job(self, label, name, entries):
        user = self.users[label]
        argv = self.node(name).argv(["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
                                     self.python, "-m", "pegasus_cloudio.dropin"])
        env = self.python_env(HOME=str(user.home), PEGASUS_CREDENTIALS=str(user.home / "credentials.conf"),
                              PEGASUS_CLOUDIO_CACHE_DIR=str(user.cache(name)),
                              PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES="0",
                              PEGASUS_CLOUDIO_P2P_TOKEN_FILE=str(user.home / "pool.token"),
                              PEGASUS_CLOUDIO_P2P_NODE=name)
        done = subprocess.run(argv, env=env, input=json.dumps(entries), capture_output=True, text=True,
                              cwd=str(user.home), timeout=120)
        return done.returncode, done.stderr

    def read(self, label, name, bucket_of, key, dest_name=None):
        """(entry, destination) for ``label`` reading ``key`` of ``bucket_of``'s bucket on ``name``."""
        user = self.users[label]
        dest = user.home / "out" / name / (dest_name or key)
        url = f"s3://{label}@minio/{self.buckets[bucket_of]}/{key}"
        return transfer(url, f"file://{dest}", key, "minio", "local"), dest

    def put(self, label, key, data):
        user = self.users[label]
        self.s3(*user.keys).put_object(Bucket=self.buckets[label], Key=key, Body=data)

    def gets(self):
        return self.proxy.requests_by_method.get("GET", 0)

    def cache_key(self, owner, key):
        return f"{self.proxy.url()}/{self.buckets[owner]}/{key}"

    def entries(self, label, name):
        """{key: sha256} of every entry in ``label``'s cache on ``name``."""
        layout = Layout(str(self.users[label].cache(name)))
        found = {}
        for shard in layout.shards():
            for f in os.listdir(shard):
                if f.endswith(".meta"):
                    meta = read_meta(os.path.join(shard, f))
                    found[meta.key] = meta.sha256
        return found


@pytest.fixture(scope="module")
def world(minio):
    World.endpoint = minio.endpoint
    base = Path(f"/tmp/pcio-trust-{secrets.token_hex(4)}")
    base.mkdir(mode=0o755)
    w = None
    try:
        with NetnsPool(3) as pool, RedisServer(pool.gateway) as redis_server, \
                TcpProxy((minio.host, minio.port), host=pool.gateway) as proxy:
            w = World(base, pool, redis_server, proxy, minio)
            try:
                for name in NODES:
                    w.start_daemon(name)
                yield w
            finally:
                w.stop_daemons()
    finally:
        if w is not None:
            w.remove_users()
        shutil.rmtree(base, ignore_errors=True)


def test_each_users_cache_is_served_by_a_process_running_as_that_user(world):
    for name in NODES:
        pids = subprocess.run(["pgrep", "-P", str(world.daemons[name].pid)], capture_output=True, text=True).stdout.split()
        uids = {os.stat(f"/proc/{pid}").st_uid for pid in pids}
        assert uids == {u.uid for u in world.users.values()}, pids


def test_sharing_still_pays_within_one_identity(world):
    data = os.urandom(300_000)
    world.put("alice", "shared.dat", data)
    before = world.gets()
    for name in NODES:
        entry, dest = world.read("alice", name, "alice", "shared.dat")
        rc, err = world.job("alice", name, [entry])
        assert rc == 0 and dest.read_bytes() == data, err
        assert "WARNING" not in err, err
    assert world.gets() - before == 1


def test_bob_naming_alices_url_gets_nothing_from_peers_or_the_store(world):
    data = b"alice's private data " * 1000
    world.put("alice", "private.dat", data)
    entry, _ = world.read("alice", "n0", "alice", "private.dat")
    assert world.job("alice", "n0", [entry])[0] == 0  # cached, registered and served on n0
    before = world.gets()
    entry, dest = world.read("bob", "n1", "alice", "private.dat")
    rc, err = world.job("bob", "n1", [entry])
    assert rc != 0 and not dest.exists(), err
    assert "403" in err or "AccessDenied" in err or "denied" in err.lower(), err
    assert world.gets() - before >= 1  # he was sent to the store, which refused him
    assert world.cache_key("alice", "private.dat") not in world.entries("bob", "n1")


def test_bob_asking_alices_daemon_for_her_entry_by_key_gets_404(world):
    import http.client
    import ssl
    from transfer.p2p.client import PROOF_HEADER, certificate_binding
    from transfer.peers import derive_scope, proof
    data = os.urandom(5000)
    world.put("alice", "bykey.dat", data)
    entry, _ = world.read("alice", "n0", "alice", "bykey.dat")
    assert world.job("alice", "n0", [entry])[0] == 0
    key = world.cache_key("alice", "bykey.dat")
    bob = world.users["bob"]
    bob_scope = derive_scope(bob.keys[1], "s3", world.proxy.url(), bob.keys[0], world.buckets["alice"])
    alice = world.users["alice"]
    node = world.node("n0")
    context = ssl.create_default_context(cafile=str(world.tls.ca_cert))
    der = ssl.PEM_cert_to_DER_cert(world.tls.cert.read_text().split("-----END CERTIFICATE-----")[0]
                                   + "-----END CERTIFICATE-----\n")
    binding = certificate_binding(der)
    for headers in ({"Authorization": f"Bearer {TOKEN}"},
                    {"Authorization": f"Bearer {TOKEN}",
                     PROOF_HEADER: proof(bob_scope.capability(key), binding, digest_of(key))}):
        conn = http.client.HTTPSConnection(node.address, 8470, context=context, timeout=5)
        conn.request("GET", f"/v1/{alice.name}/{digest_of(key)}", headers=headers)
        response = conn.getresponse()
        body = response.read()
        conn.close()
        assert response.status == 404 and data not in body


def test_bobs_bytes_planted_for_alices_input_never_reach_her(world):
    """Bob caches his own bytes under the cache key of Alice's input on n1 and registers
    them for each of his nodes (outvoting her one replica): under her entry's name with a tag
    he cannot compute, and under the name today's index used. Alice's job on n2 gets the
    store's bytes, and so does her cache."""
    good, evil = os.urandom(20_000), os.urandom(20_000)
    world.put("alice", "input.dat", good)
    entry, _ = world.read("alice", "n0", "alice", "input.dat")
    assert world.job("alice", "n0", [entry])[0] == 0  # alice's real replica on n0 (its entry exists)
    key = world.cache_key("alice", "input.dat")
    plant = (f"from transfer.cache import NodeCache; from transfer.cache.config import CacheConfig;"
             f"c = NodeCache(CacheConfig({str(world.users['bob'].cache('n1'))!r}, max_bytes=1 << 30, "
             f"min_free_bytes=0)); c.insert_bytes({key!r}, bytes.fromhex({evil.hex()!r}))")
    bob = world.users["bob"]
    subprocess.run(["setpriv", f"--reuid={bob.uid}", f"--regid={bob.gid}", "--clear-groups", world.python, "-c",
                    plant], env=world.python_env(), check=True, timeout=60)
    client = redis.Redis.from_url(world.redis.url)
    value = f"{len(evil):016x} {hashlib.sha256(evil).hexdigest()}"  # well-formed (sealed fields), wrong tag
    plain = digest_of(key)[:32]
    for node in (f"{n}/{bob.name}" for n in NODES):  # all his live node ids: a majority against hers
        for name in client.scan_iter(f"{world.namespace}:*:r:*"):  # every entry: alice's is among them
            client.hset(name, node, value + " " + "0" * 32)
        client.hset(f"{world.namespace}:{{{plain[0]}}}:r:{plain}", node, value)  # today's layout
    entry, dest = world.read("alice", "n2", "alice", "input.dat")
    rc, err = world.job("alice", "n2", [entry])
    assert rc == 0 and dest.read_bytes() == good, err
    assert world.entries("alice", "n2")[key] == hashlib.sha256(good).hexdigest()
    assert "unauthenticated replica entry" in err
