"""Many small files staged out to and back in from Azure Blob Storage (Azurite), against the
Azure CLI per file and azure-storage-blob in a thread pool.

In one run, on Azurite behind a counting proxy on loopback:

* ours: ``pegasus-cloudio-transfer --threads T`` stages all N files out, then in;
* ours bundled: the same with ``PEGASUS_CLOUDIO_BUNDLE=1`` (out, then in);
* baseline: azure-storage-blob, one ``BlobServiceClient`` and ``upload_blob``/``download_blob``
  per file in a thread pool of T (:mod:`pegasus_cloudio_bench.naive_azure`), all N files;
* baseline: the Azure CLI (``az``, pinned, :mod:`pegasus_cloudio_testbed.azure_cli`), one ``az
  storage blob upload``/``download`` process per file, T at a time
  (:mod:`pegasus_cloudio_bench.naive_azcli`), on two samples (S/4 and S files) per direction,
  extrapolated linearly to N and labelled as such (its configuration directory warmed by one
  untimed run first);
* the start-up cost of ``pegasus-cloudio-transfer`` on an empty input.

Targets (issue 35): at most T + 2 connections, a stage-in at least 20x faster than the Azure
CLI's per file, and a bundled stage-in with at least 50x fewer requests than the per-file one. Every stage-in result is compared byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from typing import Dict, Optional, Tuple

from pegasus_cloudio_bench import naive_azcli, naive_azure
from pegasus_cloudio_bench.harness import (
    Measurement, Progress, StoreWorkspace, files_identical, measure, per_file_samples, ratio, tool_env,
)
from pegasus_cloudio_bench.small_files import (OURS, SITE, Params, make_result, measure_ours, measure_startup,
                                               ours_argv, transfer_spec)
from pegasus_cloudio_testbed.azure_cli import PIN as AZ_PIN, ensure_azure_cli
from pegasus_cloudio_testbed.azurite import Azurite
from pegasus_cloudio_testbed.proxy import TcpProxy

CONTAINER = "bench"
NOTES = [
    "baseline: azure-storage-blob 12.31.1, one BlobServiceClient, upload_blob/download_blob per file in a "
    "ThreadPoolExecutor of T threads in one process",
    f"baseline: the Azure CLI ({AZ_PIN}), one `az storage blob upload/download` process per file, T at a time; "
    "run on samples and extrapolated",
    "store: Azurite 3.37.0 (in memory) over plain HTTP on loopback, behind a counting proxy",
]


class AzureWorkspace(StoreWorkspace):
    """A run's workspace on Azurite (``az://ACCOUNT/bench``), reached through ``proxy``."""

    def __init__(self, root: str, params: Params, server: Azurite, proxy: TcpProxy) -> None:
        super().__init__(root, params, f"az://{server.account}/{CONTAINER}")
        through = server.connection_string.replace(server.endpoint, f"{proxy.url()}/{server.account}")
        inherited = {k: v for k, v in tool_env({}).items() if not k.startswith("AZURE")}
        self.env = dict(inherited, AZURE_STORAGE_CONNECTION_STRING=through, PEGASUS_CLOUDIO_CONFIG=os.devnull)


def run(params: Params, progress: Progress) -> Dict[str, object]:
    root = tempfile.mkdtemp(prefix="pegasus-cloudio-bench-azure-")
    try:
        with Azurite() as server, TcpProxy((server.host, server.port), delay_ms=params.rtt_ms / 2) as proxy:
            ws = AzureWorkspace(root, params, server, proxy)
            runs = measure_ours(ws, proxy, progress, mkdir_url=f"az://{server.account}/{CONTAINER}")
            runs.update(_bundled(ws, proxy, progress))
            runs["naive_out"], runs["naive_in"], runs["naive_in_identical"] = _naive(ws, proxy, progress)
            runs["azcli_out"], runs["azcli_in"], runs["azcli_in_identical"] = _azcli(ws, proxy, progress)
            runs["empty_input_wall_s"] = measure_startup(ws, proxy, progress)
            progress.done()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report(params, runs)


def _bundled(ws: AzureWorkspace, proxy: TcpProxy, progress: Progress) -> Dict[str, object]:
    p, env = ws.params, dict(ws.env, PEGASUS_CLOUDIO_BUNDLE="1")
    progress.phase(f"ours bundled: stage-out of {p.count} files")
    out = measure(f"{OURS} (bundles)", "stage-out", p.count, ours_argv(p.threads), env, proxy,
                  stdin=transfer_spec(ws.out_pairs("bundled", ws.names), "local", SITE))
    dest = ws.fresh_dir("in-bundled")
    progress.phase(f"ours bundled: stage-in of {p.count} files")
    into = measure(f"{OURS} (bundles)", "stage-in", p.count, ours_argv(p.threads), env, proxy,
                   stdin=transfer_spec(ws.in_pairs("bundled", ws.names, dest), SITE, "local"))
    return {"bundled_out": out, "bundled_in": into,
            "bundled_in_identical": into.exit_code == 0 and files_identical(ws.src, dest, ws.names)}


def _naive(ws: AzureWorkspace, proxy: TcpProxy, progress: Progress) -> Tuple[Measurement, Measurement, bool]:
    p, tool = ws.params, "azure-storage-blob thread pool"
    argv = [sys.executable, "-m", naive_azure.MODULE, "--threads", str(p.threads)]
    progress.phase(f"baseline: stage-out of {p.count} files")
    items = [[CONTAINER, f"naive/{n}", os.path.join(ws.src, n)] for n in ws.names]
    out = measure(tool, "stage-out", p.count, argv + ["put"], ws.env, proxy, stdin=json.dumps(items).encode())
    dest = ws.fresh_dir("in-naive")
    progress.phase(f"baseline: stage-in of {p.count} files")
    items = [[CONTAINER, f"naive/{n}", os.path.join(dest, n)] for n in ws.names]
    into = measure(tool, "stage-in", p.count, argv + ["get"], ws.env, proxy, stdin=json.dumps(items).encode())
    return out, into, into.exit_code == 0 and files_identical(ws.src, dest, ws.names)


def _azcli(ws: AzureWorkspace, proxy: TcpProxy, progress: Progress) -> Tuple[Measurement, Measurement, bool]:
    """The Azure CLI per file on two samples per direction, extrapolated to N (checked byte for byte)."""
    tool = "az storage blob (per file)"
    az, config = str(ensure_azure_cli()), ws.fresh_dir("az-config")
    argv = [sys.executable, "-m", naive_azcli.MODULE, "--threads", str(ws.params.threads), "--az", az,
            "--config-dir", config]
    warm = [[CONTAINER, "azcli-warm", os.path.join(ws.src, ws.names[0])]]
    measure(tool, "warm-up", 1, argv + ["put"], ws.env, proxy, stdin=json.dumps(warm).encode())
    return per_file_samples(ws, proxy, progress, tool, "Azure CLI", argv, CONTAINER, "azcli")


def report(params: Params, runs: Dict[str, object]) -> Dict[str, object]:
    """The result in the shape of ``small_files.report``, with issue 35's targets."""
    measured = {k: v for k, v in runs.items() if isinstance(v, Measurement)}
    ours_in, ours_out, naive_in, naive_out = (measured[k] for k in ("ours_in", "ours_out", "naive_in", "naive_out"))
    bundled_in, azcli_in, azcli_out = measured["bundled_in"], measured["azcli_in"], measured["azcli_out"]
    ratios: Dict[str, Optional[float]] = {
        "stage_in_speedup_vs_baseline": ratio(naive_in.wall_s, ours_in.wall_s),
        "stage_out_speedup_vs_baseline": ratio(naive_out.wall_s, ours_out.wall_s),
        "stage_in_cpu_ratio_baseline_over_ours": ratio(naive_in.cpu_s, ours_in.cpu_s),
        "stage_in_speedup_vs_az_cli": ratio(azcli_in.wall_s, ours_in.wall_s),
        "stage_out_speedup_vs_az_cli": ratio(azcli_out.wall_s, ours_out.wall_s),
        "requests_per_downloaded_file": ratio(ours_in.requests, ours_in.files),
        "baseline_requests_per_downloaded_file": ratio(naive_in.requests, naive_in.files),
        "per_file_over_bundled_stage_in_requests": ratio(ours_in.requests, bundled_in.requests),
        "bundled_stage_in_speedup": ratio(ours_in.wall_s, bundled_in.wall_s),
    }
    limit = params.threads + 2
    targets = {
        "connections_at_most_threads_plus_2": all(m.connections <= limit for k, m in measured.items()
                                                  if k.startswith(("ours", "bundled"))),
        "bundles_50x_fewer_stage_in_requests": (ratios["per_file_over_bundled_stage_in_requests"] or 0) >= 50,
        "stage_in_20x_faster_than_az_cli": (ratios["stage_in_speedup_vs_az_cli"] or 0) >= 20,
        "stage_in_files_identical": all(bool(runs[k]) for k in ("ours_in_identical", "bundled_in_identical",
                                                                 "naive_in_identical", "azcli_in_identical")),
        "all_runs_exit_0": all(m.exit_code == 0 for m in measured.values()),
    }
    return make_result(params, runs, ratios, targets, digits=3, store="azure", notes=NOTES)
