"""Many small files staged out to and back in from GCS (fake-gcs-server), against a naive loop.

In one run, on a fake-gcs-server behind a counting proxy on loopback:

* ours: ``pegasus-cloudio-transfer --threads T`` stages all N files out, then in;
* naive: a google-cloud-storage loop with a fresh client in a fresh Python process per file,
  T processes at a time (:mod:`pegasus_cloudio_bench.naive_gcs`), on two samples (S/4 and S
  files) per direction, extrapolated linearly to N and labelled as such;
* the start-up cost of ``pegasus-cloudio-transfer`` on an empty input.

The stock pegasus-transfer's gs:// handler needs ``gsutil``, which is not installed here, so
it is not run; the result says so. Targets (issue 3): one request per downloaded file and at
most T + 2 connections. Every stage-in result is compared byte for byte with the originals.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Dict, Optional, Tuple

from pegasus_cloudio_bench import naive_gcs
from pegasus_cloudio_bench.harness import (
    Measurement, Progress, StoreWorkspace, per_file_samples, ratio, tool_env,
)
from pegasus_cloudio_bench.small_files import Params, make_result, measure_ours, measure_startup
from pegasus_cloudio_testbed.fakegcs import FakeGcsServer
from pegasus_cloudio_testbed.proxy import TcpProxy

BUCKET = "bench"
SITE = "gcs"
NOTES = [
    "naive: google-cloud-storage 3.17.1, storage.Client() and download_to_filename/upload_from_filename "
    "in a fresh Python process per file, T processes at a time; run on samples and extrapolated",
    "stock pegasus-transfer not run: its gs:// handler runs gsutil, which is not installed here",
    "store: fake-gcs-server v1.56.1 (in memory) over plain HTTP on loopback, behind a counting proxy",
]


class GcsWorkspace(StoreWorkspace):
    """A run's workspace on fake-gcs-server (``gs://bench``), reached through ``proxy``."""

    def __init__(self, root: str, params: Params, proxy: TcpProxy) -> None:
        super().__init__(root, params, f"gs://{BUCKET}")
        inherited = {k: v for k, v in tool_env({}).items() if not k.startswith(("GOOGLE_", "STORAGE_"))}
        self.env = dict(inherited, STORAGE_EMULATOR_HOST=proxy.url(), PEGASUS_CLOUDIO_CONFIG=os.devnull)


def run(params: Params, progress: Progress) -> Dict[str, object]:
    root = tempfile.mkdtemp(prefix="pegasus-cloudio-bench-gcs-")
    try:
        with FakeGcsServer() as server, \
                TcpProxy((server.host, server.port), delay_ms=params.rtt_ms / 2) as proxy:
            runs = _run_all(GcsWorkspace(root, params, proxy), proxy, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report(params, runs)


def _run_all(ws: GcsWorkspace, proxy: TcpProxy, progress: Progress) -> Dict[str, object]:
    runs = measure_ours(ws, proxy, progress, mkdir_url=f"gs://{BUCKET}/ours")
    runs["naive_out"], runs["naive_in"], runs["naive_in_identical"] = _naive(ws, proxy, progress)
    runs["empty_input_wall_s"] = measure_startup(ws, proxy, progress)
    progress.done()
    return runs


def _naive(ws: GcsWorkspace, proxy: TcpProxy, progress: Progress) -> Tuple[Measurement, Measurement, bool]:
    argv = [sys.executable, "-m", naive_gcs.MODULE, "--threads", str(ws.params.threads)]
    return per_file_samples(ws, proxy, progress, "naive gcs loop", "naive loop", argv, BUCKET, "naive")


def report(params: Params, runs: Dict[str, object]) -> Dict[str, object]:
    """The result in the shape of ``small_files.report``, with the GCS targets of issue 3."""
    measured = {k: v for k, v in runs.items() if isinstance(v, Measurement)}
    ours_in, ours_out = measured["ours_in"], measured["ours_out"]
    naive_in, naive_out = measured["naive_in"], measured["naive_out"]
    ratios: Dict[str, Optional[float]] = {
        "stage_in_speedup_vs_naive": ratio(naive_in.wall_s, ours_in.wall_s),
        "stage_out_speedup_vs_naive": ratio(naive_out.wall_s, ours_out.wall_s),
        "requests_per_downloaded_file": ratio(ours_in.requests, ours_in.files),
        "naive_requests_per_downloaded_file": ratio(naive_in.requests, naive_in.files),
        "naive_connections_per_downloaded_file": ratio(naive_in.connections, naive_in.files),
    }
    limit = params.threads + 2
    targets = {
        "requests_per_downloaded_file_is_1.0": ours_in.requests == ours_in.files and ours_in.exit_code == 0,
        "connections_at_most_threads_plus_2": ours_in.connections <= limit and ours_out.connections <= limit,
        "stage_in_files_identical": bool(runs["ours_in_identical"]) and bool(runs["naive_in_identical"]),
        "all_runs_exit_0": all(m.exit_code == 0 for m in measured.values()),
    }
    return make_result(params, runs, ratios, targets, digits=3, store="gcs", notes=NOTES)

