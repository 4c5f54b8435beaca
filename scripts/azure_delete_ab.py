"""Azure deletes on one Azurite: one Delete Blob per blob against Blob Batch, pairs interleaved.

    .venv/bin/python scripts/azure_delete_ab.py [--count 500] [--rounds 3]

Each round fills a fresh container with ``--count`` blobs of 1 byte (azure-storage-blob), then
removes them with :meth:`AzureBackend.delete`, once a blob per call (a lone blob is one Delete
Blob: the backend's only way before Blob Batch) and once all in one call (Blob Batch, 256
sub-requests a request), alternating which goes first. It prints each run's wall seconds,
requests sent and the 1-minute load average, then the median per-blob / batch ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from azure.storage.blob import BlobServiceClient  # noqa: E402

from pegasus_cloudio_testbed.azurite import Azurite  # noqa: E402
from transfer import Settings  # noqa: E402
from transfer.backends._azure_auth import resolve  # noqa: E402
from transfer.backends.azure import AzureBackend  # noqa: E402
from transfer.http.pool import ConnectionPool, PoolStats  # noqa: E402
from transfer.urls import parse_url  # noqa: E402


def _run(az: Azurite, service: BlobServiceClient, count: int, batched: bool) -> float:
    name = f"ab-{uuid.uuid4().hex[:12]}"
    box = service.create_container(name)
    for n in range(count):
        box.upload_blob(f"d/{n:05d}", b"x")
    stats = PoolStats()
    backend = AzureBackend(ConnectionPool(f"http://{az.host}:{az.port}", max_idle=2, stats=stats),
                           resolve(az.account, {"AZURE_STORAGE_CONNECTION_STRING": az.connection_string}),
                           Settings(), path_prefix=f"/{az.account}")
    urls = [parse_url(f"az://{az.account}/{name}/d/{n:05d}") for n in range(count)]
    try:
        started = time.perf_counter()
        outcomes = backend.delete(urls) if batched else [backend.delete([url])[0] for url in urls]
        took = time.perf_counter() - started
    finally:
        backend.close()
    if outcomes != [None] * count or list(box.list_blobs()):
        raise SystemExit(f"{name}: not every blob was removed")
    print(f"{'batch' if batched else 'per-blob':8s} {took:7.2f} s {stats.requests_sent:6d} requests "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times: Dict[bool, List[float]] = {False: [], True: []}
    with Azurite() as az:
        service = BlobServiceClient.from_connection_string(az.connection_string)
        for round_ in range(args.rounds):
            for batched in ((False, True) if round_ % 2 == 0 else (True, False)):
                times[batched].append(_run(az, service, args.count, batched))
    ratio = statistics.median(p / b for p, b in zip(times[False], times[True]))
    print(f"median per-blob / batch wall time: {ratio:.1f}x over {args.rounds} pairs of {args.count} blobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
