"""Node cache: Broadband-like input reuse by many jobs on one node, with and without the cache.

In one run, on an embedded MinIO behind a counting proxy on loopback:

* reuse: ``sources x sites`` jobs (separate processes, ``--parallel`` at a time, as slots on
  one node) each read the shared inputs (velocity models), their source's files and their
  site's files - the overlap of Broadband's 6-source x 8-site workflow in the seed paper -
  once straight from the store and once through a fresh node cache: origin requests,
  bytes from the store and wall time. Every job's files are checked against the originals;
* single flight: ``--concurrent`` processes released together fetch one object through
  the cache: the store must see exactly one GET;
* the seed's cache-daemon table: put (write-through of a local file) and get (a cache hit
  materialised into a job directory) latency for 0, 1, 10 and 100 MB files, by hard link,
  symlink and copy, median of ``--repeats`` (plus a get that misses, from MinIO, and a
  hard-link get with the SHA-256 re-check of small entries switched off: the check's cost).

Job processes are forked from one launcher after its imports (see
:mod:`pegasus_cloudio_bench.cache_jobs`), so interpreter start-up is not in the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from pegasus_cloudio_bench.harness import Progress, add_params_arguments, params_from_args, tool_env
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import TcpProxy
from transfer import lean
from transfer.backends.base import namespace, uploads
from transfer.cache import CacheConfig, NodeCache
from transfer.session import Session
from transfer.urls import parse_url

BUCKET = "bench-cache"
SITE = "minio"
MB = 1_000_000
MiB = 1 << 20
TARGET_HARDLINK_GET_MS = 5.0


@dataclass(frozen=True)
class Params:
    sources: int = 6
    sites: int = 8
    shared_files: int = 4
    shared_mib: float = 4.0
    source_files: int = 2
    source_mib: float = 2.0
    site_files: int = 2
    site_mib: float = 0.5
    parallel: int = 4
    concurrent: int = 32
    concurrent_mib: float = 64.0
    repeats: int = 5
    latency_mb: str = "0,1,10,100"
    rtt_ms: float = 0.0

    @property
    def latency_sizes(self) -> List[float]:
        """Sizes in MB; fractions allowed (``0.001`` is 1 KB)."""
        return [float(size) for size in self.latency_mb.split(",") if size.strip()]


_HELP = {
    "sources": "Broadband sources (scenario earthquakes)",
    "sites": "Broadband sites (stations); one job per source and site",
    "shared_files": "inputs every job reads (velocity models)",
    "shared_mib": "MiB per shared input",
    "source_files": "inputs per source",
    "source_mib": "MiB per source input",
    "site_files": "inputs per site",
    "site_mib": "MiB per site input",
    "parallel": "jobs running at once on the node",
    "concurrent": "processes fetching one object together (single flight)",
    "concurrent_mib": "MiB of that object",
    "repeats": "repetitions per latency figure (median reported)",
    "latency_mb": "comma-separated file sizes, in MB, of the latency table",
    "rtt_ms": "emulated round trip added by the proxy",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_params_arguments(parser, Params(), _HELP)


def run_from_args(args: argparse.Namespace) -> Dict[str, object]:
    return run(params_from_args(Params, args), Progress())


def run(params: Params, progress: Progress) -> Dict[str, object]:
    root = tempfile.mkdtemp(prefix="pegasus-cloudio-bench-cache-")
    try:
        with MinioServer() as server, TcpProxy((server.host, server.port),
                                               delay_ms=params.rtt_ms / 2) as proxy:
            creds = server.write_pegasus_credentials(os.path.join(root, "credentials.conf"), site=SITE,
                                                     user="bench", endpoint=proxy.url())
            bench = _Bench(root, params, proxy, tool_env({"PEGASUS_CREDENTIALS": str(creds),
                                                          "PEGASUS_CLOUDIO_CONFIG": os.devnull}))
            try:
                result = bench.run_all(progress)
            finally:
                bench.close()
    finally:
        progress.done()
        shutil.rmtree(root, ignore_errors=True)
    return result


class _Bench:
    """Objects in the store, job directories and caches under one temporary root."""

    def __init__(self, root: str, params: Params, proxy: TcpProxy, env: Dict[str, str]) -> None:
        self.root, self.params, self.proxy, self.env = root, params, proxy, env
        self.session = Session(env=env)
        self.digests: Dict[str, str] = {}

    def close(self) -> None:
        self.session.close()

    def url(self, name: str) -> str:
        return f"s3://bench@{SITE}/{BUCKET}/{name}"

    def upload(self, name: str, size: int) -> str:
        path = os.path.join(self.root, "upload.tmp")
        data = os.urandom(size)
        with open(path, "wb") as fh:
            fh.write(data)
        url = parse_url(self.url(name), env=self.env)
        uploads(self.session.backend(url), url, "put").put(path, url)
        self.digests[self.url(name)] = hashlib.sha256(data).hexdigest()
        return self.url(name)

    def cache_config(self, name: str, **changes: Any) -> CacheConfig:
        fields: Dict[str, Any] = {"directory": os.path.join(self.root, name), "max_bytes": 8 << 30,
                                  "min_free_bytes": 0}
        fields.update(changes)
        return CacheConfig(**fields)

    def run_all(self, progress: Progress) -> Dict[str, object]:
        progress.phase("uploading inputs")
        bucket = parse_url(self.url(""), env=self.env)
        namespace(self.session.backend(bucket), bucket, "mkdir").make_dirs(bucket)
        jobs = self._broadband_inputs()
        reuse = [self._reuse(jobs, cached, progress) for cached in (False, True)]
        single = self._single_flight(progress)
        latency = self._latency(progress)
        return _report(self.params, reuse, single, latency)

    # -- reuse -------------------------------------------------------------------------

    def _broadband_inputs(self) -> List[List[str]]:
        """The input URLs of each (source, site) job."""
        p = self.params

        def files(prefix: str, count: int, mib: float) -> List[str]:
            return [self.upload(f"{prefix}-{i}.dat", int(mib * MiB)) for i in range(count)]

        shared = files("velocity-model", p.shared_files, p.shared_mib)
        sources = [files(f"source{s}/rupture", p.source_files, p.source_mib) for s in range(p.sources)]
        sites = [files(f"site{s}/station", p.site_files, p.site_mib) for s in range(p.sites)]
        return [shared + sources[a] + sites[b] for a in range(p.sources) for b in range(p.sites)]

    def _reuse(self, inputs: List[List[str]], cached: bool, progress: Progress) -> Dict[str, Any]:
        label = "with the cache" if cached else "without a cache"
        progress.phase(f"reuse: {len(inputs)} jobs, {self.params.parallel} at a time, {label}")
        base = os.path.join(self.root, "jobs-cached" if cached else "jobs-plain")
        jobs = [[{"url": url, "key": url, "dest": os.path.join(base, f"job{j}", url.rsplit("/", 1)[1])}
                 for url in urls] for j, urls in enumerate(inputs)]
        config = self.cache_config("cache-reuse") if cached else None
        outcome = self._jobs(jobs, config, self.params.parallel)
        identical = all(_sha(item["dest"]) == self.digests[item["url"]] for job in jobs for item in job)
        fetches = [f for job in outcome["jobs"] for f in job["fetches"]]
        shutil.rmtree(base, ignore_errors=True)
        return {"mode": label, "jobs": len(jobs), "files": len(fetches),
                "unique_objects": len({url for urls in inputs for url in urls}),
                "hits": sum(1 for f in fetches if f["hit"]), **outcome["proxy"],
                "wall_s": round(outcome["wall_s"], 3), "files_identical": identical}

    def _jobs(self, jobs: List[List[Dict[str, Any]]], config: Optional[CacheConfig],
              parallel: int) -> Dict[str, Any]:
        plan = {"env": self.env, "cache": lean.asdict(config) if config else None,
                "jobs": jobs, "parallel": parallel}
        self.proxy.reset_counters()
        done = subprocess.run([sys.executable, "-m", "pegasus_cloudio_bench.cache_jobs"],
                              input=json.dumps(plan), capture_output=True, text=True, check=False)
        if not done.stdout:
            raise RuntimeError(f"cache jobs failed: {done.stderr[-2000:]}")
        outcome: Dict[str, Any] = json.loads(done.stdout)
        errors = [job["error"] for job in outcome["jobs"] if job["error"]]
        if errors:
            raise RuntimeError(f"{len(errors)} cache jobs failed, e.g. {errors[0]}")
        counters = self.proxy.snapshot()
        outcome["proxy"] = {"origin_requests": int(counters["requests_by_method"].get("GET", 0)),
                            "origin_bytes": int(counters["bytes_down"])}
        return outcome

    # -- single flight -----------------------------------------------------------------

    def _single_flight(self, progress: Progress) -> Dict[str, Any]:
        n = self.params.concurrent
        progress.phase(f"single flight: {n} processes, one {self.params.concurrent_mib:g} MiB object")
        url = self.upload("single-flight.dat", int(self.params.concurrent_mib * MiB))
        base = os.path.join(self.root, "jobs-single")
        jobs = [[{"url": url, "key": url, "dest": os.path.join(base, f"job{i}", "input.dat")}]
                for i in range(n)]
        outcome = self._jobs(jobs, self.cache_config("cache-single"), n)
        identical = all(_sha(job[0]["dest"]) == self.digests[url] for job in jobs)
        shutil.rmtree(base, ignore_errors=True)
        hits = sum(1 for job in outcome["jobs"] for f in job["fetches"] if f["hit"])
        return {"processes": n, "object_bytes": int(self.params.concurrent_mib * MiB), "hits": hits,
                **outcome["proxy"], "wall_s": round(outcome["wall_s"], 3), "files_identical": identical}

    # -- latency table -----------------------------------------------------------------

    def _latency(self, progress: Progress) -> List[Dict[str, Any]]:
        rows: List[Dict[str, Any]] = []
        for size_mb in self.params.latency_sizes:
            progress.phase(f"latency: {size_mb} MB")
            rows.append(self._latency_row(size_mb))
        return rows

    def _latency_row(self, size_mb: float) -> Dict[str, Any]:
        size = int(size_mb * MB)
        source = os.path.join(self.root, f"output-{size_mb}.dat")
        with open(source, "wb") as fh:
            fh.write(os.urandom(size))
            os.fsync(fh.fileno())  # a job's output already on disk: put measures the cache's work
        linked = NodeCache(self.cache_config(f"cache-lat-{size_mb}-link"))
        copying = NodeCache(self.cache_config(f"cache-lat-{size_mb}-copy", hardlink=False))
        unchecked = NodeCache(self.cache_config(f"cache-lat-{size_mb}-unchecked", verify_bytes=0))
        hashed = NodeCache(self.cache_config(f"cache-lat-{size_mb}-hashed", verify_bytes=None))
        row: Dict[str, Any] = {"size_mb": int(size_mb) if size_mb.is_integer() else size_mb}
        row["put_hardlink_ms"] = self._median(lambda i: linked.insert_file(f"put{i}", source))
        row["put_copy_ms"] = self._median(lambda i: copying.insert_file(f"put{i}", source))
        for cache in (linked, copying, unchecked, hashed):
            cache.insert_file("get", source)
        jobs = os.path.join(self.root, f"jobs-lat-{size_mb}")
        row["get_hardlink_ms"] = self._median(lambda i: linked.fetch("get", f"{jobs}/h{i}/in", _no_download))
        row["get_symlink_ms"] = self._median(
            lambda i: linked.fetch("get", f"{jobs}/s{i}/in", _no_download, symlink=True))
        row["get_copy_ms"] = self._median(lambda i: copying.fetch("get", f"{jobs}/c{i}/in", _no_download))
        row["get_unchecked_ms"] = self._median(
            lambda i: unchecked.fetch("get", f"{jobs}/u{i}/in", _no_download))
        row["get_hashed_ms"] = self._median(lambda i: hashed.fetch("get", f"{jobs}/x{i}/in", _no_download))
        row["hit_checked"] = linked.config.verifies(size)
        url = self.upload(f"latency-{size_mb}.dat", size)
        download = self._downloader(url)
        row["get_miss_ms"] = self._median(lambda i: linked.fetch(f"miss{i}", f"{jobs}/m{i}/in", download))
        shutil.rmtree(jobs, ignore_errors=True)
        for cache in (linked, copying, unchecked, hashed):
            cache.clear()
        os.unlink(source)
        return row

    def _downloader(self, url_text: str) -> Callable[[Any], Any]:
        url = parse_url(url_text, env=self.env)
        backend = self.session.backend(url)
        return lambda sink: backend.get(url, sink)

    def _median(self, action: Callable[[int], object]) -> float:
        times = []
        for i in range(self.params.repeats):
            started = time.perf_counter()
            action(i)
            times.append(time.perf_counter() - started)
        return round(1000.0 * statistics.median(times), 3)


def _no_download(sink: Any) -> Any:
    raise AssertionError("the latency table measures hits; nothing may be downloaded")


def _sha(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(MiB), b""):
            digest.update(block)
    return digest.hexdigest()


def _report(params: Params, reuse: List[Dict[str, Any]], single: Dict[str, Any],
            latency: List[Dict[str, Any]]) -> Dict[str, object]:
    plain, cached = reuse
    hundred = next((row for row in latency if row["size_mb"] == 100), None)
    targets = {
        "one_origin_request_for_concurrent_readers": single["origin_requests"] == 1,
        "hardlink_get_of_100MB_under_5ms": (hundred["get_hardlink_ms"] < TARGET_HARDLINK_GET_MS
                                            if hundred is not None else None),
        "cached_reuse_requests_equal_unique_objects": cached["origin_requests"] == cached["unique_objects"],
        "files_identical": bool(plain["files_identical"] and cached["files_identical"]
                                and single["files_identical"]),
    }
    return {"benchmark": "cache", "params": dataclasses.asdict(params), "reuse": reuse,
            "single_flight": single, "latency_ms": latency,
            "targets": targets, "published": PUBLISHED}


# The seed paper's cache daemon, for comparison only: never mixed with figures measured here.
PUBLISHED: Dict[str, Any] = {
    "source": "seed paper, cache daemon on its own hardware",
    "cache_daemon_get_100MB_ms": {"get of a cached 100 MB file by copy": 3951,
                                  "get of a cached 100 MB file by symlink": 1841},
}

_LATENCY_COLUMNS = (("put link", "put_hardlink_ms"), ("put copy", "put_copy_ms"),
                    ("get link", "get_hardlink_ms"), ("get sym", "get_symlink_ms"),
                    ("get copy", "get_copy_ms"), ("get miss", "get_miss_ms"),
                    ("ctime only", "get_unchecked_ms"), ("hash all", "get_hashed_ms"))


def format_table(result: Dict[str, Any]) -> str:
    rows = [f"{'reuse (Broadband-like)':<24} {'jobs':>5} {'files':>6} {'unique':>7} {'requests':>9} "
            f"{'MB from store':>14} {'wall s':>8} {'hits':>6}"]
    for run in result["reuse"]:
        rows.append(f"{run['mode']:<24} {run['jobs']:>5} {run['files']:>6} {run['unique_objects']:>7} "
                    f"{run['origin_requests']:>9} {run['origin_bytes'] / MB:>14.1f} {run['wall_s']:>8.2f} "
                    f"{run['hits']:>6}")
    single = result["single_flight"]
    rows += ["", f"single flight: {single['processes']} processes released together, one "
                 f"{single['object_bytes'] / MiB:g} MiB object -> {single['origin_requests']} origin "
                 f"request(s), {single['hits']} hits, {single['wall_s']:.2f} s", "",
             f"{'latency, ms (median)':<20} " + " ".join(f"{name:>9}" for name, _ in _LATENCY_COLUMNS)]
    for row in result["latency_ms"]:  # "-": a column the saved run predates (bench report --reuse)
        rows.append(f"{format(row['size_mb'], 'g') + ' MB':<20} "
                    + " ".join(f"{row[key]:>9.3f}" if key in row else f"{'-':>9}" for _, key in _LATENCY_COLUMNS))
    rows.append("get link: the default check (SHA-256 of entries up to 1 MiB, ctime fingerprint above); "
                "'ctime only' is PEGASUS_CLOUDIO_CACHE_VERIFY_BYTES=0 (fingerprint for every size), "
                "'hash all' is =all (SHA-256 on every hit): the differences are the checks' costs")
    for name, ok in result["targets"].items():
        rows.append(f"target {name}: {'n/a' if ok is None else ('met' if ok else 'NOT MET')}")
    published = result["published"]
    rows += ["", f"published, not measured in this run ({published['source']}):"]
    rows += [f"  {what}: {ms} ms" for what, ms in published["cache_daemon_get_100MB_ms"].items()]
    return "\n".join(rows)
