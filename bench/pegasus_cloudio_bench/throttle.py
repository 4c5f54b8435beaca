"""A pool's worth of staging jobs on one prefix of a store that throttles (issue 37).

In one run: MinIO on loopback behind a `ThrottleFront` that lets ``--rate`` requests per second
per prefix through (token bucket of ``--burst``) and answers the rest ``503 SlowDown``. For each
N of ``--jobs``, N jobs are released together, each staging in ``--files`` small objects of one
prefix (``bench/data/``): ``distinct`` objects (job j reads ``data/jJJJ/``) or ``shared`` ones
(every job reads ``data/shared/``). Side by side: our drop-in (``pegasus-cloudio-transfer`` as a
wheel installs it) with the node stager off and on, and plain, through bundles, or with a node
cache shared by the N jobs (``--reuse``); s5cmd (``run`` of one ``cp`` per file, its defaults);
the stock ``pegasus-transfer``. Every run has a fresh front, so each starts with a full bucket.

Per run: jobs failed (non-zero exit or a file missing or wrong), files missing, wall time
(first start to last exit) against the floor N*M/R, goodput/R (files delivered per second over
R), the share of requests answered 503, the slowest job, the requests that reached the front
and those it passed to the store (``served``): what bundles and the node cache save.
``--nodes K`` spreads each wave's jobs over K worker nodes in network namespaces sharing one
Redis pool limiter (`pegasus_cloudio_bench.throttle_nodes`); ``offered/R`` then says what the
store saw of the whole pool: requests that reached the front per second over R.
``--direction out`` runs stage-outs instead: each job uploads its ``--files`` local files to its
own directory under one prefix (``bench/out/``; the pipelined PUT pass of ours), and the objects
are then read back straight from MinIO and checked byte for byte.
``--model`` runs the simulation of `pegasus_cloudio_bench.throttle_model` instead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple

from pegasus_cloudio_bench.harness import Progress, add_params_arguments, aligned, params_from_args, tool_env
from pegasus_cloudio_bench.throttle_jobs import Job, Wave, count_missing, run_wave
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.stager import StagerProcess
from pegasus_cloudio_testbed.stock import make_stock_home
from pegasus_cloudio_testbed.throttle import ThrottleFront
from pegasus_cloudio_testbed.tools import ensure_s5cmd
from pegasus_cloudio_testbed.wheel import installed_bin

if TYPE_CHECKING:
    from pegasus_cloudio_bench.throttle_nodes import Nodes

BUCKET, SITE = "bench", "minio"
TOOLS, OBJECTS, STAGER, REUSE = ("ours", "s5cmd", "stock"), ("distinct", "shared"), ("off", "on"), \
    ("plain", "bundles", "cache")


@dataclass(frozen=True)
class Params:
    jobs: str = "10,50,100,200"
    files: int = 200
    size: int = 300
    rate: float = 200.0
    burst: float = 200.0
    retry_after: float = 0.0
    tools: str = ",".join(TOOLS)
    objects: str = ",".join(OBJECTS)
    stager: str = "off"
    reuse: str = "plain"
    timeout: float = 0.0
    checkout: str = ""
    nodes: int = 0
    pool_share: float = 0.9
    direction: str = "in"
    model: bool = False
    trace: str = ""


HELPS = {"jobs": "comma-separated job counts N, each released together",
         "files": "objects M each job stages in", "size": "bytes per object",
         "rate": "requests per second per prefix the front lets through (R)",
         "burst": "token bucket size of the front", "retry_after": "seconds of Retry-After in its 503s (0: none)",
         "tools": f"comma-separated tools among {', '.join(TOOLS)}",
         "objects": f"comma-separated object sets among {', '.join(OBJECTS)}",
         "stager": "node stager for ours: off, on or off,on",
         "reuse": f"comma-separated ways ours reads, among {', '.join(REUSE)}",
         "timeout": "seconds before a wave's stragglers are killed (0: 10 x the floor + 120)",
         "checkout": "measure ours from a wheel of this source checkout (e.g. main's worktree) instead",
         "nodes": "0: every job on this machine; K (1-8): the jobs spread over K nodes in network namespaces, "
                  "each with its own node rate file, sharing one Redis pool limiter (needs root; ours only)",
         "pool_share": "with --nodes: the pool limiter's cap, as a share of R",
         "direction": "in: stage-ins; out: stage-outs (uploads of distinct objects; ours and s5cmd, plain)",
         "model": "run the simulation to 1,000 and 10,000 jobs instead (see docs/scale.md)",
         "trace": "a directory: each run of ours writes its jobs' pacing events (PEGASUS_CLOUDIO_PACE_TRACE) and "
                  "the front's arrivals to DIR/RUN/ (read them with scripts/pace_trace.py)"}
_CHOICES = {"tools": TOOLS, "objects": OBJECTS, "stager": STAGER, "reuse": REUSE}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_params_arguments(parser, Params(), HELPS)
    parser.add_argument("--measured", default=None,
                        help="with --model: a `bench throttle --json` result to calibrate on and compare with")


def usage_problems(args: argparse.Namespace) -> List[str]:
    bad = [f"--{name} must name only {', '.join(allowed)} (got {getattr(args, name)!r})"
           for name, allowed in _CHOICES.items() if not set(getattr(args, name).split(",")) <= set(allowed)]
    try:
        counts = [int(n) for n in args.jobs.split(",")]
        bad += [] if min(counts) >= 1 else ["--jobs counts must be at least 1"]
    except ValueError:
        bad.append(f"--jobs must be comma-separated whole numbers (got {args.jobs!r})")
    bad += [f"--{n} must be positive" for n in ("files", "size", "rate") if getattr(args, n) <= 0]
    bad += ["--burst must be at least 1"] if args.burst < 1 else []
    bad += ["--measured needs --model"] if args.measured and not args.model else []
    bad += ["--nodes must be 0 (none) or 1 to 8"] if not 0 <= args.nodes <= 8 else []
    bad += ["--nodes needs --tools ours"] if args.nodes and args.tools != "ours" else []
    bad += ["--pool-share must be above 0 and at most 1"] if not 0 < args.pool_share <= 1 else []
    bad += [] if args.direction in ("in", "out") else [f"--direction must be in or out (got {args.direction!r})"]
    if args.direction == "out" and (args.objects != "distinct" or args.reuse != "plain" or "stock" in args.tools
                                    or args.stager != "off"):
        bad.append("--direction out needs --objects distinct, --reuse plain, --stager off and --tools ours and/or s5cmd")
    return bad


def run_from_args(args: argparse.Namespace) -> Dict[str, Any]:
    params = params_from_args(Params, args)
    if params.model:
        from pegasus_cloudio_bench import throttle_model

        measured = None
        if args.measured:
            with open(args.measured, encoding="utf-8") as fh:
                measured = json.load(fh)
        return throttle_model.run(measured)
    return run(params, Progress())


def run(params: Params, progress: Progress) -> Dict[str, Any]:
    """Every configuration the params name; a dict for ``--json`` and `format_table`."""
    root = tempfile.mkdtemp(prefix="bench-throttle-")
    try:
        with MinioServer() as server, _nodes(root, params) as nodes:
            bed = Bed(root, params, server, progress, nodes)
            runs = [bed.measure(config, progress) for config in configurations(params)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    progress.done()
    return {"scenario": "throttle", "params": asdict(params), "load": os.getloadavg(), "runs": runs}


def _nodes(root: str, params: Params) -> Any:
    """The worker nodes of ``--nodes``, or nothing to enter."""
    if not params.nodes:
        import contextlib
        return contextlib.nullcontext(None)
    from pegasus_cloudio_bench.throttle_nodes import Nodes
    return Nodes(root, params.nodes, params.rate, params.pool_share)


@dataclass(frozen=True)
class Config:
    jobs: int
    objects: str
    tool: str
    stager: bool = False
    reuse: str = "plain"

    @property
    def name(self) -> str:
        extra = [self.reuse] if self.reuse != "plain" else []
        extra += ["stager"] if self.stager else []
        return self.tool + (f" ({', '.join(extra)})" if extra else "")


def configurations(params: Params) -> Iterator[Config]:
    """N, then object set, then tool; ours once per stager setting and way of reading."""
    for jobs in (int(n) for n in params.jobs.split(",")):
        for objects in params.objects.split(","):
            for tool in params.tools.split(","):
                if tool != "ours":
                    yield Config(jobs, objects, tool)
                    continue
                for stager in params.stager.split(","):
                    for reuse in params.reuse.split(","):
                        yield Config(jobs, objects, tool, stager == "on", reuse)


class Bed:
    """The objects in MinIO, their local originals and the commands of each tool."""

    def __init__(self, root: str, params: Params, server: MinioServer, progress: Progress,
                 nodes: Optional[Nodes] = None) -> None:
        self.root, self.params, self.server, self.nodes = root, params, server, nodes
        progress.phase("installing our wheel")
        self.bin = installed_bin(os.path.join(root, "wheel"), params.checkout or None)
        tools = params.tools.split(",")
        self.s5cmd = str(ensure_s5cmd()) if "s5cmd" in tools else ""
        self.stock = make_stock_home(os.path.join(root, "stock")) if "stock" in tools else None
        self.src = os.path.join(root, "src")
        self._readback: Dict[int, Dict[str, str]] = {}  # stage-out: job -> {object URL: original}
        self._upload(progress)

    def _dirs(self) -> List[str]:
        most = max(int(n) for n in self.params.jobs.split(","))
        objects = self.params.objects.split(",")
        return (["shared"] if "shared" in objects else []) \
            + ([f"j{j:04d}" for j in range(most)] if "distinct" in objects else [])

    def _upload(self, progress: Progress) -> None:
        """The originals on disk, then in MinIO straight (not through a front): plain under
        ``data/``, and bundled under ``bundled/`` when a run reads bundles (for stage-in waves;
        stage-out waves make only the bucket)."""
        names = self.names()
        pairs: List[Tuple[str, str]] = []
        for directory in self._dirs():
            os.makedirs(os.path.join(self.src, directory))
            for name in names:
                path = os.path.join(self.src, directory, name)
                with open(path, "wb") as fh:
                    fh.write(os.urandom(self.params.size))
                pairs.append((f"file://{path}", f"{directory}/{name}"))
        env = self.env(self.server.endpoint, {"PEGASUS_CLOUDIO_THREADS": "16"})
        make = [{"type": "mkdir", "target": {"site_label": SITE, "url": f"s3://bench@{SITE}/{BUCKET}"}}]
        if self.params.direction == "out":  # the waves upload them
            self._stage_out(make, env)
            return
        progress.phase(f"uploading {len(pairs)} objects")
        self._stage_out(make + _spec([(s, self.url("data", k)) for s, k in pairs], "local", SITE), env)
        if "bundles" in self.params.reuse.split(","):
            bundled = dict(env, PEGASUS_CLOUDIO_BUNDLE="1")
            self._stage_out(_spec([(s, self.url("bundled", k)) for s, k in pairs], "local", SITE), bundled)

    def _stage_out(self, spec: List[Dict[str, Any]], env: Dict[str, str]) -> None:
        wave = run_wave([Job([os.path.join(self.bin, "pegasus-cloudio-transfer")], json.dumps(spec).encode(),
                             env, {})], timeout_s=1800)
        if wave.failed:
            raise RuntimeError(f"bench throttle: uploading the objects failed: {wave.jobs[0].stderr_tail}")

    def names(self) -> List[str]:
        return [f"f{i:05d}.dat" for i in range(self.params.files)]

    def url(self, top: str, key: str) -> str:
        return f"s3://bench@{SITE}/{BUCKET}/{top}/{key}"

    def env(self, endpoint: str, extra: Dict[str, str]) -> Dict[str, str]:
        creds = os.path.join(self.root, f"credentials-{endpoint.rsplit(':', 1)[1]}.conf")
        if not os.path.exists(creds):
            self.server.write_pegasus_credentials(creds, site=SITE, user="bench", endpoint=endpoint)
        return tool_env({"PEGASUS_CREDENTIALS": creds, "PEGASUS_CLOUDIO_CONFIG": os.devnull,
                         "HOME": self.root, "AWS_EC2_METADATA_DISABLED": "true", **extra})

    def measure(self, config: Config, progress: Progress) -> Dict[str, Any]:
        """One wave of ``config.jobs`` jobs through a fresh front; its figures."""
        p = self.params
        floor = config.jobs * p.files / p.rate
        progress.phase(f"N={config.jobs} {config.objects}: {config.name} (floor {floor:.0f} s)")
        host = self.nodes.host if self.nodes is not None else "127.0.0.1"
        if self.nodes is not None:
            self.nodes.new_run()
        traced = self._trace_dir(config)
        with ThrottleFront(self.server.host, self.server.port, rate=p.rate, burst=p.burst,
                           retry_after=p.retry_after or None, host=host, trace=bool(traced)) as front:
            with self._stager(config, front) as stager_env:
                extra = dict(stager_env, PEGASUS_CLOUDIO_PACE_TRACE=traced) if traced else stager_env
                jobs = [self._job(config, front, j, extra) for j in range(config.jobs)]
                wave = run_wave(jobs, p.timeout or 10 * floor + 120)
            stats = front.stats()
            if traced:
                _write_arrivals(os.path.join(traced, "front.trace"), front.arrivals())
        if p.direction == "out":
            progress.phase(f"N={config.jobs}: reading the uploads back")
            wave = self._checked_uploads(config, wave)
        shutil.rmtree(self._run_dir(config), ignore_errors=True)  # checked; N x M files need not pile up
        pool = self.nodes.figures() if self.nodes is not None else {}
        return {**figures(config, p, floor, wave, stats), **pool}

    def _trace_dir(self, config: Config) -> str:
        """Where ``--trace`` puts this run's traces ("" without it, or for a tool not ours)."""
        if not self.params.trace or config.tool != "ours":
            return ""
        path = os.path.join(self.params.trace, f"{config.jobs}-{config.objects}-{config.name}".replace(" ", "_"))
        os.makedirs(path, exist_ok=True)
        return path

    def _run_dir(self, config: Config) -> str:
        return os.path.join(self.root, "runs", f"{config.jobs}-{config.objects}-{config.name}")

    def _checked_uploads(self, config: Config, wave: Wave) -> Wave:
        """``wave`` with each job's objects that are missing or wrong in the store (read back
        straight from MinIO by our drop-in, then compared byte for byte) counted as missing."""
        back = os.path.join(self._run_dir(config), "readback")
        expected: Dict[int, Dict[str, str]] = {}
        pairs: List[Tuple[str, str]] = []
        for j, objects in self._readback.items():
            expected[j] = {}
            for n, (url, original) in enumerate(sorted(objects.items())):
                dest = os.path.join(back, str(j), f"{n:05d}")
                expected[j][dest] = original
                pairs.append((url, f"file://{dest}"))
            os.makedirs(os.path.join(back, str(j)))
        env = self.env(self.server.endpoint, {"PEGASUS_CLOUDIO_THREADS": "16", "PEGASUS_CLOUDIO_CACHE_DIR": "off"})
        run_wave([Job([os.path.join(self.bin, "pegasus-cloudio-transfer")], json.dumps(_spec(pairs, SITE, "local"))
                      .encode(), env, {})], timeout_s=1800)  # (what it could not read counts as missing below)
        self._readback = {}
        return Wave(wave.wall_s, [replace(job, missing=count_missing(expected.get(j, {})))
                                  for j, job in enumerate(wave.jobs)])

    def _stager(self, config: Config, front: ThrottleFront) -> "_StagerScope":
        return _StagerScope(self, config, front)

    def _job(self, config: Config, front: ThrottleFront, j: int, extra: Dict[str, str]) -> Job:
        directory = "shared" if config.objects == "shared" else f"j{j:04d}"
        dest = os.path.join(self._run_dir(config), str(j))
        os.makedirs(dest)
        if self.params.direction == "out":
            return self._upload_job(config, front, j, dest, extra)
        expected = {os.path.join(dest, n): os.path.join(self.src, directory, n) for n in self.names()}
        if config.tool == "s5cmd":
            return self._s5cmd_job(front, directory, dest, expected)
        top = "bundled" if config.reuse == "bundles" else "data"
        pairs = [(self.url(top, f"{directory}/{n}"), f"file://{d}") for d, n in zip(expected, self.names())]
        stdin = json.dumps(_spec(pairs, SITE, "local")).encode()
        if config.tool == "stock":
            assert self.stock is not None
            return Job([str(self.stock.transfer)], stdin, self.stock.env(self.env(front.endpoint, {})), expected)
        argv, env = [os.path.join(self.bin, "pegasus-cloudio-transfer")], self._ours_env(config, front, extra)
        if self.nodes is not None:
            argv, more = self.nodes.job(j, argv)
            env.update(more)
        return Job(argv, stdin, env, expected, cwd=dest)

    def _upload_job(self, config: Config, front: ThrottleFront, j: int, cwd: str, extra: Dict[str, str]) -> Job:
        """Job ``j`` of a stage-out wave: its originals to ``out/RUN/jJJJ/`` (RUN: this wave's own)."""
        directory = f"j{j:04d}"
        run = f"{config.jobs}-{config.tool}"
        pairs = [(os.path.join(self.src, directory, n), self.url("out", f"{run}/{directory}/{n}")) for n in self.names()]
        self._readback[j] = dict((url, path) for path, url in pairs)
        if config.tool == "s5cmd":
            commands = cwd + ".s5cmd"
            with open(commands, "w", encoding="utf-8") as fh:
                for path, n in zip((p for p, _ in pairs), self.names()):
                    fh.write(f"cp {path} s3://{BUCKET}/out/{run}/{directory}/{n}\n")
            return Job([self.s5cmd, "--endpoint-url", front.endpoint, "run", commands], b"", self._s5cmd_env(), {})
        stdin = json.dumps(_spec([(f"file://{p}", u) for p, u in pairs], "local", SITE)).encode()
        argv, env = [os.path.join(self.bin, "pegasus-cloudio-transfer")], self._ours_env(config, front, extra)
        if self.nodes is not None:
            argv, more = self.nodes.job(j, argv)
            env.update(more)
        return Job(argv, stdin, env, {}, cwd=cwd)

    def _s5cmd_env(self) -> Dict[str, str]:
        return tool_env({"AWS_ACCESS_KEY_ID": self.server.access_key, "AWS_EC2_METADATA_DISABLED": "true",
                         "AWS_SECRET_ACCESS_KEY": self.server.secret_key, "AWS_REGION": "us-east-1"})

    def _ours_env(self, config: Config, front: ThrottleFront, extra: Dict[str, str]) -> Dict[str, str]:
        # the wave's own node rate file: a wave must not start paced by the last one's state, nor by
        # another run's on this machine (the file is per user, and the key names the site, not the port)
        runtime = os.path.join(self._run_dir(config), "runtime")
        os.makedirs(runtime, mode=0o700, exist_ok=True)
        more = {"XDG_RUNTIME_DIR": runtime, **extra}
        if config.reuse == "bundles":
            more["PEGASUS_CLOUDIO_BUNDLE"] = "1"
        if config.reuse == "cache":
            more["PEGASUS_CLOUDIO_CACHE_DIR"] = os.path.join(self.root, "cache", f"{config.jobs}-{config.objects}")
        return self.env(front.endpoint, more)

    def _s5cmd_job(self, front: ThrottleFront, directory: str, dest: str, expected: Dict[str, str]) -> Job:
        commands = os.path.join(dest + ".s5cmd")
        with open(commands, "w", encoding="utf-8") as fh:
            for path, name in zip(expected, self.names()):
                fh.write(f"cp s3://{BUCKET}/data/{directory}/{name} {path}\n")
        return Job([self.s5cmd, "--endpoint-url", front.endpoint, "run", commands], b"", self._s5cmd_env(), expected)


class _StagerScope:
    """A node stager for the wave when the configuration runs one: the jobs' extra environment."""

    def __init__(self, bed: Bed, config: Config, front: ThrottleFront) -> None:
        self._bed, self._config, self._front = bed, config, front
        self._stager: Optional[StagerProcess] = None

    def __enter__(self) -> Dict[str, str]:
        if not self._config.stager:
            return {}
        env = self._bed._ours_env(self._config, self._front, {})
        self._stager = StagerProcess(env, [os.path.join(self._bed.bin, "pegasus-cloudio")]).start()
        return {"PEGASUS_CLOUDIO_STAGER": self._stager.socket_path}

    def __exit__(self, *exc: object) -> None:
        if self._stager is not None:
            self._stager.stop()


def _write_arrivals(path: str, arrivals: List[Tuple[float, bool]]) -> None:
    """The front's side of a trace: ``arrive T PASSED`` per request (scripts/pace_trace.py)."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(f"arrive {t:.6f} {int(ok)}\n" for t, ok in arrivals)


def _spec(pairs: List[Tuple[str, str]], src_label: str, dst_label: str) -> List[Dict[str, Any]]:
    return [{"type": "transfer", "lfn": os.path.basename(dst), "id": i,
             "src_urls": [{"site_label": src_label, "url": src}],
             "dest_urls": [{"site_label": dst_label, "url": dst}]} for i, (src, dst) in enumerate(pairs)]


def figures(config: Config, params: Params, floor: float, wave: Wave, stats: Dict[str, Any]) -> Dict[str, Any]:
    """What issue 37 asks of a run, as one flat dict."""
    files = config.jobs * params.files
    requests, throttled = int(stats["requests"]), int(stats["throttled"])
    errors = [_cause(job.stderr_tail) for job in wave.jobs if (job.exit_code or job.missing) and job.stderr_tail.strip()]
    return {"name": config.name, **asdict(config), "files": params.files, "rate": params.rate,
            "jobs_failed": wave.failed, "files_missing": wave.missing, "wall_s": round(wave.wall_s, 2),
            "floor_s": round(floor, 2), "wall_over_floor": round(wave.wall_s / floor, 3),
            "goodput_over_rate": round((files - wave.missing) / wave.wall_s / params.rate, 3),
            "offered_over_rate": round(requests / wave.wall_s / params.rate, 3),
            "share_503": round(throttled / requests, 3) if requests else 0.0,
            "slowest_job_s": round(wave.slowest_s, 2), "requests": requests, "throttled": throttled,
            "served": requests - throttled,
            "requests_per_file": round(requests / files, 3), "first_error": errors[0][:200] if errors else "",
            "throttled_first_20s": sum(stats.get("throttled_by_second", [])[:20]),
            "throttled_by_second": stats.get("throttled_by_second", [])}


def _cause(stderr: str) -> str:
    """The first line that names a failure, rather than the closing summary."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    telling = [line for line in lines if any(w in line for w in ("SlowDown", "503", "429", "rror", "failed after"))
               and "Some transfers failed" not in line]
    return (telling or lines or [""])[0].strip()


COLUMNS = (("N", "jobs", "d"), ("objects", "objects", "s"), ("failed", "jobs_failed", "d"),
           ("missing", "files_missing", "d"), ("wall s", "wall_s", ".1f"), ("floor s", "floor_s", ".1f"),
           ("wall/floor", "wall_over_floor", ".2f"), ("goodput/R", "goodput_over_rate", ".2f"),
           ("offered/R", "offered_over_rate", ".2f"),
           ("503 share", "share_503", ".2f"), ("503s 0-20 s", "throttled_first_20s", "d"), ("slowest s", "slowest_job_s", ".1f"),
           ("requests", "requests", "d"), ("served", "served", "d"), ("req/file", "requests_per_file", ".2f"))


def format_table(result: Dict[str, Any]) -> str:
    if result.get("scenario") == "throttle-model":
        from pegasus_cloudio_bench import throttle_model

        return throttle_model.format_table(result)
    p = result["params"]
    rows = [[run["name"]] + [format(run[key], spec) for _, key, spec in COLUMNS] for run in result["runs"]]
    lines = aligned([["run"] + [name for name, _, _ in COLUMNS]] + rows, left=3)
    lines.append(f"R = {p['rate']:g} requests/s per prefix, burst {p['burst']:g}, M = {p['files']} objects of "
                 f"{p['size']} B per job, stage-{p.get('direction', 'in')}; load average at the end {', '.join(f'{x:.1f}' for x in result['load'])}")
    lines += [f"{run['name']} at N={run['jobs']} {run['objects']}: {run['nodes']} nodes, pool limiter capped at "
              f"{p['pool_share']:g} x R, {run['pool_keys']} prefix(es) on its Redis, {run['node_rate_files']} node "
              f"rate file(s) used" for run in result["runs"] if "nodes" in run]
    lines += [f"first error of {run['name']} at N={run['jobs']} {run['objects']}: {run['first_error']}"
              for run in result["runs"] if run["first_error"]]
    return "\n".join(lines)
