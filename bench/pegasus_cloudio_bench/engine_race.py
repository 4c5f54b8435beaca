"""The S3 engine race behind docs/architecture.md: our client against obstore, fairly.

Each contestant is a fresh Python process that imports its engine, fetches the same N
small objects from one MinIO with T threads into files (temp name, then rename), and exits;
wall time is measured around the whole process (start-up included for every contestant), CPU
time is the child's user+system time, and connections are counted by a TCP proxy in front
of MinIO. Contestants:

* ``ours``: ``transfer``'s S3 backend driven by a thread pool (the engine without the drop-in);
* ``obstore``: obstore's ``S3Store`` with ``obstore.get(...).bytes()`` driven by the same pool;
* ``dropin``: ``pegasus-cloudio-transfer`` as jobs run it (spec parsing, logs, checks included).

Run: ``python -m pegasus_cloudio_bench.engine_race [--count 3000] [--rounds 3] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional

from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import TcpProxy

BUCKET = "race"
WORKER = "pegasus_cloudio_bench.engine_race_worker"  # imports only its engine: start-up is fair


def _timed(argv: List[str], stdin: bytes = b"", env: Optional[Dict[str, str]] = None) -> Dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, input=stdin, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


def _dropin_argv(endpoint: str, minio: MinioServer, names: List[str], out: str, threads: int) -> tuple:  # type: ignore[type-arg]
    creds = os.path.join(out, ".creds")
    fd = os.open(creds, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"[race]\nendpoint = {endpoint}\n[b@race]\naccess_key = {minio.access_key}\n"
                     f"secret_key = {minio.secret_key}\n")
    spec = [{"type": "transfer", "lfn": n, "id": i, "src_urls": [{"site_label": "race", "url": f"s3://b@race/{BUCKET}/{n}"}],
             "dest_urls": [{"site_label": "local", "url": f"file://{out}/{n}"}]} for i, n in enumerate(names)]
    env = dict(os.environ, PEGASUS_CREDENTIALS=creds, HOME=out, PEGASUS_CLOUDIO_CONFIG=os.devnull)
    argv = [str(Path(sys.executable).with_name("pegasus-cloudio-transfer")), "--threads", str(threads)]
    return argv, json.dumps(spec).encode(), env


def race(count: int = 3000, size: int = 300, threads: int = 5, rounds: int = 3) -> Dict[str, object]:
    """Every contestant ``rounds`` times, in rotating order; figures per run."""
    results: Dict[str, List[Dict[str, float]]] = {"ours": [], "obstore": [], "dropin": []}
    with MinioServer() as minio, TcpProxy((minio.host, minio.port)) as proxy, \
            tempfile.TemporaryDirectory(prefix="engine-race-") as root:
        names = [f"f{i:05d}" for i in range(count)]
        _upload(minio, names, size)
        names_file = os.path.join(root, "names")
        Path(names_file).write_text("\n".join(names))
        endpoint = proxy.url()
        order = list(results)
        for round_number in range(rounds):
            for engine in order[round_number % 3:] + order[:round_number % 3]:
                out = tempfile.mkdtemp(dir=root)
                opened = proxy.connections
                if engine == "dropin":
                    argv, stdin, env = _dropin_argv(endpoint, minio, names, out, threads)
                    figures = _timed(argv, stdin, env)
                else:
                    figures = _timed([sys.executable, "-m", WORKER, engine, endpoint, minio.access_key,
                                      minio.secret_key, names_file, out, str(threads)])
                figures["cpu_ms_per_get"] = figures["cpu_s"] * 1000 / count
                figures["connections"] = proxy.connections - opened
                assert len([n for n in os.listdir(out) if not n.startswith(".")]) == count
                results[engine].append(figures)
    imports = {module: _import_time(module) for module in ("transfer.backends.s3", "obstore")}
    return {"count": count, "size": size, "threads": threads, "rounds": rounds, "runs": results,
            "import_s": imports}


def _import_time(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def _upload(minio: MinioServer, names: List[str], size: int) -> None:
    import boto3  # type: ignore[import-untyped]

    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    body = os.urandom(size)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: client.put_object(Bucket=BUCKET, Key=n, Body=body), names))


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="engine_race")
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=5)
    args = parser.parse_args(argv)
    print(json.dumps(race(args.count, threads=args.threads, rounds=args.rounds), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
