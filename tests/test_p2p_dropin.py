"""pegasus-cloudio-transfer with PEGASUS_CLOUDIO_P2P_* set: a job on node B reads what node A's
cache holds from A's daemon, with no store request; without the redis package it runs as today."""

from __future__ import annotations

import getpass
import json
import os

import pytest

from pegasus_cloudio.p2p.serve import Daemon
from pegasus_cloudio.p2p.server import ServeConfig
from pegasus_cloudio.p2p.settings import DaemonSettings
from pegasus_cloudio_testbed.certs import make_tls_files
from pegasus_cloudio_testbed.redis import RedisServer
from transfer.p2p import connect_redis
from transfer.p2p.index import PeerIndex
from p2p_support import TOKEN
from test_dropin import run, transfer


@pytest.fixture
def p2p_env(tmp_path):
    tls = make_tls_files(tmp_path / "tls")
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    with RedisServer() as redis_server:
        env = {"PEGASUS_CLOUDIO_P2P_REDIS": redis_server.url, "PEGASUS_CLOUDIO_P2P_TOKEN_FILE": str(token),
               "PEGASUS_CLOUDIO_P2P_CA_FILE": str(tls.ca_cert), "PEGASUS_CLOUDIO_P2P_NAMESPACE": "dropin"}
        yield env, tls, redis_server


def node_env(base, p2p, tmp_path, node):
    """The job environment on ``node`` (PYTHONPATH kept: the code under test, e.g. a worktree)."""
    return dict(base, **p2p, PEGASUS_CLOUDIO_P2P_NODE=node, PYTHONPATH=os.environ.get("PYTHONPATH", ""),
                PEGASUS_CLOUDIO_CACHE_DIR=str(tmp_path / f"cache-{node}"), PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES="0")


def test_a_job_on_b_reads_a_file_from_node_as_cache_without_a_store_request(proxied, bucket, tmp_path, p2p_env):
    proxy, env = proxied
    p2p, tls, redis_server = p2p_env
    (tmp_path / "out.dat").write_bytes(os.urandom(200_000))
    url = f"s3://test@minio/{bucket}/run/out.dat"
    rc, err = run(json.dumps([transfer(f"file://{tmp_path}/out.dat", url, "out.dat")]),
                  node_env(env, p2p, tmp_path, "a"), tmp_path)  # stage-out on A writes through A's cache
    assert rc == 0, err
    serve = ServeConfig({getpass.getuser(): str(tmp_path / "cache-a")}, TOKEN, ("127.0.0.1", 0),
                        str(tls.cert), str(tls.key))
    index = PeerIndex(connect_redis(redis_server.url), "dropin")
    daemon = Daemon(DaemonSettings(serve, "a", "", "", redis_server.url, False, "dropin", 30), index).start()
    try:
        proxy.reset_counters()
        spec = json.dumps([transfer(url, f"file://{tmp_path}/b/out.dat", "out.dat", "minio", "local")])
        rc, err = run(spec, node_env(env, p2p, tmp_path, "b"), tmp_path)
    finally:
        daemon.stop()
    assert rc == 0, err
    assert (tmp_path / "b" / "out.dat").read_bytes() == (tmp_path / "out.dat").read_bytes()
    assert proxy.snapshot()["requests"] == 0, err
    assert "WARNING" not in err


def test_without_the_redis_package_the_job_runs_as_today_with_one_warning(s3_env, bucket, tmp_path, p2p_env):
    p2p, _, _ = p2p_env
    shim = tmp_path / "shim" / "redis"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named redis')\n")
    (tmp_path / "in.dat").write_bytes(b"payload")
    url = f"s3://test@minio/{bucket}/run/in.dat"
    env = node_env(s3_env, p2p, tmp_path, "b")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "shim"), os.environ.get("PYTHONPATH", "")])
    rc, err = run(json.dumps([transfer(f"file://{tmp_path}/in.dat", url, "in.dat")]), env, tmp_path)
    assert rc == 0, err
    rc, err = run(json.dumps([transfer(url, f"file://{tmp_path}/b/in.dat", "in.dat", "minio", "local")]),
                  env, tmp_path)
    assert rc == 0, err
    assert err.count("redis package is missing") == 1
    assert (tmp_path / "b" / "in.dat").read_bytes() == b"payload"
