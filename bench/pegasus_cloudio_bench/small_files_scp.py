"""Many small files staged to and from a submit host over scp://, against the stock scp handler.

In one run, on a real OpenSSH sshd (keys generated per run) behind a counting byte relay on
loopback (one accepted connection = one SSH handshake):

* ours: ``pegasus-cloudio-transfer --threads T`` stages all N files out, then in (one SSH
  connection per batch, SFTP on several channels);
* stock: ``pegasus-transfer --threads T`` (pegasus-wms-worker 5.1.3), whose scp handler runs
  one ``/usr/bin/scp`` per group of files sharing a directory pair (PM-610; groups of at most
  ``min(N/T, 100)``) plus one ``ssh mkdir -p`` per remote directory; downloads of several
  remote files open one connection per file. Two samples per direction (see
  `stock_samples`), extrapolated linearly to N and labelled as such;
* Go: Pegasus's Go ``pegasus-transfer`` (the stock tool to come), whose scp handler runs one
  ``scp`` per file; sampled and extrapolated as the Python tool;
* the start-up cost of ``pegasus-cloudio-transfer`` on an empty input.

Every stage-in result is compared byte for byte with the originals. Called by
``pegasus-cloudio bench small-files --store scp``; the result has the shape of
:func:`pegasus_cloudio_bench.small_files.report`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Dict, List, Optional, Tuple

from pegasus_cloudio_bench.go_tool import go_argv, go_env
from pegasus_cloudio_bench.harness import (
    Measurement, Progress, StoreWorkspace, extrapolate, files_identical, measure, ratio, tool_env,
)
from pegasus_cloudio_bench.small_files import Params, make_result, measure_ours, measure_startup, transfer_spec
from pegasus_cloudio_testbed.relay import RawRelay
from pegasus_cloudio_testbed.sshd import SshServer
from pegasus_cloudio_testbed.stock import make_stock_home

SITE = "local"  # the submit host is Pegasus's site "local"
OURS = "pegasus-cloudio-transfer"
STOCK = "stock pegasus-transfer"
GO = "Go pegasus-transfer"


class ScpWorkspace(StoreWorkspace):
    """A run's workspace on sshd (``scp://USER@RELAY`` and the server's root), with the stock
    and Go tools' commands and environments beside ours."""

    def __init__(self, root: str, params: Params, server: SshServer, relay: RawRelay) -> None:
        super().__init__(root, params, f"scp://{server.user}@{relay.host}:{relay.port}{server.root}")
        self.server = server
        home = os.path.join(root, "home")
        os.makedirs(home)
        stock = make_stock_home(os.path.join(root, "stock"))
        self.stock_transfer = str(stock.transfer)
        self.env = tool_env({"SSH_PRIVATE_KEY": str(server.client_key), "HOME": home,
                             "PEGASUS_CLOUDIO_CONFIG": os.devnull})
        self.stock_env = stock.env(self.env)
        self.go_argv, self.go_env = go_argv(params.threads), go_env(self.env)


def run(params: Params, progress: Progress) -> Dict[str, object]:
    root = tempfile.mkdtemp(prefix="pegasus-cloudio-bench-scp-")
    try:
        progress.phase("starting sshd")
        with SshServer() as server, RawRelay((server.host, server.port)) as relay:
            ws = ScpWorkspace(root, params, server, relay)
            runs = _run_all(ws, relay, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report(params, runs)


def _run_all(ws: ScpWorkspace, relay: RawRelay, progress: Progress) -> Dict[str, object]:
    runs = measure_ours(ws, relay, progress)
    stock = (STOCK, [ws.stock_transfer, "--threads", str(ws.params.threads)], ws.stock_env)
    runs["stock_out"], runs["stock_in"], runs["stock_in_identical"] = _stock(ws, relay, progress, *stock)
    runs["go_out"], runs["go_in"], runs["go_in_identical"] = _stock(ws, relay, progress, GO, ws.go_argv, ws.go_env)
    runs["empty_input_wall_s"] = measure_startup(ws, relay, progress)
    progress.done()
    return runs


def stock_samples(params: Params) -> Tuple[List[int], List[int]]:
    """Sample sizes (stage-out, stage-in) for the stock tool, each a sorted list.

    Stage-in costs one connection per file, so ``S/4`` and ``S`` files scale linearly.
    Stage-out batches up to ``min(N/threads, 100)`` files per scp, so its cost per file only
    becomes constant from ``100 * threads`` files on: smaller samples would extrapolate a
    too-low cost, hence samples of at least ``100 * threads`` and ``200 * threads`` files.
    """
    n, s, group = params.count, params.stock_sample, 100 * params.threads
    into = sorted({max(1, min(n, s) // 4), min(n, s)})
    out = sorted({min(n, max(s // 4, group)), min(n, max(s, 2 * group))})
    return out, into


def _stock(ws: ScpWorkspace, relay: RawRelay, progress: Progress, label: str, argv: List[str],
           env: Dict[str, str]) -> Tuple[Measurement, Measurement, bool]:
    """Samples of a stock tool (``label``: the Python or the Go one), extrapolated to N; stage-in
    samples read what the largest stage-out wrote. The Go tool no longer batches scp, so the
    samples sized for the Python tool's batches only make its figure surer."""
    p = ws.params
    out_sizes, in_sizes = stock_samples(p)
    prefix = "stock" if label == STOCK else "go"
    out: List[Measurement] = []
    for size in out_sizes:
        progress.phase(f"{label} (scp): stage-out sample of {size} files")
        out.append(measure(label, "stage-out", size, argv, env, relay,  # type: ignore[arg-type]
                           stdin=transfer_spec(ws.out_pairs(f"{prefix}{size}", ws.names[:size]), "local", SITE)))
    into: List[Measurement] = []
    identical = True
    for size in in_sizes:
        names = ws.names[:size]
        dest = ws.fresh_dir(f"in-{prefix}{size}")
        progress.phase(f"{label} (scp): stage-in sample of {size} files")
        into.append(measure(label, "stage-in", size, argv, env, relay,  # type: ignore[arg-type]
                            stdin=transfer_spec(ws.in_pairs(f"{prefix}{out_sizes[-1]}", names, dest), SITE,
                                                "local")))
        identical = identical and files_identical(ws.src, dest, names)
    return extrapolate(out[0], out[-1], p.count), extrapolate(into[0], into[-1], p.count), identical


def report(params: Params, runs: Dict[str, object]) -> Dict[str, object]:
    """The small-files result shape; ``connections`` are SSH handshakes (``requests``: 0, opaque)."""
    measured = {k: v for k, v in runs.items() if isinstance(v, Measurement)}
    ours_in, ours_out = measured["ours_in"], measured["ours_out"]
    ratios: Dict[str, Optional[float]] = {
        "stage_in_speedup_vs_stock": ratio(measured["stock_in"].wall_s, ours_in.wall_s),
        "stage_out_speedup_vs_stock": ratio(measured["stock_out"].wall_s, ours_out.wall_s),
        "stage_in_speedup_vs_go": ratio(measured["go_in"].wall_s, ours_in.wall_s),
        "stage_out_speedup_vs_go": ratio(measured["go_out"].wall_s, ours_out.wall_s),
    }
    targets = {
        "stage_in_at_least_20x_stock": (ratios["stage_in_speedup_vs_stock"] or 0) >= 20,
        "stage_out_at_least_20x_stock": (ratios["stage_out_speedup_vs_stock"] or 0) >= 20,
        "one_ssh_handshake_per_batch": ours_in.connections == 1 and ours_out.connections == 1,
        "all_runs_exit_0": all(m.exit_code == 0 for m in measured.values()),
        "stage_in_files_identical": bool(runs["ours_in_identical"]) and bool(runs["stock_in_identical"])
        and bool(runs["go_in_identical"]),
    }
    return make_result(params, runs, ratios, targets, store="scp",
                       ssh_handshakes_per_batch={f"{m.tool} {m.direction}": m.connections for m in measured.values()})
