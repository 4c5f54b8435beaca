"""The Parsl staging provider as users get it: the wheel installed with ``[parsl]`` into a fresh
venv (pinned: requirements/parsl.txt), against MinIO behind a counting proxy: real runs on a
ThreadPoolExecutor and a HighThroughputExecutor on loopback whose apps take s3:// files in and
out; byte-exact outputs; each task's files in one engine batch, shown by request counts
(bundles: one PUT per task's outputs, not one per file). Also: without its extra, each
engine's import names the extra to install. The Snakemake plugin's tests are in
tests/test_engines_snakemake.py; the helpers of both in tests/engines_support.py.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from engines_support import ENGINES, FILES, Venv, as_tested, blocks, boto, content, make_engine_venv
from engines_support import counted, tls_bucket, wheel  # noqa: F401 - fixtures
from installed import constraints_file, run
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.proxy import TcpProxy
from transfer import Engine, Session, Settings, Transfer, parse_url


@pytest.fixture(scope="module")
def parsl_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    root = tmp_path_factory.mktemp("parsl")
    return make_engine_venv(root, "-c", str(constraints_file(root / "constraints.txt")), f"{wheel}[parsl]")


def test_without_the_extra_the_import_names_it(wheel: Path, tmp_path: Path) -> None:
    bin_dir, env = make_engine_venv(tmp_path, "--no-index", str(wheel))
    for module, extra in (("transfer.integrations.parsl_staging", "parsl"),
                          ("snakemake_storage_plugin_pegasus_cloudio", "snakemake")):
        done = run([str(bin_dir / "python"), "-c", f"import {module}"], env, tmp_path)
        assert done.returncode == 1
        assert done.stderr.rstrip().splitlines()[-1].endswith(f"pip install 'pegasus-cloudio[{extra}]'"), done.stderr


def test_parsl_example_of_the_docs_runs_as_written(parsl_venv: Venv, minio: MinioServer, bucket: str,
                                                   tmp_path: Path) -> None:
    bin_dir, env = parsl_venv
    boto(minio).put_object(Bucket=bucket, Key="in/hello.txt", Body=b"hello, world\n")
    [example] = blocks("python")
    (tmp_path / "example.py").write_text(as_tested(example, minio, bucket))
    env = dict(env, AWS_ACCESS_KEY_ID=minio.access_key, AWS_SECRET_ACCESS_KEY=minio.secret_key)
    done = run([str(bin_dir / "python"), "example.py"], env, tmp_path, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert boto(minio).get_object(Bucket=bucket, Key="out/hello.txt")["Body"].read() == b"HELLO, WORLD\n"


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
    boto(minio_tls).put_object(Bucket=tls_bucket, Key="in/hello.txt", Body=b"hello, world\n")
    env = dict(env, AWS_ACCESS_KEY_ID=minio_tls.access_key, AWS_SECRET_ACCESS_KEY=minio_tls.secret_key)
    done = run([str(bin_dir / "python"), "-c", PARSL_TLS, minio_tls.endpoint, str(minio_tls.ca_file), tls_bucket,
                str(tmp_path)], env, tmp_path, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    lines = done.stdout.splitlines()
    assert f"S3Staging(ca_bundle)={tmp_path}/missing-ca.pem: cannot load CA certificates" in lines[0], lines
    assert "with ok" in lines, lines
    assert any(line.startswith("without failed:") and "TLS certificate verification failed" in line for line in lines), lines
    assert boto(minio_tls).get_object(Bucket=tls_bucket, Key="out/with.txt")["Body"].read() == b"HELLO, WORLD\n"


def _parsl(venv: Venv, kind: str, endpoint: str, bucket: str, tasks: int, bundles: bool, minio: MinioServer,
           tmp_path: Path) -> List[int]:
    bin_dir, env = venv
    env = dict(env, AWS_ACCESS_KEY_ID=minio.access_key, AWS_SECRET_ACCESS_KEY=minio.secret_key)
    done = run([str(bin_dir / "python"), str(ENGINES / "parsl_run.py"), kind, endpoint, bucket, str(tasks),
                str(FILES), "1" if bundles else "0", str(tmp_path)], env, tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    counts: List[int] = json.loads(done.stdout.strip().splitlines()[-1])["counts"]
    return counts


def test_parsl_thread_pool_run_stages_az_files_in_and_out(parsl_venv: Venv, azurite, azure_container: str,
                                                          azure_sdk, tmp_path: Path) -> None:
    """AzureStaging on Azurite, credentials from the worker's environment (a connection string)."""
    tasks = 2
    for t in range(tasks):
        for i in range(FILES):
            azure_sdk.upload_blob(f"in/t{t}/f{i}.txt", content(t * 100 + i))
    bin_dir, env = parsl_venv
    env = dict(env, PARSL_STORE="az", AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string)
    done = run([str(bin_dir / "python"), str(ENGINES / "parsl_run.py"), "threads", "-",
                f"{azurite.account}/{azure_container}", str(tasks), str(FILES), "0", str(tmp_path)], env, tmp_path,
               timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["counts"] == [FILES] * tasks + [FILES * tasks]
    outputs, summary = _expected(tasks)
    for name, data in outputs.items():
        assert azure_sdk.get_blob_client(name).download_blob().readall() == data
    assert azure_sdk.get_blob_client("summary.txt").download_blob().readall() == summary


def _expected(tasks: int) -> Tuple[Dict[str, bytes], bytes]:
    outputs = {f"out/t{t}/f{i}.txt": content(t * 100 + i).upper() for t in range(tasks) for i in range(FILES)}
    return outputs, b"".join(outputs[f"out/t{t}/f{i}.txt"] for t in range(tasks) for i in range(FILES))


def test_parsl_thread_pool_run_stages_s3_files_in_and_out(parsl_venv: Venv, minio: MinioServer, bucket: str,
                                                          counted: TcpProxy, tmp_path: Path) -> None:
    tasks = 2
    client = boto(minio)
    for t in range(tasks):
        for i in range(FILES):
            client.put_object(Bucket=bucket, Key=f"in/t{t}/f{i}.txt", Body=content(t * 100 + i))
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
    client = boto(minio)
    client.put_object(Bucket=bucket, Key="in/t0/f0.txt", Body=b"present")
    env = dict(env, AWS_ACCESS_KEY_ID=minio.access_key, AWS_SECRET_ACCESS_KEY=minio.secret_key)
    done = run([str(bin_dir / "python"), str(ENGINES / "parsl_run.py"), "threads", minio.endpoint, bucket, "1", "2",
                "0", str(tmp_path)], env, tmp_path, timeout=600)
    assert done.returncode != 0
    assert f"s3://{bucket}/in/t0/f1.txt" in done.stderr, done.stderr[-3000:]
    assert "NotFound" in done.stderr, done.stderr[-3000:]
    assert "Contents" not in client.list_objects_v2(Bucket=bucket, Prefix="out/")  # the app never ran


def test_parsl_keys_given_to_the_provider_and_one_client_per_worker(parsl_venv: Venv, minio: MinioServer, bucket: str,
                                                                    counted: TcpProxy, tmp_path: Path) -> None:
    """Issue 33: S3Staging took no keys (only the workers' AWS chain), and every task opened its
    own Client: a new pool, so new connections, per task."""
    tasks = 6
    client = boto(minio)
    for t in range(tasks):
        for i in range(FILES):
            client.put_object(Bucket=bucket, Key=f"in/t{t}/f{i}.txt", Body=content(t * 100 + i))
    bin_dir, env = parsl_venv
    assert not any(name.startswith("AWS_ACCESS") for name in env)
    env = dict(env, PARSL_KEYS=f"{minio.access_key}:{minio.secret_key}")
    counted.reset_counters()
    done = run([str(bin_dir / "python"), str(ENGINES / "parsl_run.py"), "threads", counted.url(), bucket, str(tasks),
                str(FILES), "0", str(tmp_path)], env, tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    _, summary = _expected(tasks)
    assert client.get_object(Bucket=bucket, Key="summary.txt")["Body"].read() == summary
    assert counted.connections <= 4 + 2, counted.snapshot()  # one pool of threads + 2, for all 7 tasks
    logs = [path for path in (tmp_path / "runinfo").rglob("*") if path.is_file()]
    assert logs and not [p for p in logs if minio.secret_key.encode() in p.read_bytes()]  # Parsl logs its config


def test_parsl_input_in_a_bucket_that_does_not_exist_fails_naming_it(parsl_venv: Venv, minio: MinioServer,
                                                                     tmp_path: Path) -> None:
    bin_dir, env = parsl_venv
    missing = f"no-such-{uuid.uuid4().hex[:12]}"
    env = dict(env, PARSL_KEYS=f"{minio.access_key}:{minio.secret_key}")
    done = run([str(bin_dir / "python"), str(ENGINES / "parsl_run.py"), "threads", minio.endpoint, missing, "1", "1",
                "0", str(tmp_path)], env, tmp_path, timeout=600)
    assert done.returncode != 0
    assert f"s3://{missing}/in/t0/f0.txt" in done.stderr and "NotFound" in done.stderr, done.stderr[-3000:]


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
        boto(minio).put_object(Bucket=bucket, Key=f"in/{name}", Body=name.encode())
    env = dict(env, AWS_ACCESS_KEY_ID=minio.access_key, AWS_SECRET_ACCESS_KEY=minio.secret_key)
    done = run([str(bin_dir / "python"), "-c", PARSL_NAMES, minio.endpoint, bucket, ",".join(names), str(tmp_path)],
               env, tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert boto(minio).get_object(Bucket=bucket, Key="joined")["Body"].read() == b"h|h#2|h?v=3"


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
            path.write_bytes(content(t * 100 + i))
            ops.append(Transfer((parse_url(str(path)),), parse_url(f"s3://test@minio/{bucket}/in/t{t}/f{i}.txt",
                                                                   site_label="minio")))
    with Session(Settings(bundle=True), env) as session:
        assert all(r.ok for r in Engine(session).run(ops))


def test_parsl_htex_run_stages_each_tasks_files_in_one_batch(parsl_venv: Venv, minio: MinioServer, bucket: str,
                                                             counted: TcpProxy, tmp_path: Path) -> None:
    tasks = 2
    _bundled_inputs(minio, bucket, tasks, tmp_path)
    assert len(boto(minio).list_objects_v2(Bucket=bucket)["Contents"]) == tasks  # one bundle per task
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
