"""What the node stager loads before it forks: a job it runs imports nothing itself.

Each handed-off job runs in a forked copy of the stager, so a module the drop-in imports
lazily on its way to a transfer is imported again in every job (about 10 ms of CPU per step
on a 2-core VM) unless :data:`pegasus_cloudio.stager.preload.PRELOAD` names it; the same for a
record class's ``__init__``, generated on first use (a compile: about 4 ms per step in all,
unless :func:`preload` generated them). These tests
run :func:`preload`, then the drop-in's ``main`` in the same process on real jobs against
MinIO (plain S3, bundles with the node cache: stage-out, then stage-in of a bundle member
and of a plain object), and pin that nothing new was imported nor generated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

from pegasus_cloudio.stager import warm
from pegasus_cloudio.stager.preload import PRELOAD, preload
from pegasus_cloudio_testbed.stager import StagerProcess

from test_stager import job_env, run_job, served, wait_for

CHILD = """
import json, sys
from pegasus_cloudio.stager.preload import preload
preload()
before = set(sys.modules)
def inits():
    return {f"{m.__name__}.{c.__qualname__}": c.__dict__["__init__"] for m in list(sys.modules.values())
            for c in list(vars(m).values()) if isinstance(c, type) and "__record_fields__" in c.__dict__
            and c.__module__ == m.__name__}
ready = inits()
from pegasus_cloudio.dropin.main import main
code = main([])
made = sorted(name for name, init in inits().items() if ready.get(name) is not init)
print(json.dumps({"code": code, "new": sorted(set(sys.modules) - before) + made}))
"""


def entry(src: str, dst: str, src_label: str, dst_label: str) -> Dict[str, object]:
    return {"type": "transfer", "src_urls": [{"site_label": src_label, "url": src}],
            "dest_urls": [{"site_label": dst_label, "url": dst}]}


def job_after_preload(spec: List[Dict[str, object]], env: Dict[str, str], cwd: Path) -> List[str]:
    """The modules the drop-in's ``main`` imported after :func:`preload`, running ``spec``, and
    the record classes whose ``__init__`` it generated (a compile each, per job)."""
    done = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(spec).encode(), env=env, cwd=cwd,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(done.stdout.decode().splitlines()[-1])
    assert result["code"] == 0, done.stderr.decode()[-3000:]
    return list(result["new"])


def test_the_preload_list_names_modules_that_exist():
    assert preload() == []


def test_the_preload_list_names_no_private_module_of_ours():
    """What a module imports inside its functions is its own to name (``DEFERRED``), not the stager's."""
    ours = [name for name in PRELOAD if name.startswith(("transfer.", "pegasus_cloudio."))]
    assert ours and not [name for name in ours if any(part.startswith("_") for part in name.split("."))]


def test_a_job_in_a_preloaded_process_imports_nothing(s3_env, bucket, tmp_path):
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""), **s3_env,
           "PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES": "0"}
    src = tmp_path / "src"
    src.mkdir()
    names = [f"f{i:02d}.dat" for i in range(12)]
    for name in names:
        (src / name).write_bytes(name.encode() * 25)
    (src / "h.hdr").write_bytes(b"SIMPLE = T")
    url = f"s3://test@minio/{bucket}"
    plain = dict(env, PEGASUS_CLOUDIO_CACHE_DIR="off")
    bundled = dict(env, PEGASUS_CLOUDIO_BUNDLE="1", PEGASUS_CLOUDIO_CACHE_DIR=str(tmp_path / "cache"))
    jobs = {
        "plain stage-out": ([entry(f"file://{src}/h.hdr", f"{url}/h.hdr", "local", "minio")], plain),
        "plain stage-in": ([entry(f"{url}/h.hdr", f"file://{tmp_path}/in-plain/h.hdr", "minio", "local")], plain),
        "bundled stage-out": ([entry(f"file://{src}/{n}", f"{url}/run/{n}", "local", "minio") for n in names], bundled),
        "bundled stage-in": ([entry(f"{url}/run/{n}", f"file://{tmp_path}/in-bundle/{n}", "minio", "local")
                              for n in names], bundled),
        "plain object, bundles and cache on": (
            [entry(f"{url}/h.hdr", f"file://{tmp_path}/in-cached/h.hdr", "minio", "local")], bundled),
        "plain objects out": ([entry(f"file://{src}/{n}", f"{url}/flat/{n}", "local", "minio") for n in names], plain),
        "plain objects in, pipelined": (
            [entry(f"{url}/flat/{n}", f"file://{tmp_path}/in-flat/{n}", "minio", "local") for n in names], plain),
        "plain objects in, pipelined into the cache": (
            [entry(f"{url}/flat/{n}", f"file://{tmp_path}/in-flat-cached/{n}", "minio", "local") for n in names],
            dict(env, PEGASUS_CLOUDIO_CACHE_DIR=str(tmp_path / "cache"))),
        "a local copy": ([entry(f"file://{src}/h.hdr", f"file://{tmp_path}/copied/h.hdr", "local", "local")], plain),
    }
    imported = {what: job_after_preload(spec, job_env, tmp_path) for what, (spec, job_env) in jobs.items()}
    assert imported == {what: [] for what in jobs}
    assert (tmp_path / "in-bundle" / names[3]).read_bytes() == names[3].encode() * 25
    assert (tmp_path / "in-cached" / "h.hdr").read_bytes() == b"SIMPLE = T"
    assert (tmp_path / "in-flat-cached" / names[5]).read_bytes() == names[5].encode() * 25
    assert (tmp_path / "copied" / "h.hdr").read_bytes() == b"SIMPLE = T"


def test_reports_of_modules_a_copy_imported_are_parsed_strictly():
    assert warm.parse_import(b"import transfer.backends.gcs") == "transfer.backends.gcs"
    for bad in (b"", b"import", b"import ", b"import a b", b"import a..b", b"import 1a", b"load a",
                b"import \xff", b"import " + b"a" * 300, b"127.0.0.1 9000"):
        assert warm.parse_import(bad) is None, bad
    sockets = warm.WarmSockets()
    try:
        warm.report(sockets.reports_w, [], ["transfer.backends.gcs"])
        os.write(sockets.reports_w, b"import ../../evil\n")
        sockets.drain_reports()
        assert sockets.imports == {"transfer.backends.gcs"} and sockets.held() == []
    finally:
        sockets.close()


def test_a_heavy_backend_is_loaded_by_the_stager_once_a_job_used_it_not_before(native_dropin, gcs_env, gcs_bucket,
                                                                                 tmp_path):
    (tmp_path / "in.dat").write_bytes(b"gcs bytes")
    jobs = [([entry(f"file://{tmp_path}/in.dat", f"file://{tmp_path}/copy.dat", "local", "local")], {}),
            ([entry(f"file://{tmp_path}/in.dat", f"gs://{gcs_bucket}/in.dat", "local", "gcs")], gcs_env),
            ([entry(f"gs://{gcs_bucket}/in.dat", f"file://{tmp_path}/back.dat", "gcs", "local")], gcs_env)]
    with StagerProcess() as stager:
        for n, (spec, env) in enumerate(jobs):
            done = run_job(native_dropin, [], job_env(stager.socket_path, **env), tmp_path,
                           stdin=json.dumps(spec).encode())
            assert done.returncode == 0, done.stderr.decode()
            wait_for(lambda: len(served(stager)) == n + 1, "the job's process to end")
            if n == 1:  # a plain job taught it nothing; the gs:// job's report is taken at the next job
                assert "loaded transfer.backends" not in stager.log_tail(1000)
        wait_for(lambda: "loaded transfer.backends.gcs, which a job used" in stager.log_tail(1000),
                 "the stager to load the GCS backend")
        assert "transfer.backends.sftp" not in stager.log_tail(1000)
    assert (tmp_path / "back.dat").read_bytes() == b"gcs bytes"


def test_a_job_reading_a_directory_of_several_bundles_in_a_preloaded_process_imports_nothing(s3_env, bucket,
                                                                                            tmp_path):
    """A concat job's stage-in: the directory holds several small bundles, whose heads are read in
    one pipelined pass (transfer.bundles.directory._read_whole): that pass's modules are preloaded."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""), **s3_env,
           "PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES": "0", "PEGASUS_CLOUDIO_BUNDLE": "1",
           "PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path / "cache")}
    src = tmp_path / "src"
    src.mkdir()
    url = f"s3://test@minio/{bucket}"
    batches = [[f"b{b}-{i:02d}.dat" for i in range(8)] for b in range(3)]
    for names in batches:  # one stage-out job per batch: one bundle each
        for name in names:
            (src / name).write_bytes(name.encode() * 25)
        assert job_after_preload([entry(f"file://{src}/{n}", f"{url}/run/{n}", "local", "minio") for n in names],
                                 env, tmp_path) == []
    names = [name for batch in batches for name in batch]
    stage_in = [entry(f"{url}/run/{n}", f"file://{tmp_path}/in/{n}", "minio", "local") for n in names]
    assert job_after_preload(stage_in, env, tmp_path) == []
    for name in names:
        assert (tmp_path / "in" / name).read_bytes() == name.encode() * 25
