"""One contestant of :mod:`pegasus_cloudio_bench.library`, in a fresh process that imports only
its own library (and the standard library), so start-up costs compare fairly.

``python -m pegasus_cloudio_bench.library_worker TOOL up|down ENDPOINT KEY SECRET BUCKET PREFIX
NAMES_FILE LOCAL_DIR THREADS``: ``up`` stores every ``LOCAL_DIR/NAME`` as ``PREFIX/NAME``,
``down`` writes every ``PREFIX/NAME`` to ``LOCAL_DIR/NAME`` (temp name, then rename).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

Job = Tuple[str, str, str, str, str, str, List[str], str, int]  # direction, endpoint, key, secret, bucket, prefix,
#                                                                 names, local dir, threads


def _write(directory: str, name: str, data: bytes) -> None:
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, os.path.join(directory, name))


def _read(directory: str, name: str) -> bytes:
    with open(os.path.join(directory, name), "rb") as handle:
        return handle.read()


def _pairs(job: Job) -> List[Tuple[str, str]]:
    direction, _, _, _, bucket, prefix, names, local, _ = job
    remote = [f"s3://{bucket}/{prefix}/{n}" for n in names]
    files = [os.path.join(local, n) for n in names]
    return list(zip(files, remote)) if direction == "up" else list(zip(remote, files))


def ours(job: Job, bundles: bool = False) -> None:
    from transfer.client import Client

    _, endpoint, key, secret, _, _, _, _, threads = job
    with Client(endpoint=endpoint, access_key=key, secret_key=secret, threads=threads, bundles=bundles) as client:
        client.copy(_pairs(job))


def ours_bundles(job: Job) -> None:
    ours(job, bundles=True)


def _fsspec_bulk(fs: Any, job: Job) -> None:
    """One bulk ``put`` or ``get`` of every file, as an fsspec user writes it."""
    direction, _, _, _, bucket, prefix, names, local, _ = job
    remote = [f"{bucket}/{prefix}/{n}" for n in names]
    files = [os.path.join(local, n) for n in names]
    if direction == "up":
        fs.put(files, remote)
    else:
        fs.get(remote, files)


def ours_fsspec(job: Job) -> None:
    import fsspec

    _, endpoint, key, secret, _, _, _, _, threads = job
    _fsspec_bulk(fsspec.filesystem("cloudio", endpoint=endpoint, access_key=key, secret_key=secret,
                                   threads=threads), job)


def s3fs_bulk(job: Job) -> None:
    import s3fs

    _, endpoint, key, secret, _, _, _, _, _ = job
    _fsspec_bulk(s3fs.S3FileSystem(key=key, secret=secret, endpoint_url=endpoint,
                                   client_kwargs={"region_name": "us-east-1"}), job)


def boto3_pool(job: Job) -> None:
    import boto3  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    direction, endpoint, key, secret, bucket, prefix, names, local, threads = job
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
                          region_name="us-east-1", config=Config(max_pool_connections=threads))

    def one(name: str) -> None:
        if direction == "up":
            client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=_read(local, name))
        else:
            _write(local, name, client.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read())

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, names))


def obstore_pool(job: Job) -> None:
    import obstore
    from obstore.store import S3Store

    direction, endpoint, key, secret, bucket, prefix, names, local, threads = job
    store = S3Store(bucket, endpoint=endpoint, access_key_id=key, secret_access_key=secret, region="us-east-1",
                    virtual_hosted_style_request=False, client_options={"allow_http": True})

    def one(name: str) -> None:
        if direction == "up":
            obstore.put(store, f"{prefix}/{name}", _read(local, name))
        else:
            _write(local, name, bytes(obstore.get(store, f"{prefix}/{name}").bytes()))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, names))


TOOLS: Dict[str, Callable[[Job], None]] = {
    "ours": ours, "ours-fsspec": ours_fsspec, "ours-bundles": ours_bundles,
    "boto3": boto3_pool, "s3fs": s3fs_bulk, "obstore": obstore_pool,
}


def main(argv: List[str]) -> None:
    tool, direction, endpoint, key, secret, bucket, prefix, names_file, local, threads = argv
    names = Path(names_file).read_text().split("\n")
    TOOLS[tool]((direction, endpoint, key, secret, bucket, prefix, names, local, int(threads)))


if __name__ == "__main__":
    main(sys.argv[1:])
