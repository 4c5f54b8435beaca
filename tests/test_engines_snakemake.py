"""The Snakemake storage plugin as users get it: the wheel installed with ``[snakemake]`` into a
fresh venv (pinned: requirements/snakemake/), against MinIO behind a counting proxy: its
interface package's own ``TestStorageBase``, unmodified (tests/engines/snakemake_suite.py), and
a real ``snakemake`` run of a many-small-files workflow with the plugin as the default storage
provider; outputs byte-exact, inputs staged in one batch. Helpers: tests/engines_support.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from engines_support import ENGINES, FILES, Venv, as_tested, blocks, boto, content, make_engine_venv
from engines_support import counted, tls_bucket, wheel  # noqa: F401 - fixtures
from installed import REPO, run
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import TcpProxy


@pytest.fixture(scope="module")
def snakemake_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """``[snakemake]`` held to its own lock (it conflicts with the main one: see the file)."""
    lock = REPO / "requirements" / "snakemake" / "snakemake.txt"
    return make_engine_venv(tmp_path_factory.mktemp("snakemake"), "-c", str(lock), f"{wheel}[snakemake]", "pytest")


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


def _storage_base_suite(snakemake_venv: Venv, tmp_path: Path, **suite_env: str) -> None:
    """tests/engines/snakemake_suite.py run in the venv against the store ``suite_env`` names."""
    bin_dir, env = snakemake_venv
    shutil.copy(ENGINES / "snakemake_suite.py", tmp_path / "test_suite.py")
    done = run([str(bin_dir / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                "-c", os.devnull, "test_suite.py"], dict(env, **suite_env), tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    assert "8 passed" in done.stdout, done.stdout[-2000:]  # 4 tests x 2 classes (touch = True), none skipped


def test_snakemake_storage_base_suite_passes_unmodified(snakemake_venv: Venv, minio: MinioServer, bucket: str,
                                                        tmp_path: Path) -> None:
    _storage_base_suite(snakemake_venv, tmp_path, SUITE_ROOT=f"s3://{bucket}", SUITE_ENDPOINT=minio.endpoint,
                        SUITE_ACCESS_KEY=minio.access_key, SUITE_SECRET_KEY=minio.secret_key)


def test_snakemake_storage_base_suite_passes_unmodified_on_azure(snakemake_venv: Venv, azurite, azure_container: str,
                                                                 tmp_path: Path) -> None:
    _storage_base_suite(snakemake_venv, tmp_path, SUITE_ROOT=f"az://{azurite.account}/{azure_container}",
                        AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string)


def test_snakemake_workflow_with_the_plugin_as_default_storage(snakemake_venv: Venv, minio: MinioServer,
                                                               bucket: str, counted: TcpProxy,
                                                               tmp_path: Path) -> None:
    bin_dir, env = snakemake_venv
    client = boto(minio)
    for i in range(FILES):
        client.put_object(Bucket=bucket, Key=f"wf/inputs/in{i}.txt", Body=content(i))
        client.put_object(Bucket=bucket, Key=f"wf/extra/x{i}.txt", Body=content(1000 + i))
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
    parts = [content(i).upper() for i in range(FILES)]
    for i in range(FILES):
        assert client.get_object(Bucket=bucket, Key=f"wf/parts/up{i}.txt")["Body"].read() == parts[i]
    summary = client.get_object(Bucket=bucket, Key="wf/summary.txt")["Body"].read()
    assert summary == b"".join(parts) + b"".join(content(1000 + i) for i in range(FILES))
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
    boto(minio).put_object(Bucket=bucket, Key="run/out/other.txt", Body=b"listed")
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
    boto(minio).put_object(Bucket=bucket, Key="here/present.txt", Body=b"present")
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
    boto(minio).put_object(Bucket=bucket, Key="here.txt", Body=b"x")
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
    boto(minio_tls).put_object(Bucket=tls_bucket, Key="run1/in/hello.txt", Body=b"hello, world\n")
    [snakefile] = blocks("snakemake")
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
    assert boto(minio_tls).get_object(Bucket=tls_bucket, Key="run1/out/hello.txt")["Body"].read() == b"HELLO, WORLD\n"
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
    boto(minio).put_object(Bucket=bucket, Key="run1/in/hello.txt", Body=b"hello, world\n")
    [snakefile] = blocks("snakemake")
    (tmp_path / "Snakefile").write_text(snakefile)
    [command] = [c for c in blocks("sh") if c.startswith("snakemake ")]
    env = dict(env, AWS_ACCESS_KEY_ID=minio.access_key, AWS_SECRET_ACCESS_KEY=minio.secret_key)
    done = run(["bash", "-c", as_tested(command, minio, bucket)], env, tmp_path, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert boto(minio).get_object(Bucket=bucket, Key="run1/out/hello.txt")["Body"].read() == b"HELLO, WORLD\n"
