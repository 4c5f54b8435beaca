"""Throttling is not failure (issue 37): real drop-ins against MinIO behind the fault proxy
answering ``503 SlowDown``. Throttle answers spend neither attempts nor the run's retry
budget; ``Retry-After`` is the wait; only the throttle time running out fails a file, with a
message saying so; the jobs of a node share what they learn in a private rate file that no
link can redirect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import boto3
import pytest

from pegasus_cloudio_testbed.proxy import SLOW_DOWN_BODY, Fault, TcpProxy

OURS = [sys.executable, "-m", "pegasus_cloudio.dropin"]
SLOW_DOWN = {"code": 503, "body": SLOW_DOWN_BODY}


def _put(minio, bucket: str, keys: List[str]) -> None:  # type: ignore[no-untyped-def]
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    for key in keys:
        client.put_object(Bucket=bucket, Key=key, Body=key.encode())


def _spec(bucket: str, keys: List[str], dest: Path) -> str:
    return json.dumps([{"type": "transfer", "lfn": key, "id": n,
                        "src_urls": [{"site_label": "minio", "url": f"s3://test@minio/{bucket}/{key}"}],
                        "dest_urls": [{"site_label": "local", "url": f"file://{dest}/{key.rsplit('/', 1)[-1]}"}]}
                       for n, key in enumerate(keys)])


def _run(spec: str, env: Dict[str, str], cwd: Path) -> Tuple[int, str, float]:
    env = dict(env, PATH=os.environ["PATH"], PYTHONPATH=os.environ.get("PYTHONPATH", ""),
               AWS_EC2_METADATA_DISABLED="true", PEGASUS_CLOUDIO_CACHE_DIR="off")
    start = time.monotonic()
    done = subprocess.run(OURS, input=spec, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stderr, time.monotonic() - start


@pytest.fixture
def runtime(tmp_path: Path) -> Path:
    """The jobs' XDG_RUNTIME_DIR: where the node's rate file goes."""
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    return path


def test_throttled_then_recovering_every_file_arrives(proxied, minio, bucket, tmp_path, runtime):  # type: ignore[no-untyped-def]
    """60 'slow down' answers to a job of 30 files: the run's budget (20 + 30/10 = 23 retries)
    would have failed files; now every file arrives, and the node learned the prefix's rate."""
    proxy, env = proxied
    keys = [f"run/f{n:03d}.dat" for n in range(30)]
    _put(minio, bucket, keys)
    proxy.set_faults([Fault(kind="status", times=60, match=_get(bucket), **SLOW_DOWN)])  # type: ignore[arg-type]
    dest = tmp_path / "job"
    rc, err, _ = _run(_spec(bucket, keys, dest), dict(env, XDG_RUNTIME_DIR=str(runtime),
                                                      PEGASUS_CLOUDIO_RETRY_BASE_DELAY="0.01"), tmp_path)
    assert rc == 0, err[-3000:]
    assert proxy.pending_faults() == 0
    assert sorted(p.name for p in dest.iterdir()) == sorted(k.rsplit("/", 1)[-1] for k in keys)
    assert all((dest / k.rsplit("/", 1)[-1]).read_bytes() == k.encode() for k in keys)
    rates = (runtime / "pegasus-cloudio" / "rates").read_text()
    assert f"/{bucket}/run/\t" in rates, rates
    assert oct((runtime / "pegasus-cloudio" / "rates").stat().st_mode & 0o777) == "0o600"


def test_retry_after_is_the_wait(proxied, minio, bucket, tmp_path, runtime):  # type: ignore[no-untyped-def]
    """One answer with ``Retry-After: 3``: the job waits those seconds (its own backoff would
    be 0.04 s at most), then gets the file."""
    proxy, env = proxied
    _put(minio, bucket, ["one.dat"])
    proxy.set_faults([Fault(kind="status", times=1, match=_get(bucket), headers=(("Retry-After", "3"),),
                            **SLOW_DOWN)])  # type: ignore[arg-type]
    rc, err, seconds = _run(_spec(bucket, ["one.dat"], tmp_path / "job"),
                            dict(env, XDG_RUNTIME_DIR=str(runtime), PEGASUS_CLOUDIO_RETRY_BASE_DELAY="0.01"),
                            tmp_path)
    assert rc == 0, err[-3000:]
    assert proxy.pending_faults() == 0
    assert (tmp_path / "job" / "one.dat").read_bytes() == b"one.dat"
    assert seconds >= 3.0  # a lower bound only: the wait the store asked for was kept


def test_the_throttle_time_running_out_fails_with_the_rate(proxied, minio, bucket, tmp_path, runtime):  # type: ignore[no-untyped-def]
    proxy, env = proxied
    _put(minio, bucket, ["a.dat", "b.dat"])
    proxy.set_faults([Fault(kind="status", times=100000, match=_get(bucket), **SLOW_DOWN)])  # type: ignore[arg-type]
    rc, err, _ = _run(_spec(bucket, ["a.dat", "b.dat"], tmp_path / "job"),
                      dict(env, XDG_RUNTIME_DIR=str(runtime), PEGASUS_CLOUDIO_THROTTLE_TIMEOUT="2",
                           PEGASUS_CLOUDIO_RETRY_BASE_DELAY="0.01"), tmp_path)
    assert rc != 0
    assert "the store throttled it for" in err and "PEGASUS_CLOUDIO_THROTTLE_TIMEOUT (2 s) ran out" in err, err
    assert "requests to s3://test@minio/" in err and "/s" in err, err
    assert not (tmp_path / "job").exists() or not any((tmp_path / "job").iterdir())


def test_the_throttle_time_comes_from_the_config_file(proxied, minio, bucket, tmp_path, runtime):  # type: ignore[no-untyped-def]
    proxy, env = proxied
    _put(minio, bucket, ["a.dat"])
    proxy.set_faults([Fault(kind="status", times=100000, match=_get(bucket), **SLOW_DOWN)])  # type: ignore[arg-type]
    config = tmp_path / "cloudio.conf"
    config.write_text("PEGASUS_CLOUDIO_THROTTLE_TIMEOUT = 1\n")
    rc, err, _ = _run(_spec(bucket, ["a.dat"], tmp_path / "job"),
                      dict(env, XDG_RUNTIME_DIR=str(runtime), PEGASUS_CLOUDIO_CONFIG=str(config),
                           PEGASUS_CLOUDIO_RETRY_BASE_DELAY="0.01"), tmp_path)
    assert rc != 0 and "PEGASUS_CLOUDIO_THROTTLE_TIMEOUT (1 s) ran out" in err, err


def test_a_rate_file_that_is_a_link_is_not_followed(proxied, minio, bucket, tmp_path, runtime):  # type: ignore[no-untyped-def]
    """Another user (or a stale job) left a link where the rate file goes: the job does not
    write through it, says so once, paces itself alone and gets its files."""
    proxy, env = proxied
    keys = [f"run/f{n}.dat" for n in range(10)]
    _put(minio, bucket, keys)
    directory = runtime / "pegasus-cloudio"
    directory.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (directory / "rates").symlink_to(victim)
    proxy.set_faults([Fault(kind="status", times=20, match=_get(bucket), **SLOW_DOWN)])  # type: ignore[arg-type]
    rc, err, _ = _run(_spec(bucket, keys, tmp_path / "job"),
                      dict(env, XDG_RUNTIME_DIR=str(runtime), PEGASUS_CLOUDIO_RETRY_BASE_DELAY="0.01"), tmp_path)
    assert rc == 0, err[-3000:]
    assert victim.read_text() == "precious\n"
    assert err.count("rate file") == 1, err
    assert len(list((tmp_path / "job").iterdir())) == 10


def test_a_hostile_rate_file_cannot_stop_a_job(proxied, minio, bucket, tmp_path, runtime):  # type: ignore[no-untyped-def]
    """A rate file full of garbage and absurd rates (a job of the user gone wrong, or one that
    ignores the limiter and writes what it likes): the job still gets its files."""
    proxy, env = proxied
    keys = [f"run/f{n}.dat" for n in range(10)]
    _put(minio, bucket, keys)
    directory = runtime / "pegasus-cloudio"
    directory.mkdir(mode=0o700)
    prefix = f"s3://test@minio/{bucket}/run/"
    hostile = f"{prefix}\t1e-300\t{time.time() + 1e9}\t-1e300\t{time.time()}\t1e300\n" + "x" * (200 << 10)
    (directory / "rates").write_text(hostile)
    os.chmod(directory / "rates", 0o600)
    proxy.set_faults([Fault(kind="status", times=5, match=_get(bucket), **SLOW_DOWN)])  # type: ignore[arg-type]
    rc, err, _ = _run(_spec(bucket, keys, tmp_path / "job"),
                      dict(env, XDG_RUNTIME_DIR=str(runtime), PEGASUS_CLOUDIO_RETRY_BASE_DELAY="0.01"), tmp_path)
    assert rc == 0, err[-3000:]
    assert len(list((tmp_path / "job").iterdir())) == 10
    assert (directory / "rates").stat().st_size <= 64 << 10


def _get(bucket: str):  # type: ignore[no-untyped-def]
    from pegasus_cloudio_testbed.faults import Match
    return Match("GET", f"/{bucket}/")


def test_jobs_behind_a_rate_limit_and_a_client_that_ignores_it_all_finish(minio, bucket, tmp_path, runtime):  # type: ignore[no-untyped-def]
    """Three drop-ins of 20 files on one prefix behind a front that lets 30 requests/s through,
    while a client that ignores every 503 keeps sending 20 requests/s to that prefix: the
    front throttles them, and every job still gets every file (the default settings, no retry
    tuning). (A client that sends as fast as it can takes every token a bucket refills, and
    starves everyone until the throttle time runs out: the store's limit, not ours.)"""
    import socket
    import threading

    from pegasus_cloudio_testbed.throttle import ThrottleFront
    keys = [f"run/f{n:03d}.dat" for n in range(20)]
    _put(minio, bucket, keys)
    stop = threading.Event()

    def hammer(port: int) -> None:  # unsigned GETs of the prefix, 20/s whatever the answers
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                    for _ in range(50):
                        sock.sendall(f"GET /{bucket}/run/f000.dat HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                        sock.recv(65536)
                        if stop.wait(0.05):
                            return
            except OSError:
                pass

    with ThrottleFront(minio.host, minio.port, rate=30, burst=30, shape="s3") as front:
        creds = minio.write_pegasus_credentials(tmp_path / "front.conf", site="minio", user="test",
                                                endpoint=front.endpoint)
        env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
               "XDG_RUNTIME_DIR": str(runtime)}
        hostile = threading.Thread(target=hammer, args=(front.port,), daemon=True)
        hostile.start()
        try:
            outcomes = []
            threads = [threading.Thread(target=lambda j=j: outcomes.append(
                (j, _run(_spec(bucket, keys, tmp_path / f"job{j}"), env, tmp_path)))) for j in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            stop.set()
            hostile.join(10)
        stats = front.stats()
    assert stats["throttled"] > 0, stats  # the front did throttle
    for j, (rc, err, _) in outcomes:
        assert rc == 0, err[-3000:]
        assert sorted(p.name for p in (tmp_path / f"job{j}").iterdir()) == sorted(k.rsplit("/", 1)[-1] for k in keys)
