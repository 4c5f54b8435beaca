"""Job processes on one node fetching objects, with or without the node cache.

Used by ``pegasus-cloudio bench cache`` and tests/test_cache.py. Run as
``python -m pegasus_cloudio_bench.cache_jobs`` with a JSON plan on stdin::

    {"env": {...},                      # environment of the jobs (credentials, ...)
     "cache": {"directory": ..., "max_bytes": ..., ...} or null,   # CacheConfig fields
     "jobs": [[{"url": ..., "key": ..., "dest": ..., "symlink": false}, ...], ...],
     "parallel": 8,                     # jobs running at once (slots on the node)
     "fork": true}                      # false: run the single job in this process

Each job is its own process (forked from this one after the imports, so a job costs what
a staging job costs minus interpreter start-up), fetches its inputs in order with one
Session and one NodeCache, and closes both. The first ``parallel`` jobs are released
together. Prints ``{"wall_s": ..., "jobs": [{"pid", "error", "seconds", "fetches": [{"size",
"hit", "seconds"}]}]}`` on stdout.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from transfer.atomic import AtomicFile
from transfer.cache import CacheConfig, NodeCache
from transfer.session import Session
from transfer.urls import parse_url

Job = List[Dict[str, Any]]


def run_job(env: Mapping[str, str], cache_fields: Optional[Mapping[str, Any]], job: Job) -> Dict[str, Any]:
    """Fetch one job's inputs; never raises (the error is reported)."""
    started = time.monotonic()
    fetches: List[Dict[str, Any]] = []
    error: Optional[str] = None
    session = Session(env=dict(env))
    cache = NodeCache(CacheConfig(**cache_fields)) if cache_fields else None
    try:
        for item in job:
            clock = time.monotonic()
            size, hit = _fetch(session, cache, env, item)
            fetches.append({"size": size, "hit": hit, "seconds": time.monotonic() - clock})
    except Exception as err:  # noqa: BLE001 - reported to the parent, which decides
        error = f"{type(err).__name__}: {err}"
    finally:
        if cache is not None:
            cache.close()
        session.close()
    return {"pid": os.getpid(), "error": error, "seconds": time.monotonic() - started, "fetches": fetches}


def _fetch(session: Session, cache: Optional[NodeCache], env: Mapping[str, str],
           item: Mapping[str, Any]) -> Tuple[int, bool]:
    url = parse_url(item["url"], env=env)
    backend = session.backend(url)

    def download(sink: Any) -> Any:
        return backend.get(url, sink)

    if cache is not None:
        return cache.fetch(item["key"], item["dest"], download, symlink=bool(item.get("symlink")))
    with AtomicFile(item["dest"]) as out:
        info = download(out.file)
        return out.commit(info.size), False


def run_plan(plan: Mapping[str, Any]) -> Dict[str, Any]:
    """Run every job of ``plan`` as described in the module docstring."""
    env, cache, jobs = plan["env"], plan.get("cache"), plan["jobs"]
    started = time.monotonic()
    if not plan.get("fork", True):
        results = [run_job(env, cache, job) for job in jobs]
    else:
        results = _run_forked(env, cache, jobs, max(1, int(plan.get("parallel", 1))))
    return {"wall_s": time.monotonic() - started, "jobs": results}


def _run_forked(env: Mapping[str, str], cache: Optional[Mapping[str, Any]], jobs: List[Job],
                parallel: int) -> List[Dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="cache-jobs-") as outdir:
        gate_r, gate_w = os.pipe()
        running: Dict[int, int] = {}
        next_job = 0
        while next_job < len(jobs) or running:
            while next_job < len(jobs) and len(running) < parallel:
                running[_spawn(env, cache, jobs[next_job], next_job, outdir, gate_r, gate_w)] = next_job
                next_job += 1
            if gate_w >= 0:  # the first wave is in place: release it at once
                os.close(gate_w)
                gate_w = -1
            pid, _ = os.wait()
            running.pop(pid, None)
        os.close(gate_r)
        return [_result(outdir, i) for i in range(len(jobs))]


def _spawn(env: Mapping[str, str], cache: Optional[Mapping[str, Any]], job: Job, index: int, outdir: str,
           gate_r: int, gate_w: int) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        if gate_w >= 0:
            os.close(gate_w)
            os.read(gate_r, 1)  # returns at EOF, when the parent closes the gate
        result = run_job(env, cache, job)
        with open(os.path.join(outdir, f"{index}.json"), "w", encoding="utf-8") as fh:
            json.dump(result, fh)
    except BaseException:  # noqa: B036 - a forked child must never return into the parent's code
        code = 1
    finally:
        sys.stdout.flush()
        os._exit(code)


def _result(outdir: str, index: int) -> Dict[str, Any]:
    try:
        with open(os.path.join(outdir, f"{index}.json"), encoding="utf-8") as fh:
            found: Dict[str, Any] = json.load(fh)
            return found
    except (OSError, ValueError):
        return {"pid": None, "error": "job process died", "seconds": 0.0, "fetches": []}


def main() -> int:
    result = run_plan(json.load(sys.stdin))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0 if all(job["error"] is None for job in result["jobs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
