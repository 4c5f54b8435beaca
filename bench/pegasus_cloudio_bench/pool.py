"""One planned workflow on a real HTCondor pool: the stock ``pegasus-transfer`` against ours.

In one run: MinIO on loopback, a `CondorPool` (HTCondor 23 from Debian 13; two startds of two
slots), the real ``pegasus-plan`` 5.1.2 in the pool's root, cloud-storage S3 mode (the set
``pegasus-cloudio sites`` writes), the Montage-like workflow of ``examples/montage_like``
(``producers`` x ``files`` small files, producers clustered by ``cluster_size``, one concat
reading them all). The same set and workflow run four ways, one after another:

* ``stock``: ``pegasus::transfer``/``dirmanager``/``cleanup`` point at the tarball's
  ``pegasus-transfer`` (the Python tool Pegasus 5 ships: one ``pegasus-s3`` process per S3 file);
* ``go``: the same three point at Pegasus's Go ``pegasus-transfer`` (the stock tool to come; the
  static binary of :mod:`pegasus_cloudio_testbed.tools`, bound into the pool's root);
* ``ours per file``: our drop-in (wheel in a venv under the root's Python), one object per
  file, node cache off;
* ``ours bundles+cache``: as the generator writes the set (bundles, node cache);
* ``ours stager``: the same plus a node stager (`pegasus-cloudio stager`, as the jobs' user)
  that the jobs hand their staging to.

Per run: DAGMan's makespan (its log's first to last line), and the staging CPU per job: for
transfer jobs the CPU kickstart recorded for the tool; for compute jobs HTCondor's CPU for the
job (RemoteUserCpu + RemoteSysCpu) minus the task's own (kickstart), i.e. PegasusLite with its
staging calls; plus, for the stager run, the CPU the stager used (it is charged to the stager,
not to the jobs). The test pool's HTCondor 23 reports 0 CPU for its jobs (no cgroups there),
so on it the compute jobs' in-job staging counts 0 and the figure is the transfer jobs' and
the stager's CPU only (``compute_cpu_known`` says whether HTCondor reported any). Every run's
output is compared byte for byte with the expected concatenation.

``--throttle RATE`` (issue 37) puts every run's store behind the rate-limiting front
(:class:`~pegasus_cloudio_testbed.throttle.ThrottleFront`, S3's ``503 SlowDown``) at RATE
requests per second per prefix, a fresh front per run; each run then also reports the requests
the store saw, how many it throttled, the jobs DAGMan ran again and the jobs HTCondor held.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

from pegasus_cloudio_bench.harness import Progress, add_params_arguments, aligned, params_from_args, ratio
from pegasus_cloudio_testbed.condor_pool import CondorPool
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.pegasus import ensure_pegasus
from pegasus_cloudio_testbed.pegasus_pool import (
    DAGMAN_CONFIG,
    POOL_PACKAGES,
    DagRun,
    Invocation,
    PegasusOnPool,
    dagman_retries,
    held_jobs,
    invocations,
    stock_calls,
    worker_venv,
)
from pegasus_cloudio_testbed.pegasus_sets import (
    OUTPUT,
    add_montage_like,
    chown_tree,
    expected_concat,
    plan_argv,
    write_set,
)
from pegasus_cloudio_testbed.throttle import ThrottleFront
from pegasus_cloudio_testbed.tools import ensure_go_transfer
from pegasus_cloudio_testbed.wheel import build_wheel

CONFIGS = ("stock", "go", "ours per file", "ours bundles+cache", "ours stager")
TRANSFERS = ("pegasus::transfer", "pegasus::dirmanager", "pegasus::cleanup")


@dataclass(frozen=True)
class Params:
    producers: int = 6
    files: int = 40
    cluster_size: int = 2
    threads: int = 8
    configs: str = ",".join(CONFIGS)
    throttle: float = 0.0


HELPS = {"producers": "producer jobs", "files": "small files (~210 bytes) per producer",
         "cluster_size": "producers per clustered job", "threads": "PEGASUS_CLOUDIO_THREADS",
         "configs": "comma-separated configurations to run, in this order",
         "throttle": "requests/s per prefix the store allows (a rate-limiting front before MinIO; 0: none)"}
_COUNTS = ("producers", "files", "cluster_size", "threads")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_params_arguments(parser, Params(), HELPS)


def usage_problems(args: argparse.Namespace) -> List[str]:
    bad = [f"--{n.replace('_', '-')} must be at least 1" for n in _COUNTS if getattr(args, n) < 1]
    if not set(args.configs.split(",")) <= set(CONFIGS):
        bad.append(f"--configs must name only {', '.join(CONFIGS)} (got {args.configs!r})")
    if not args.throttle >= 0:
        bad.append(f"--throttle must be a rate >= 0 (0: no front), not {args.throttle}")
    return bad


def run_from_args(args: argparse.Namespace) -> Dict[str, Any]:
    return run(params_from_args(Params, args), Progress())


def run(params: Params, progress: Progress) -> Dict[str, Any]:
    """Every configuration once, in `CONFIGS` order; a dict for ``--json`` and `format_table`."""
    home = ensure_pegasus()
    configs = params.configs.split(",")
    go = ensure_go_transfer().resolve() if "go" in configs else None
    with tempfile.TemporaryDirectory(prefix="bench-pool-wheel-") as scratch:
        wheel = Path(build_wheel(scratch))
        with MinioServer() as minio, CondorPool(binds=[home, _pip_dir(), *([go.parent] if go else [])],
                                                packages=POOL_PACKAGES, config=DAGMAN_CONFIG) as pool:
            pegasus = PegasusOnPool(pool, home)
            venv_bin = worker_venv(pool, pool.user_dir("venv") / "v", wheel)
            runs = [_one(pegasus, minio, venv_bin, name, params, progress, go) for name in configs]
    return {"scenario": "pool", "params": asdict(params), "load": os.getloadavg(), "runs": runs,
            "ratios": _ratios(runs)}


def _ratios(runs: Sequence[Dict[str, Any]]) -> Dict[str, Optional[float]]:
    """Each other run's makespan against the stock tool's and the Go tool's (baseline / ours)."""
    found: Dict[str, Optional[float]] = {}
    for baseline in ("stock", "go"):
        base = next((r for r in runs if r["config"] == baseline), None)
        for r in runs:
            if base is not None and r["config"] not in ("stock", "go"):
                found[f"{r['config']}: {baseline} makespan / ours"] = ratio(base["makespan_s"], r["makespan_s"])
    return found


def _pip_dir() -> Path:
    import pip

    return Path(pip.__file__).resolve().parent


def _one(pegasus: PegasusOnPool, minio: MinioServer, venv_bin: Path, config: str, params: Params,
         progress: Progress, go: Optional[Path] = None) -> Dict[str, Any]:
    """One configuration's run, behind a fresh throttling front with ``--throttle``."""
    with _front(minio, params.throttle) as front:
        endpoint = front.endpoint if front is not None else minio.endpoint
        result = _configured(pegasus, minio, endpoint, venv_bin, config, params, progress, go)
        if front is not None:
            result.update(_throttled(front, Path(result["submit_dir"])))
    return result


@contextlib.contextmanager
def _front(minio: MinioServer, rate: float) -> Iterator[Optional[ThrottleFront]]:
    if rate <= 0:
        yield None
        return
    with ThrottleFront(minio.host, minio.port, rate=rate) as front:
        yield front


def _throttled(front: ThrottleFront, submit_dir: Path) -> Dict[str, Any]:
    """What the front counted, and the jobs run again (DAGMan retries) or held."""
    stats = front.stats()
    return {"store_requests": stats["requests"], "throttled": stats["throttled"],
            "job_retries": sum(runs - 1 for runs in dagman_retries(submit_dir).values()),
            "held_jobs": len(held_jobs(submit_dir))}


def _configured(pegasus: PegasusOnPool, minio: MinioServer, endpoint: str, venv_bin: Path, config: str,
                params: Params, progress: Progress, go: Optional[Path]) -> Dict[str, Any]:
    """Plan and run ``config``'s set, its jobs reaching the store at ``endpoint``."""
    pool = pegasus.pool
    progress.phase(f"pool: {config}")
    bucket = f"pool-{len(os.listdir(pool.shared))}-{int(time.time())}"
    _make_bucket(minio, bucket)
    run_dir = pool.user_dir(re.sub(r"[^a-z]+", "-", config))
    creds = run_dir / "credentials.conf"
    creds.write_text(f"[minio]\nendpoint = {endpoint}\n[bench@minio]\naccess_key = {minio.access_key}\n"
                     f"secret_key = {minio.secret_key}\n")
    os.chmod(creds, 0o600)
    set_dir = run_dir / "set"
    flags = ["--mode", "cloud-storage", "--provider", "s3", "--bucket", bucket, "--endpoint", endpoint,
             "--identity", "bench@minio", "--credentials", str(creds), "--install-bin", str(venv_bin),
             "--work-dir", str(set_dir), "--worker-pegasus-home", str(pegasus.home), "--threads",
             str(params.threads)]
    stager: Optional[_Stager] = None
    if config == "ours stager":
        stager = _Stager(pool, venv_bin, run_dir / "stager")
        flags += ["--stager", str(stager.socket)]
    if config == "ours per file":
        flags += ["--no-bundle", "--cache-dir", str(run_dir / "no-cache")]
    write_set(set_dir, flags)
    if config == "ours per file":
        _replace_in(set_dir / "sites.yml", str(run_dir / "no-cache"), "'off'")  # a string, not YAML false
    if config in ("stock", "go"):
        tool = go if config == "go" else pegasus.home / "bin" / "pegasus-transfer"
        _replace_in(set_dir / "transformations.yml", str(venv_bin / "pegasus-cloudio-transfer"), str(tool))
    add_montage_like(set_dir, params.producers, params.files, params.cluster_size)
    chown_tree(run_dir, pool.submitter_uid, pool.submitter_gid)
    try:
        if stager:
            stager.start()
        dag = pegasus.plan_and_run(set_dir, plan_argv(set_dir), timeout=3600)
        stager_cpu = stager.cpu_s() if stager else 0.0
    finally:
        if stager:
            stager.stop()
    progress.done()
    return _result(pegasus, config, set_dir, dag, stager_cpu, params)


def _result(pegasus: PegasusOnPool, config: str, set_dir: Path, dag: DagRun, stager_cpu: float,
            params: Params) -> Dict[str, Any]:
    records = invocations(dag.submit_dir)
    condor_cpu = _condor_cpu(pegasus.pool, dag.submit_dir)
    staging = _staging_cpu(records, condor_cpu)
    output = set_dir / "outputs" / OUTPUT
    exact = output.exists() and output.read_bytes() == expected_concat(set_dir, params.producers, params.files)
    jobs = len(staging)
    return {"config": config, "dagman_status": dag.status, "byte_exact": exact, "plan_s": round(dag.plan_s, 2),
            "makespan_s": round(dag.makespan_s, 2), "jobs": jobs,
            "staging_cpu_s": round(sum(staging.values()) + stager_cpu, 3), "stager_cpu_s": round(stager_cpu, 3),
            "staging_cpu_per_job_s": round((sum(staging.values()) + stager_cpu) / max(jobs, 1), 3),
            "stock_calls": len(stock_calls(records, pegasus.home / "bin" / "pegasus-transfer")),
            "compute_cpu_known": any(v > 0 for v in condor_cpu.values()),
            "submit_dir": str(dag.submit_dir)}


def _staging_cpu(records: Sequence[Invocation], condor_cpu: Mapping[str, float]) -> Dict[str, float]:
    """Per job: the transfer tool's CPU (transfer jobs), else the job's CPU outside its tasks."""
    by_job: Dict[str, List[Invocation]] = {}
    for record in records:
        by_job.setdefault(record.job, []).append(record)
    out = {}
    for job, mine in by_job.items():
        if all(r.transformation in TRANSFERS for r in mine):
            out[job] = sum(r.cpu_s for r in mine)
        else:
            tasks = sum(r.cpu_s for r in mine if r.transformation not in TRANSFERS)
            out[job] = max(condor_cpu.get(job, 0.0) - tasks, 0.0)
    return out


def _condor_cpu(pool: CondorPool, submit_dir: Path) -> Dict[str, float]:
    """HTCondor's CPU (user + system) of every node job of the DAG, by node name."""
    dagman_out = next(submit_dir.glob("*.dag.dagman.out")).read_text(errors="replace")
    found = re.search(r"condor_scheduniv_exec\.(\d+)\.", dagman_out)
    if not found:
        return {}
    done = pool.run(["condor_history", "-constraint", f"DAGManJobId == {found.group(1)}", "-af", "DAGNodeName",
                     "RemoteUserCpu", "RemoteSysCpu"], check=False)
    cpu: Dict[str, float] = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] != "undefined":
            cpu[parts[0]] = cpu.get(parts[0], 0.0) + _float(parts[1]) + _float(parts[2])
    return cpu


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def _replace_in(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if old not in text:
        raise RuntimeError(f"{path}: {old!r} not found")
    path.write_text(text.replace(old, new))


def _make_bucket(minio: MinioServer, bucket: str) -> None:
    from transfer import Engine, Mkdir, Session, parse_url

    env = {"PEGASUS_CREDENTIALS": "", "HOME": tempfile.gettempdir(), "PEGASUS_CLOUDIO_CONFIG": os.devnull}
    with tempfile.TemporaryDirectory() as tmp:
        env["PEGASUS_CREDENTIALS"] = str(minio.write_pegasus_credentials(Path(tmp) / "c.conf", site="minio",
                                                                         user="bench"))
        with Session(env=env) as session:
            [result] = Engine(session, threads=1).run([Mkdir(parse_url(f"s3://bench@minio/{bucket}"))])
    if not result.ok:
        raise RuntimeError(f"creating bucket {bucket}: {result.error}")


class _Stager:
    """`pegasus-cloudio stager` inside the pool's root as the jobs' user, in the background."""

    def __init__(self, pool: CondorPool, venv_bin: Path, directory: Path) -> None:
        self.pool, self.venv_bin, self.dir = pool, venv_bin, directory
        self.socket = directory / "stager.sock"
        self.process: Optional["subprocess.Popen[bytes]"] = None
        self._start_cpu = 0.0

    def start(self) -> None:
        self.dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.dir, 0o700)
        os.chown(self.dir, self.pool.submitter_uid, self.pool.submitter_gid)
        with open(self.dir / "stager.log", "wb") as log:
            self.process = self.pool.popen([str(self.venv_bin / "pegasus-cloudio"), "stager", "--socket",
                                            str(self.socket)], cwd=self.dir, stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"stager did not create {self.socket}: {(self.dir / 'stager.log').read_text()}")
            time.sleep(0.1)
        self._start_cpu = _proc_cpu(self.process.pid)

    def cpu_s(self) -> float:
        assert self.process is not None
        return _proc_cpu(self.process.pid) - self._start_cpu

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


def _proc_cpu(pid: int) -> float:
    """utime + stime of ``pid`` and its reaped children, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ticks / os.sysconf("SC_CLK_TCK")


def format_table(result: Dict[str, Any]) -> str:
    header = ["config", "DAGMan", "exact", "makespan s", "jobs", "staging CPU s", "per job s", "stock calls"]
    body = [[r["config"], str(r["dagman_status"]), "yes" if r["byte_exact"] else "NO", f"{r['makespan_s']:.1f}",
             str(r["jobs"]), f"{r['staging_cpu_s']:.2f}", f"{r['staging_cpu_per_job_s']:.3f}", str(r["stock_calls"])]
            for r in result["runs"]]
    rows = aligned([header] + body)
    if result["params"].get("throttle"):
        rows += ["", f"behind a front allowing {result['params']['throttle']:g} requests/s per prefix:"]
        rows += aligned([["config", "store requests", "throttled", "job retries", "held jobs"]] + [
            [r["config"], str(r["store_requests"]), str(r["throttled"]), str(r["job_retries"]), str(r["held_jobs"])]
            for r in result["runs"]])
    rows.append("")
    rows += [f"{name}: {value:.2f}x" if value else f"{name}: n/a" for name, value in result["ratios"].items()]
    params = result["params"]
    rows.append(f"workflow: {params['producers']} producers x {params['files']} files, clustered by "
                f"{params['cluster_size']}, one concat; load {result['load'][0]:.1f}")
    return "\n".join(rows)
