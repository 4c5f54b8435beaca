"""A real Parsl run whose apps take s3:// files in and out through S3Staging.

Run by tests/test_engines.py with the venv's python (the wheel installed with ``[parsl]``)::

    parsl_run.py threads|htex ENDPOINT BUCKET TASKS FILES BUNDLES RUN_DIR

``TASKS`` tasks each upper-case ``FILES`` inputs ``in/tT/fI.txt`` into ``out/tT/fI.txt``; one
more task concatenates every output (their DataFutures) into ``summary.txt``. Keys come from
the environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), or with ``PARSL_KEYS=KEY:SECRET`` are
given to S3Staging as ``key``/``secret``. With ``PARSL_STORE=az`` the files are
``az://BUCKET/...`` (BUCKET is ``ACCOUNT/CONTAINER``, ENDPOINT is ignored) through AzureStaging,
credentials from the environment (AZURE_STORAGE_CONNECTION_STRING). Prints one JSON line.
"""

import json
import os
import sys

import parsl
from parsl.app.app import python_app
from parsl.config import Config
from parsl.data_provider.files import File
from parsl.executors import HighThroughputExecutor, ThreadPoolExecutor
from parsl.providers import LocalProvider

from transfer.integrations.parsl_staging import AzureStaging, S3Staging


@python_app
def upper(inputs=(), outputs=()):
    for src, dst in zip(inputs, outputs):
        with open(src.filepath, "rb") as fin, open(dst.filepath, "wb") as fout:
            fout.write(fin.read().upper())
    return len(inputs)


@python_app
def concat(inputs=(), outputs=()):
    with open(outputs[0].filepath, "wb") as fout:
        for src in inputs:
            with open(src.filepath, "rb") as fin:
                fout.write(fin.read())
    return len(inputs)


def executor(kind, staging, run_dir):
    work = os.path.join(run_dir, "work")
    if kind == "threads":
        return ThreadPoolExecutor(label="threads", max_threads=2, storage_access=[staging], working_dir=work)
    return HighThroughputExecutor(
        label="htex", address="127.0.0.1", loopback_address="127.0.0.1", max_workers_per_node=2,
        cores_per_worker=1, storage_access=[staging], working_dir=work,
        provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1))


def main(argv):
    kind, endpoint, bucket, tasks, files, bundles, run_dir = argv
    tasks, files = int(tasks), int(files)
    key, _, secret = os.environ.get("PARSL_KEYS", "").partition(":")
    azure = os.environ.get("PARSL_STORE") == "az"
    if azure:
        staging = AzureStaging(threads=4, bundles=bundles == "1")
    else:
        staging = S3Staging(endpoint_url=endpoint, threads=4, bundles=bundles == "1", key=key or None,
                            secret=secret or None)
    config = Config(executors=[executor(kind, staging, run_dir)], run_dir=os.path.join(run_dir, "runinfo"),
                    usage_tracking=0, strategy="none")
    s3 = f"az://{bucket}" if azure else f"s3://{bucket}"
    with parsl.load(config):
        jobs = [upper(inputs=[File(f"{s3}/in/t{t}/f{i}.txt") for i in range(files)],
                      outputs=[File(f"{s3}/out/t{t}/f{i}.txt") for i in range(files)]) for t in range(tasks)]
        counts = [job.result() for job in jobs]
        summary = concat(inputs=[out for job in jobs for out in job.outputs], outputs=[File(f"{s3}/summary.txt")])
        counts.append(summary.result())
        summary.outputs[0].result()
    print(json.dumps({"counts": counts}))


if __name__ == "__main__":
    main(sys.argv[1:])
