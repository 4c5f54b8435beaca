"""The Snakemake storage plugin and the Parsl staging provider as users get them: the wheel
installed with ``[snakemake]`` / ``[parsl]`` into fresh venvs (pinned: requirements/snakemake/,
requirements/parsl.txt), against MinIO behind a counting proxy.

* Snakemake: its interface package's own ``TestStorageBase``, unmodified (tests/engines/
  snakemake_suite.py), and a real ``snakemake`` run of a many-small-files workflow with the
  plugin as the default storage provider; outputs byte-exact, inputs staged in one batch.
* Parsl: real runs on a ThreadPoolExecutor and a HighThroughputExecutor on loopback whose apps
  take s3:// files in and out; byte-exact outputs; each task's files in one engine batch,
  shown by request counts (bundles: one PUT per task's outputs, not one per file).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import boto3
import pytest

from installed import REPO, build_sdist_and_wheel, clean_env, constraints_file, make_venv, run
from pegasus_cloudio.testbed.minio import MinioServer
from pegasus_cloudio.testbed.proxy import TcpProxy
from transfer import Engine, Session, Settings, Transfer, parse_url

ENGINES = REPO / "tests" / "engines"
Venv = Tuple[Path, Dict[str, str]]
FILES = 24


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sdist_and_wheel(tmp_path_factory.mktemp("dist"))[1]


def _venv(root: Path, *requirements: str) -> Venv:
    bin_dir = make_venv(root / "venv")
    env = clean_env(str(bin_dir), {"AWS_EC2_METADATA_DISABLED": "true", "HOME": str(root)})
    done = run([str(bin_dir / "pip"), "install", "--quiet", *requirements], env, root, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return bin_dir, env


@pytest.fixture(scope="module")
def snakemake_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """``[snakemake]`` held to its own lock (it conflicts with the main one: see the file)."""
    lock = REPO / "requirements" / "snakemake" / "snakemake.txt"
    return _venv(tmp_path_factory.mktemp("snakemake"), "-c", str(lock), f"{wheel}[snakemake]", "pytest")


@pytest.fixture(scope="module")
def parsl_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    root = tmp_path_factory.mktemp("parsl")
    return _venv(root, "-c", str(constraints_file(root / "constraints.txt")), f"{wheel}[parsl]")


@pytest.fixture
def counted(minio: MinioServer) -> Iterator[TcpProxy]:
    with TcpProxy((minio.host, minio.port)) as proxy:
        yield proxy


def _boto(minio: MinioServer):  # type: ignore[no-untyped-def]
    return boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                        aws_secret_access_key=minio.secret_key, region_name="us-east-1",
                        verify=str(minio.ca_file) if minio.tls else None)


@pytest.fixture
def tls_bucket(minio_tls: MinioServer) -> str:
    """A new bucket on the MinIO whose certificate only its private CA (``ca_file``) verifies."""
    name = f"t-{uuid.uuid4().hex[:16]}"
    _boto(minio_tls).create_bucket(Bucket=name)
    return name


def _blocks(lang: str) -> List[str]:
    """The ```LANG blocks of docs/engines.md, in order."""
    found, current = [], None
    for line in (REPO / "docs" / "engines.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if current is None and line[3:].strip() == lang:
                current = []
            elif current is not None:
                found.append("\n".join(current) + "\n")
                current = None
            continue
        if current is not None:
            current.append(line)
    return found


def _as_tested(text: str, minio: MinioServer, bucket: str) -> str:
    return text.replace("http://127.0.0.1:9000", minio.endpoint).replace("mybucket", bucket)


def _content(i: int) -> bytes:
    return f"file {i}: {'abc' * (i % 7)}\n".encode() + bytes(range(i % 5))


def test_without_the_extra_the_import_names_it(wheel: Path, tmp_path: Path) -> None:
    bin_dir, env = _venv(tmp_path, "--no-index", str(wheel))
    for module, extra in (("transfer.integrations.parsl_staging", "parsl"),
                          ("snakemake_storage_plugin_pegasus_cloudio", "snakemake")):
        done = run([str(bin_dir / "python"), "-c", f"import {module}"], env, tmp_path)
        assert done.returncode == 1
        assert done.stderr.rstrip().splitlines()[-1].endswith(f"pip install 'pegasus-cloudio[{extra}]'"), done.stderr


# --------------------------------------------------------------------------- Snakemake


def test_snakemake_registry_finds_the_installed_plugin(snakemake_venv: Venv, tmp_path: Path) -> None:
    bin_dir, env = snakemake_venv
    code = ("from snakemake_interface_storage_plugins.registry import StoragePluginRegistry as R\n"
            "import snakemake_storage_plugin_pegasus_cloudio as p\n"
            "print(R().get_plugin('pegasus-cloudio').storage_provider.__module__, p.__file__)")
    done = run([str(bin_dir / "python"), "-c", code], env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    module, path = done.stdout.split()
    assert module == "transfer.integrations.snakemake_storage"
    assert path.startswith(str(bin_dir.parent)), path  # the wheel's copy, not the checkout


def test_snakemake_storage_base_suite_passes_unmodified(snakemake_venv: Venv, minio: MinioServer, bucket: str,
                                                        tmp_path: Path) -> None:
    bin_dir, env = snakemake_venv
    shutil.copy(ENGINES / "snakemake_suite.py", tmp_path / "test_suite.py")
    env = dict(env, SUITE_ENDPOINT=minio.endpoint, SUITE_BUCKET=bucket, SUITE_ACCESS_KEY=minio.access_key,
               SUITE_SECRET_KEY=minio.secret_key)
    done = run([str(bin_dir / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                "-c", os.devnull, "test_suite.py"], env, tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    assert "8 passed" in done.stdout, done.stdout[-2000:]  # 4 tests x 2 classes, none skipped


def test_snakemake_workflow_with_the_plugin_as_default_storage(snakemake_venv: Venv, minio: MinioServer,
                                                               bucket: str, counted: TcpProxy,
                                                               tmp_path: Path) -> None:
    bin_dir, env = snakemake_venv
    client = _boto(minio)
    for i in range(FILES):
        client.put_object(Bucket=bucket, Key=f"wf/inputs/in{i}.txt", Body=_content(i))
        client.put_object(Bucket=bucket, Key=f"wf/extra/x{i}.txt", Body=_content(1000 + i))
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(ENGINES / "Snakefile", work / "Snakefile")
    env = dict(env, AWS_ACCESS_KEY_ID=minio.access_key, AWS_SECRET_ACCESS_KEY=minio.secret_key)
    counted.reset_counters()
    done = run([str(bin_dir / "snakemake"), "--cores", "2", "--verbose", "--config", f"files={FILES}",
                "--default-storage-provider", "pegasus-cloudio", "--default-storage-prefix", f"s3://{bucket}/wf",
                "--storage-pegasus-cloudio-endpoint-url", counted.url()], env, work, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    parts = [_content(i).upper() for i in range(FILES)]
    for i in range(FILES):
        assert client.get_object(Bucket=bucket, Key=f"wf/parts/up{i}.txt")["Body"].read() == parts[i]
    summary = client.get_object(Bucket=bucket, Key="wf/summary.txt")["Body"].read()
    assert summary == b"".join(parts) + b"".join(_content(1000 + i) for i in range(FILES))
    # The gather job's FILES extra inputs, which only it reads, are retrieved as one engine batch.
    assert f"{FILES} files for {FILES} storage objects in one engine batch" in log, log[-6000:]
    methods = counted.requests_by_method
    # While Snakemake builds the DAG, existence and modification times come from ONE listing (a
    # GET). Then a GET per input, a PUT per output and a HEAD per output after its upload
    # (Snakemake then asks for its existence and mtime repeatedly), plus the bucket check. Once
    # the DAG is built, Snakemake checks each output twice before its job runs (is it there? then
    # remove it): the listing no longer answers for an absence, so each check is one listing of
    # the output's directory (up to 2 more while parts/ is still empty, for each of the 2 jobs
    # prepared before the first output is stored: the listing then also asks about parts/ itself).
    outputs = FILES + 1
    assert 2 * FILES + 1 + 2 * outputs <= methods.get("GET", 0) <= 2 * FILES + 1 + 2 * outputs + 2 * 2 * 2, methods
    assert methods.get("PUT") == outputs, methods
    assert methods.get("HEAD") == FILES + 2, methods


LATE_OUTPUTS = """
import asyncio, json, logging, subprocess, sys
from pathlib import Path
from snakemake.io import IOCache
from snakemake_storage_plugin_pegasus_cloudio import StorageProvider, StorageProviderSettings
endpoint, proxied, access, secret, base = sys.argv[1:6]
settings = StorageProviderSettings(endpoint_url=proxied, access_key=access, secret_key=secret)
provider = StorageProvider(local_prefix=Path("local"), logger=logging.getLogger(), settings=settings)
late, late_dir = provider.object(base + "/late.txt"), provider.object(base + "/late-dir")
cache = IOCache(max_wait_time=10)  # as Snakemake does while it builds the DAG
asyncio.run(late.inventory(cache))
asyncio.run(late_dir.inventory(cache))
planning = [asyncio.run(o.managed_exists()) for o in (late, late_dir)]
# Another process (a remote job) stores the outputs after the listing, through its own client.
writer = ("import sys; from transfer.client import Client\\n"
          "c = Client(endpoint=sys.argv[1], access_key=sys.argv[2], secret_key=sys.argv[3])\\n"
          "c.write_bytes(sys.argv[4] + '/late.txt', b'late!'); c.write_bytes(sys.argv[4] + '/late-dir/a/b.txt', b'b')")
subprocess.run([sys.executable, "-c", writer, endpoint, access, secret, base], check=True)
cache.deactivate()  # Snakemake, before it runs jobs: "from now on we always get updated information"
after = [asyncio.run(o.managed_exists()) for o in (late, late_dir)]
print(json.dumps({"planning": planning, "after": after}), flush=True)
print(json.dumps({"size": asyncio.run(late.managed_size()), "mtime": asyncio.run(late.managed_mtime()) > 0}))
"""


def test_snakemake_sees_an_output_stored_by_another_process_after_the_listing(
        snakemake_venv: Venv, minio: MinioServer, bucket: str, counted: TcpProxy, tmp_path: Path) -> None:
    """Under remote execution a job's outputs reach the store from the job's node, after the
    plugin listed their directory; Snakemake then checks them (its IOCache off). The plugin
    answered from that listing for the whole run: "missing" (MissingOutputException) for an
    output that exists. While Snakemake's IOCache holds the inventory, a listing's absence is
    still answered without a request; afterwards a miss is one listing of the directory."""
    bin_dir, env = snakemake_venv
    _boto(minio).put_object(Bucket=bucket, Key="run/out/other.txt", Body=b"listed")
    counted.reset_counters()
    done = run([str(bin_dir / "python"), "-c", LATE_OUTPUTS, minio.endpoint, counted.url(), minio.access_key,
                minio.secret_key, f"s3://{bucket}/run/out"], env, tmp_path)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines and lines[0]["planning"] == [False, False], done.stdout  # the inventory's snapshot
    assert lines[0]["after"] == [True, True], done.stdout
    assert done.returncode == 0, done.stderr[-3000:]
    assert lines[1] == {"size": len(b"late!"), "mtime": True}, lines
    # One listing for both inventories; one listing of the directory for the first miss after
    # the IOCache went, which also answers the second one and size and mtime. No HEAD.
    assert counted.requests_by_method == {"GET": 2}, counted.requests_by_method


FAILED_RETRIEVAL = """
import asyncio, logging, os, sys
from pathlib import Path
from snakemake_interface_common.exceptions import WorkflowError
from snakemake_storage_plugin_pegasus_cloudio import StorageProvider, StorageProviderSettings
settings = StorageProviderSettings(endpoint_url=sys.argv[1], access_key=sys.argv[2], secret_key=sys.argv[3])
provider = StorageProvider(local_prefix=Path("local"), logger=logging.getLogger(), settings=settings)
obj = provider.object(sys.argv[4])
async def both():  # one batch: the present object arrives, the absent one fails alone
    return await asyncio.gather(obj.managed_retrieve(), provider.object(sys.argv[5]).managed_retrieve(),
                                return_exceptions=True)
failed, fine = asyncio.run(both())
assert fine is None, fine
assert isinstance(failed, WorkflowError), failed
assert not obj.local_path().exists() and not obj.local_path().parent.exists() or \
    not any(obj.local_path().parent.iterdir()), "a partial or empty file was left"
print(failed)
"""


def test_snakemake_failed_retrieval_names_the_object_and_leaves_no_file(snakemake_venv: Venv, minio: MinioServer,
                                                                         bucket: str, tmp_path: Path) -> None:
    bin_dir, env = snakemake_venv
    _boto(minio).put_object(Bucket=bucket, Key="here/present.txt", Body=b"present")
    absent, present = f"s3://{bucket}/gone/absent.txt", f"s3://{bucket}/here/present.txt"
    done = run([str(bin_dir / "python"), "-c", FAILED_RETRIEVAL, minio.endpoint, minio.access_key, minio.secret_key,
                absent, present], env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert absent in done.stdout and "no such object in storage" in done.stdout, done.stdout
    assert (tmp_path / "local" / bucket / "here" / "present.txt").read_bytes() == b"present"


ENDPOINT_FROM_ENV = """
import logging, sys
from pathlib import Path
from snakemake_storage_plugin_pegasus_cloudio import StorageProvider, StorageProviderSettings
from transfer.urls import parse_url
settings = StorageProviderSettings(access_key=sys.argv[1], secret_key=sys.argv[2])  # keys given, no endpoint
provider = StorageProvider(local_prefix=Path("local"), logger=logging.getLogger(), settings=settings)
backend = provider.client.session.backend(parse_url(sys.argv[3]))
assert backend._pool.host == "127.0.0.1", backend._pool.host  # else stop: no request may leave the machine
print(provider.object(sys.argv[3]).exists())
"""


def test_snakemake_takes_the_endpoint_from_aws_endpoint_url_when_keys_are_given(
        snakemake_venv: Venv, minio: MinioServer, bucket: str, tmp_path: Path) -> None:
    """docs/engines.md: the endpoint defaults to AWS_ENDPOINT_URL. With keys given as plugin
    settings (or SNAKEMAKE_STORAGE_PEGASUS_CLOUDIO_ACCESS_KEY...) the variable was not read:
    requests, signed with those keys, went to AWS's endpoint instead."""
    bin_dir, env = snakemake_venv
    _boto(minio).put_object(Bucket=bucket, Key="here.txt", Body=b"x")
    done = run([str(bin_dir / "python"), "-c", ENDPOINT_FROM_ENV, minio.access_key, minio.secret_key,
                f"s3://{bucket}/here.txt"], dict(env, AWS_ENDPOINT_URL=minio.endpoint), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True"], done.stdout


BAD_CA_BUNDLE = """
import logging, sys
from pathlib import Path
from snakemake_storage_plugin_pegasus_cloudio import StorageProvider, StorageProviderSettings
settings = StorageProviderSettings(endpoint_url=sys.argv[1], access_key="a", secret_key="b", ca_bundle=sys.argv[2])
try:
    StorageProvider(local_prefix=Path("local"), logger=logging.getLogger(), settings=settings).object(sys.argv[3]).exists()
except ValueError as err:
    print(err)
else:
    print("accepted")
"""


def test_snakemake_verifies_a_private_ca_given_as_ca_bundle(snakemake_venv: Venv, minio_tls: MinioServer,
                                                          tls_bucket: str, tmp_path: Path) -> None:
    """A store with a private CA could only be used with TLS verification off (the plugin had no
    CA setting). The docs' example over https: refused without ``--storage-pegasus-cloudio-ca-bundle``
    (the CA is not the system's), run with it; an unreadable bundle is one line naming the option
    and its file, before any connection."""
    bin_dir, env = snakemake_venv
    _boto(minio_tls).put_object(Bucket=tls_bucket, Key="run1/in/hello.txt", Body=b"hello, world\n")
    [snakefile] = _blocks("snakemake")
    env = dict(env, AWS_ACCESS_KEY_ID=minio_tls.access_key, AWS_SECRET_ACCESS_KEY=minio_tls.secret_key)
    argv = [str(bin_dir / "snakemake"), "--cores", "1", "--default-storage-provider", "pegasus-cloudio",
            "--default-storage-prefix", f"s3://{tls_bucket}/run1", "--storage-pegasus-cloudio-endpoint-url",
            minio_tls.endpoint]
    for name, extra in (("without", []), ("with", ["--storage-pegasus-cloudio-ca-bundle", str(minio_tls.ca_file)])):
        work = tmp_path / name
        work.mkdir()
        (work / "Snakefile").write_text(snakefile)
        done = run(argv + extra, env, work, timeout=600)
        log = done.stdout + done.stderr
        if name == "without":
            assert done.returncode != 0 and "TLS certificate verification failed" in log, log[-5000:]
        else:
            assert done.returncode == 0, log[-5000:]
    assert _boto(minio_tls).get_object(Bucket=tls_bucket, Key="run1/out/hello.txt")["Body"].read() == b"HELLO, WORLD\n"
    with TcpProxy((minio_tls.host, minio_tls.port)) as proxy:
        missing = tmp_path / "missing-ca.pem"
        done = run([str(bin_dir / "python"), "-c", BAD_CA_BUNDLE, proxy.url("https"), str(missing),
                    f"s3://{tls_bucket}/run1/in/hello.txt"], env, tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"--storage-pegasus-cloudio-ca-bundle={missing}: cannot load CA certificates" in done.stdout, done.stdout
        assert proxy.connections == 0


ZERO_THREADS = """
import logging, sys
from pathlib import Path
from snakemake_storage_plugin_pegasus_cloudio import StorageProvider, StorageProviderSettings
settings = StorageProviderSettings(endpoint_url=sys.argv[1], access_key="a", secret_key="b", threads=0)
try:
    StorageProvider(local_prefix=Path("local"), logger=logging.getLogger(), settings=settings)
except ValueError as err:
    print(err)
else:
    print("accepted")
"""


def test_snakemake_threads_0_is_refused_not_replaced_by_the_default(snakemake_venv: Venv, counted: TcpProxy,
                                                                   tmp_path: Path) -> None:
    """``--storage-pegasus-cloudio-threads 0`` ran with 8 threads (``threads or 8``), no word said."""
    bin_dir, env = snakemake_venv
    counted.reset_counters()
    done = run([str(bin_dir / "python"), "-c", ZERO_THREADS, counted.url()], env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--storage-pegasus-cloudio-threads must be at least 1 (got 0)" in done.stdout, done.stdout
    assert counted.requests_by_method == {}


def test_snakemake_example_of_the_docs_runs_as_written(snakemake_venv: Venv, minio: MinioServer, bucket: str,
                                                        tmp_path: Path) -> None:
    bin_dir, env = snakemake_venv
    _boto(minio).put_object(Bucket=bucket, Key="run1/in/hello.txt", Body=b"hello, world\n")
    [snakefile] = _blocks("snakemake")
    (tmp_path / "Snakefile").write_text(snakefile)
    [command] = [c for c in _blocks("sh") if c.startswith("snakemake ")]
    env = dict(env, AWS_ACCESS_KEY_ID=minio.access_key, AWS_SECRET_ACCESS_KEY=minio.secret_key)
    done = run(["bash", "-c", _as_tested(command, minio, bucket)], env, tmp_path, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert _boto(minio).get_object(Bucket=bucket, Key="run1/out/hello.txt")["Body"].read() == b"HELLO, WORLD\n"


# --------------------------------------------------------------------------- Parsl


def test_parsl_example_of_the_docs_runs_as_written(parsl_venv: Venv, minio: MinioServer, bucket: str,
                                                   tmp_path: Path) -> None:
    bin_dir, env = parsl_venv
    _boto(minio).put_object(Bucket=bucket, Key="in/hello.txt", Body=b"hello, world\n")
    [example] = _blocks("python")
    (tmp_path / "example.py").write_text(_as_tested(example, minio, bucket))
    env = dict(env, AWS_ACCESS_KEY_ID=minio.access_key, AWS_SECRET_ACCESS_KEY=minio.secret_key)
    done = run([str(bin_dir / "python"), "example.py"], env, tmp_path, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert _boto(minio).get_object(Bucket=bucket, Key="out/hello.txt")["Body"].read() == b"HELLO, WORLD\n"


PARSL_TLS = """
import sys
import parsl
from parsl.app.app import python_app
from parsl.config import Config
from parsl.data_provider.files import File
from parsl.executors import ThreadPoolExecutor
from transfer.integrations.parsl_staging import S3Staging

endpoint, ca_file, bucket, run_dir = sys.argv[1:5]
try:
    S3Staging(endpoint_url=endpoint, ca_bundle=run_dir + "/missing-ca.pem")
except ValueError as err:
    print(err)


@python_app
def shout(inputs=(), outputs=()):
    with open(inputs[0].filepath) as src, open(outputs[0].filepath, "w") as dst:
        dst.write(src.read().upper())


for name, staging in (("with", S3Staging(endpoint_url=endpoint, ca_bundle=ca_file)),
                      ("without", S3Staging(endpoint_url=endpoint))):
    config = Config(executors=[ThreadPoolExecutor(storage_access=[staging], working_dir=run_dir + "/" + name)],
                    run_dir=run_dir + "/runinfo-" + name)
    with parsl.load(config):
        try:
            shout(inputs=[File(f"s3://{bucket}/in/hello.txt")], outputs=[File(f"s3://{bucket}/out/{name}.txt")]).result()
            print(name, "ok")
        except Exception as err:
            print(name, "failed:", err)
    parsl.clear()
"""


def test_parsl_verifies_a_private_ca_given_as_ca_bundle(parsl_venv: Venv, minio_tls: MinioServer, tls_bucket: str,
                                                       tmp_path: Path) -> None:
    """``S3Staging(ca_bundle=...)``: a store with a private CA, verified; refused without it; an
    unreadable bundle refused when the provider is made, naming it."""
    bin_dir, env = parsl_venv
    _boto(minio_tls).put_object(Bucket=tls_bucket, Key="in/hello.txt", Body=b"hello, world\n")
    env = dict(env, AWS_ACCESS_KEY_ID=minio_tls.access_key, AWS_SECRET_ACCESS_KEY=minio_tls.secret_key)
    done = run([str(bin_dir / "python"), "-c", PARSL_TLS, minio_tls.endpoint, str(minio_tls.ca_file), tls_bucket,
                str(tmp_path)], env, tmp_path, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    lines = done.stdout.splitlines()
    assert f"S3Staging(ca_bundle)={tmp_path}/missing-ca.pem: cannot load CA certificates" in lines[0], lines
    assert "with ok" in lines, lines
    assert any(line.startswith("without failed:") and "TLS certificate verification failed" in line for line in lines), lines
    assert _boto(minio_tls).get_object(Bucket=tls_bucket, Key="out/with.txt")["Body"].read() == b"HELLO, WORLD\n"


def _parsl(venv: Venv, kind: str, endpoint: str, bucket: str, tasks: int, bundles: bool, minio: MinioServer,
           tmp_path: Path) -> List[int]:
    bin_dir, env = venv
    env = dict(env, AWS_ACCESS_KEY_ID=minio.access_key, AWS_SECRET_ACCESS_KEY=minio.secret_key)
    done = run([str(bin_dir / "python"), str(ENGINES / "parsl_run.py"), kind, endpoint, bucket, str(tasks),
                str(FILES), "1" if bundles else "0", str(tmp_path)], env, tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    counts: List[int] = json.loads(done.stdout.strip().splitlines()[-1])["counts"]
    return counts


def _expected(tasks: int) -> Tuple[Dict[str, bytes], bytes]:
    outputs = {f"out/t{t}/f{i}.txt": _content(t * 100 + i).upper() for t in range(tasks) for i in range(FILES)}
    return outputs, b"".join(outputs[f"out/t{t}/f{i}.txt"] for t in range(tasks) for i in range(FILES))


def test_parsl_thread_pool_run_stages_s3_files_in_and_out(parsl_venv: Venv, minio: MinioServer, bucket: str,
                                                          counted: TcpProxy, tmp_path: Path) -> None:
    tasks = 2
    client = _boto(minio)
    for t in range(tasks):
        for i in range(FILES):
            client.put_object(Bucket=bucket, Key=f"in/t{t}/f{i}.txt", Body=_content(t * 100 + i))
    counted.reset_counters()
    assert _parsl(parsl_venv, "threads", counted.url(), bucket, tasks, False, minio, tmp_path) == \
        [FILES] * tasks + [FILES * tasks]
    outputs, summary = _expected(tasks)
    for key, body in outputs.items():
        assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == body, key
    assert client.get_object(Bucket=bucket, Key="summary.txt")["Body"].read() == summary
    methods = counted.requests_by_method
    assert methods.get("PUT") == tasks * FILES + 1, methods
    assert methods.get("GET") == 2 * tasks * FILES, methods
    # one warm pool per task and direction, not a connection per file (4 threads each)
    assert counted.connections <= 4 * (2 * tasks + 2), counted.snapshot()


def test_parsl_task_with_a_missing_input_fails_naming_it_and_runs_no_app(parsl_venv: Venv, minio: MinioServer,
                                                                          bucket: str, tmp_path: Path) -> None:
    bin_dir, env = parsl_venv
    client = _boto(minio)
    client.put_object(Bucket=bucket, Key="in/t0/f0.txt", Body=b"present")
    env = dict(env, AWS_ACCESS_KEY_ID=minio.access_key, AWS_SECRET_ACCESS_KEY=minio.secret_key)
    done = run([str(bin_dir / "python"), str(ENGINES / "parsl_run.py"), "threads", minio.endpoint, bucket, "1", "2",
                "0", str(tmp_path)], env, tmp_path, timeout=600)
    assert done.returncode != 0
    assert f"s3://{bucket}/in/t0/f1.txt" in done.stderr, done.stderr[-3000:]
    assert "NotFound" in done.stderr, done.stderr[-3000:]
    assert "Contents" not in client.list_objects_v2(Bucket=bucket, Prefix="out/")  # the app never ran


@pytest.mark.parametrize("threads", [0, -2, "8", 2.5])
def test_parsl_staging_refuses_a_bad_thread_count_once_when_made(threads: object) -> None:
    """Before, S3Staging took any ``threads`` and every task then failed in its worker."""
    from transfer.errors import InvalidInput
    from transfer.integrations.parsl_staging import S3Staging

    with pytest.raises(InvalidInput, match=r"^config: S3Staging threads must be a whole number of at least 1 "
                                           r"\(got " + re.escape(repr(threads)) + r"\)$"):
        S3Staging(endpoint_url="http://127.0.0.1:9", threads=threads)  # type: ignore[arg-type]
    assert S3Staging(threads=1).threads == 1


PARSL_NAMES = """
import os, sys
import parsl
from parsl.app.app import python_app
from parsl.config import Config
from parsl.data_provider.files import File
from parsl.executors import ThreadPoolExecutor
from transfer.integrations.parsl_staging import S3Staging
@python_app
def joined(inputs=(), outputs=()):
    with open(outputs[0].filepath, "wb") as out:
        out.write(b"|".join(open(f.filepath, "rb").read() for f in inputs))
endpoint, bucket, names, run = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4]
config = Config(executors=[ThreadPoolExecutor(storage_access=[S3Staging(endpoint_url=endpoint)],
                                              working_dir=os.path.join(run, "work"))],
                run_dir=os.path.join(run, "runinfo"), usage_tracking=0)
with parsl.load(config):
    inputs = [File(f"s3://{bucket}/in/{name}") for name in names]
    job = joined(inputs=inputs, outputs=[File(f"s3://{bucket}/joined")])
    job.result()
    job.outputs[0].result()
"""


def test_parsl_inputs_whose_keys_differ_after_a_question_mark_or_hash_stay_apart(
        parsl_venv: Venv, minio: MinioServer, bucket: str, tmp_path: Path) -> None:
    """The local path came from Parsl's URL parse (query and fragment dropped), the download
    from the whole key: ``in/h``, ``in/h#2`` and ``in/h?v=3`` all landed on ``BUCKET/in/h``, and
    the app read one object's bytes three times."""
    bin_dir, env = parsl_venv
    names = ["h", "h#2", "h?v=3"]
    for name in names:
        _boto(minio).put_object(Bucket=bucket, Key=f"in/{name}", Body=name.encode())
    env = dict(env, AWS_ACCESS_KEY_ID=minio.access_key, AWS_SECRET_ACCESS_KEY=minio.secret_key)
    done = run([str(bin_dir / "python"), "-c", PARSL_NAMES, minio.endpoint, bucket, ",".join(names), str(tmp_path)],
               env, tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert _boto(minio).get_object(Bucket=bucket, Key="joined")["Body"].read() == b"h|h#2|h?v=3"


PARSL_ESCAPE = """
import os, sys
import parsl
from parsl.app.app import python_app
from parsl.config import Config
from parsl.data_provider.files import File
from parsl.executors import ThreadPoolExecutor
from transfer.integrations.parsl_staging import S3Staging
@python_app
def write(run, outputs=()):
    open(os.path.join(run, "app-ran"), "wb").close()
    with open(outputs[0].filepath, "wb") as out:
        out.write(b"escaped")
endpoint, bucket, key, run = sys.argv[1:5]
config = Config(executors=[ThreadPoolExecutor(storage_access=[S3Staging(endpoint_url=endpoint)],
                                              working_dir=os.path.join(run, "work"))],
                run_dir=os.path.join(run, "runinfo"), usage_tracking=0)
with parsl.load(config):
    job = write(run, outputs=[File(f"s3://{bucket}/{key}")])
    job.result()
"""


def test_parsl_key_with_dot_dot_is_refused_naming_it_not_placed_outside_the_work_dir(
        parsl_venv: Venv, minio: MinioServer, bucket: str, tmp_path: Path) -> None:
    """A key's ``..`` components went into the local path as they were: the app ran with its
    output (a download: its input) at ``work/BUCKET/out/../../../x``, outside the staging
    directory (AWS keys may hold ``..``; MinIO refuses them, hence an output here)."""
    bin_dir, env = parsl_venv
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    key = "out/../../../escaped.txt"
    env = dict(env, AWS_ACCESS_KEY_ID=minio.access_key, AWS_SECRET_ACCESS_KEY=minio.secret_key)
    done = run([str(bin_dir / "python"), "-c", PARSL_ESCAPE, minio.endpoint, bucket, key, str(run_dir)],
               env, tmp_path, timeout=600)
    assert done.returncode != 0
    assert f"s3://{bucket}/{key}" in done.stderr and "InvalidInput" in done.stderr, done.stderr[-3000:]
    assert not (run_dir / "app-ran").exists() and not list(tmp_path.rglob("escaped.txt"))


def _bundled_inputs(minio: MinioServer, bucket: str, tasks: int, tmp_path: Path) -> None:
    """The inputs of each task as one bundle (one batch with bundling on)."""
    creds = minio.write_pegasus_credentials(tmp_path / "creds.conf", site="minio", user="test")
    env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true"}
    local = tmp_path / "inputs"
    local.mkdir()
    ops = []
    for t in range(tasks):
        for i in range(FILES):
            path = local / f"t{t}f{i}"
            path.write_bytes(_content(t * 100 + i))
            ops.append(Transfer((parse_url(str(path)),), parse_url(f"s3://test@minio/{bucket}/in/t{t}/f{i}.txt",
                                                                   site_label="minio")))
    with Session(Settings(bundle=True), env) as session:
        assert all(r.ok for r in Engine(session).run(ops))


def test_parsl_htex_run_stages_each_tasks_files_in_one_batch(parsl_venv: Venv, minio: MinioServer, bucket: str,
                                                             counted: TcpProxy, tmp_path: Path) -> None:
    tasks = 2
    _bundled_inputs(minio, bucket, tasks, tmp_path)
    assert len(_boto(minio).list_objects_v2(Bucket=bucket)["Contents"]) == tasks  # one bundle per task
    counted.reset_counters()
    assert _parsl(parsl_venv, "htex", counted.url(), bucket, tasks, True, minio, tmp_path) == \
        [FILES] * tasks + [FILES * tasks]
    methods = counted.requests_by_method
    # Outputs: one bundle PUT per task (FILES files each), one plain PUT for the summary.
    assert methods.get("PUT") == tasks + 1, methods
    # Inputs: per task and for the summary, per directory one LIST and one ranged GET of the
    # bundle's head (which holds every member): 2 per directory read, never one per file.
    assert methods.get("GET") == 2 * tasks + 2 * tasks, methods
    outputs, summary = _expected(tasks)
    scratch = tmp_path / "check"
    creds = minio.write_pegasus_credentials(tmp_path / "check.conf", site="minio", user="test")
    env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true"}
    keys = sorted(outputs) + ["summary.txt"]
    with Session(Settings(), env) as session:
        results = Engine(session).run([Transfer((parse_url(f"s3://test@minio/{bucket}/{key}", site_label="minio"),),
                                                parse_url(str(scratch / key))) for key in keys])
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    for key, body in outputs.items():
        assert (scratch / key).read_bytes() == body, key
    assert (scratch / "summary.txt").read_bytes() == summary
