"""What a job step imports: the drop-in as a wheel installs it, run as Pegasus runs it.

Every job step starts the drop-in, on a core the jobs compute on, so what it imports is a
per-job cost (``pegasus-cloudio bench startup`` measures it against the stock tool). These
tests pin the modules a one-file S3 job imports beyond the interpreter's own start-up
(``python -X importtime``, the wheel's commands in a fresh venv, a real MinIO): a module
that is not in :data:`ONE_FILE_S3` is a regression, as is any of :data:`NEVER` (the heavy
standard modules, and our features the job does not use).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List, Set

import boto3
import pytest

from pegasus_cloudio_testbed.wheel import installed_bin
from installed import clean_env

# Beyond `python -c pass`: what a stage-in of one S3 object (node cache off) may import.
ONE_FILE_S3 = frozenset({
    "__future__", "_json", "_md5", "atexit", "gc", "_queue", "_sha256", "_sha2", "_socket", "binascii", "errno", "itertools", "zlib",
    "pegasus_cloudio", "pegasus_cloudio.dropin", "pegasus_cloudio.dropin.launch", "pegasus_cloudio.dropin.log", "pegasus_cloudio.ending",
    "pegasus_cloudio.dropin.main", "pegasus_cloudio.dropin.monitoring", "pegasus_cloudio.dropin.reporting",
    "pegasus_cloudio.dropin.signals", "pegasus_cloudio.dropin.spec", "pegasus_cloudio.dropin.stats",
    "transfer", "transfer._digests", "transfer.lean", "transfer.lean_json", "transfer._threads", "transfer._workers", "transfer.atomic", "transfer.backends",
    "transfer.backends._s3_checksum", "transfer.backends._s3_route", "transfer.backends._s3_wire",
    "transfer.backends._sigv4", "transfer.backends._wire_common", "transfer.backends.base", "transfer.backends.opening", "transfer.backends.s3",
    "transfer.config", "transfer.context", "transfer.credentials", "transfer.engine", "transfer.errors", "transfer.knobs",
    "transfer.named_files", "transfer.layers", "transfer.layers.stack", "transfer.layers.store",
    "transfer.copies",  # what one attempt does with a source (split from the engine)
    "transfer.layers.bundles",  # the 404 fallback to bundle members (imports no bundle code until used)
    "transfer.http", "transfer.http.connection", "transfer.http.message", "transfer.http.pool", "transfer.http.resume", "transfer.http.sockets", "transfer.ops", "transfer.ranged",
    "transfer.node", "transfer.pacing", "transfer.pacing_node", "transfer.retry", "transfer.retrying", "transfer.schemes", "transfer.session",
    "transfer.urls",
})
# Never on this path: heavy standard modules, and features a plain S3 job does not use.
NEVER = frozenset({
    "threading", "hashlib", "hmac", "_hashlib", "functools", "collections", "contextlib", "re", "typing", "dataclasses", "inspect", "pathlib", "logging", "argparse", "enum", "socket", "ssl",
    "selectors", "json", "json.decoder", "configparser", "urllib.parse", "concurrent.futures", "tempfile",
    "shutil", "subprocess", "random", "email.utils", "xml.etree.ElementTree", "datetime", "glob",
    "transfer.bundles", "transfer.cache", "transfer.p2p", "transfer.peers", "transfer.uploads",
    "transfer.layers.cache", "transfer.layers.peers",
    "transfer.backends.gcs", "transfer.backends.sftp", "transfer.backends.local", "transfer.backends.aws_chain",
    "pegasus_cloudio.dropin.integrity", "pegasus_cloudio.dropin.stock", "pegasus_cloudio.stager.client",
})


@pytest.fixture(scope="module")
def wheel_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    return installed_bin(str(tmp_path_factory.mktemp("wheel")))


@pytest.fixture
def job(minio, s3_env: Dict[str, str], bucket: str, wheel_bin: str, tmp_path: Path) -> Iterator[Dict[str, object]]:
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    client.put_object(Bucket=bucket, Key="in/f.a", Body=b"x" * 300)
    spec = [{"type": "transfer", "lfn": "f.a", "src_urls": [{"site_label": "minio", "url": f"s3://test@minio/{bucket}/in/f.a"}],
             "dest_urls": [{"site_label": "local", "url": "file://$PWD/f.a"}]}]
    workdir = tmp_path / "job"
    workdir.mkdir()
    env = clean_env(wheel_bin, {**s3_env, "PEGASUS_CLOUDIO_CACHE_DIR": "off"})
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # installed modules run from their bytecode
    env["PWD"] = str(workdir)
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "run")  # a node where no prefix was throttled (no rate file)
    yield {"bin": wheel_bin, "env": env, "cwd": workdir, "spec": json.dumps(spec)}


def imported(bin_dir: str, argv: List[str], env: Dict[str, str], cwd: Path, stdin: str = "") -> Set[str]:
    """Modules ``python -X importtime`` reports for ``argv``, less those of ``python -c pass``."""
    python = os.path.join(bin_dir, "python")

    def names(args: List[str], text: str) -> Set[str]:
        done = subprocess.run([python, "-X", "importtime", *args], input=text, env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}

    return names(argv, stdin) - names(["-c", "pass"], "")


def test_a_one_file_s3_job_imports_only_the_pinned_modules(job: Dict[str, object]) -> None:
    bin_dir = str(job["bin"])
    found = imported(bin_dir, [os.path.join(bin_dir, "pegasus-cloudio-transfer-py")], job["env"],  # type: ignore[arg-type]
                     job["cwd"], str(job["spec"]))  # type: ignore[arg-type]
    assert (Path(str(job["cwd"])) / "f.a").read_bytes() == b"x" * 300
    assert not found & NEVER, sorted(found & NEVER)
    assert found <= ONE_FILE_S3, f"new on a job step's path: {sorted(found - ONE_FILE_S3)}"


def test_an_empty_job_imports_no_engine_session_or_backend(job: Dict[str, object]) -> None:
    bin_dir = str(job["bin"])
    found = imported(bin_dir, [os.path.join(bin_dir, "pegasus-cloudio-transfer-py")], job["env"],  # type: ignore[arg-type]
                     job["cwd"], "[]")  # type: ignore[arg-type]
    assert found <= ONE_FILE_S3 and not found & NEVER, sorted(found - ONE_FILE_S3)
    assert not found & {"transfer.engine", "transfer.session", "transfer.backends.s3", "transfer.http.connection",
                        "transfer.http.message", "_socket", "hashlib"}, sorted(found)


def test_the_node_cache_brings_no_bundles_or_peers(job: Dict[str, object]) -> None:
    """With the node cache on (its default), the cache is imported, but no bundle or P2P code."""
    env = dict(job["env"])  # type: ignore[call-overload]
    env.pop("PEGASUS_CLOUDIO_CACHE_DIR")
    bin_dir = str(job["bin"])
    found = imported(bin_dir, [os.path.join(bin_dir, "pegasus-cloudio-transfer-py")], env, job["cwd"],  # type: ignore[arg-type]
                     str(job["spec"]))
    assert "transfer.cache.store" in found
    assert not [name for name in found if name.startswith(("transfer.bundles", "transfer.p2p", "transfer.peers"))]


def test_bundles_and_the_cache_on_a_one_file_job_import_no_json_re_or_xml(job: Dict[str, object]) -> None:
    """A producer's stage-in of one plain file with bundles and the node cache on (the workflow's
    "bundles + cache" mode): no listing is made for one file, so the bundle code is not even
    imported (transfer.bundle_gate), and the cache's metadata uses transfer.lean_json, so none
    of the heavy parsers comes in."""
    env = dict(job["env"], PEGASUS_CLOUDIO_BUNDLE="1",  # type: ignore[call-overload]
               PEGASUS_CLOUDIO_CACHE_DIR=str(Path(str(job["cwd"])).parent / "cache"))
    bin_dir = str(job["bin"])
    found = imported(bin_dir, [os.path.join(bin_dir, "pegasus-cloudio-transfer-py")], env, job["cwd"],  # type: ignore[arg-type]
                     str(job["spec"]))
    assert (Path(str(job["cwd"])) / "f.a").read_bytes() == b"x" * 300
    assert "transfer.cache.store" in found and "transfer.bundle_gate" in found  # both were on
    assert not [name for name in found if name.startswith("transfer.bundles")], sorted(found)
    heavy = {"re", "json", "json.decoder", "xml.etree.ElementTree", "urllib.parse", "calendar", "_strptime",
             "datetime", "locale", "tempfile", "shutil", "typing", "dataclasses", "logging", "threading", "hashlib",
             "hmac", "_hashlib", "collections", "functools", "contextlib", "array"}
    assert not found & heavy, sorted(found & heavy)


def test_the_startup_benchmark_reports_every_contestant_and_its_ratios() -> None:
    """``pegasus-cloudio bench startup`` on one round: every contestant measured, ratios to the
    stock tool's empty start, the objects really staged (a failed step raises)."""
    from pegasus_cloudio_bench import startup
    from pegasus_cloudio_bench.harness import Progress

    result = startup.run(1, 2, 100, 2, Progress(enabled=False))
    cpu = result["cpu_ms_median"]
    assert set(cpu) == set(startup.CONTESTANTS)  # type: ignore[arg-type]
    assert all(value > 0 for value in cpu.values())  # type: ignore[attr-defined]
    assert result["ratios"]["ours empty / stock empty"] == round(cpu["ours empty"] / cpu["stock empty"], 2)  # type: ignore[index]
    assert result["ratios"]["ours objects / Go objects"] == round(cpu["ours objects"] / cpu["Go objects"], 2)  # type: ignore[index]
    assert set(result["targets"]) == {"ours_empty_within_0.7x_stock_empty", "ours_2_objects_within_stock_empty",  # type: ignore[arg-type]
                                      "ours_2_objects_via_stager_within_1x_go_cpu", "ours_2_objects_within_2x_go_cpu"}
    table = startup.format_table(result)
    assert "ours objects via stager" in table and "Go objects" in table and "Python tool Pegasus 5 ships" in table


def test_a_stage_out_opens_the_node_cache_only_when_uploads_are_written_through(job: Dict[str, object]) -> None:
    """A batch of uploads alone uses no cache unless PEGASUS_CLOUDIO_CACHE_UPLOADS asks for
    write-through: then the cache is neither imported nor created."""
    cwd = Path(str(job["cwd"]))
    (cwd / "out.dat").write_bytes(b"y" * 300)
    bucket = json.loads(str(job["spec"]))[0]["src_urls"][0]["url"].rsplit("/in/", 1)[0]
    spec = json.dumps([{"type": "transfer", "lfn": "out.dat", "src_urls": [{"site_label": "local", "url": f"file://{cwd}/out.dat"}],
                        "dest_urls": [{"site_label": "minio", "url": f"{bucket}/out/out.dat"}]}])
    bin_dir = str(job["bin"])
    for uploads, cached in (("auto", False), ("1", True)):
        cache = cwd.parent / f"cache-{uploads}"
        env = dict(job["env"], PEGASUS_CLOUDIO_CACHE_DIR=str(cache), PEGASUS_CLOUDIO_CACHE_UPLOADS=uploads)  # type: ignore[call-overload]
        found = imported(bin_dir, [os.path.join(bin_dir, "pegasus-cloudio-transfer-py")], env, cwd, spec)
        assert ("transfer.cache.store" in found) is cached, (uploads, sorted(found))
        assert cache.exists() is cached


def test_the_drop_in_looks_for_cycles_less_often_than_python() -> None:
    """A job step's imports allocate tens of thousands of objects and free next to none, so
    the command raises the cyclic collector's first threshold (launch.GC_THRESHOLD) before them."""
    import sys

    probe = ("import gc, sys\n"
             "import pegasus_cloudio.dropin.main as m\n"
             "m.main = lambda: print(gc.get_threshold()[0]) or 0\n"
             "from pegasus_cloudio.dropin.launch import console_main\n"
             "console_main()\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env.pop("PEGASUS_CLOUDIO_STAGER", None)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 10_000 > 700
