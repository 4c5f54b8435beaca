"""Every kind of drop-in job a Pegasus workflow runs, many at once, behind a throttling S3 front.

    .venv/bin/python scripts/throttled_ops.py [--tree DIR] [--rate 2] [--jobs 8] [--depth 0] [--json]

MinIO on loopback behind a :class:`~pegasus_cloudio_testbed.throttle.ThrottleFront` that lets
``--rate`` requests per second per prefix through (burst as many) and answers ``503 SlowDown``
beyond; the prefix is the bucket and ``--depth`` directories (0: every job shares one). ``--jobs`` concurrent jobs each run, one after another, the five drop-in steps of a
workflow over 3 files of its own: a mkdir (create_dir), 3 uploads (stage-out), 3 downloads
(stage-in), 3 server-side copies (an s3-to-s3 stage) and 3 removes (cleanup). ``--tree`` runs
another checkout's drop-in (``python -m pegasus_cloudio.dropin`` with that tree first on the
path), for a before-and-after. Printed: per step, the jobs that failed and the first error
line of one; the front's requests and throttle answers; the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pegasus_cloudio_testbed.minio import MinioServer  # noqa: E402
from pegasus_cloudio_testbed.throttle import ThrottleFront  # noqa: E402

BUCKET = "throttled-ops"
STEPS = ("mkdir", "put", "get", "copy", "remove")


def _pair(src: str, dst: str) -> Dict[str, Any]:
    return {"type": "transfer", "src_urls": [{"site_label": "a", "url": src}],
            "dest_urls": [{"site_label": "b", "url": dst}]}


def _specs(job: int, directory: str) -> Dict[str, List[Dict[str, Any]]]:
    base = f"s3://test@minio/{BUCKET}/run{job}"
    return {
        "mkdir": [{"type": "mkdir", "target": {"site_label": "b", "url": f"{base}/"}}],
        "put": [_pair(f"file://{directory}/in{k}", f"{base}/f{k}") for k in range(3)],
        "get": [_pair(f"{base}/f{k}", f"file://{directory}/out{k}") for k in range(3)],
        "copy": [_pair(f"{base}/f{k}", f"{base}/copy{k}") for k in range(3)],
        "remove": [{"type": "remove", "target": {"site_label": "b", "url": f"{base}/f{k}"}} for k in range(3)],
    }


def _job(job: int, root: str, env: Dict[str, str]) -> Dict[str, Optional[str]]:
    """Step -> None when it exited 0, else its first ERROR line."""
    directory = os.path.join(root, f"job{job}")
    os.makedirs(directory)
    for k in range(3):
        with open(os.path.join(directory, f"in{k}"), "wb") as out:
            out.write(os.urandom(1000))
    outcome: Dict[str, Optional[str]] = {}
    for step, spec in _specs(job, directory).items():
        run = subprocess.run([sys.executable, "-m", "pegasus_cloudio.dropin"], input=json.dumps(spec).encode(),
                             env=env, capture_output=True, cwd=directory, check=False)
        errors = [line for line in run.stderr.decode(errors="replace").splitlines() if "ERROR" in line]
        outcome[step] = None if run.returncode == 0 else (errors[0] if errors else f"exit {run.returncode}")
    return outcome


def measure(tree: str, rate: float, jobs: int, depth: int) -> Dict[str, Any]:
    with MinioServer() as server, tempfile.TemporaryDirectory() as root:
        import boto3
        boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=server.access_key,
                     aws_secret_access_key=server.secret_key, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        with ThrottleFront(server.host, server.port, rate=rate, depth=depth) as front:
            creds = server.write_pegasus_credentials(os.path.join(root, "creds.conf"), endpoint=front.endpoint)
            env = dict(os.environ, PEGASUS_CREDENTIALS=str(creds), HOME=root, PEGASUS_CLOUDIO_CONFIG=os.devnull,
                       PEGASUS_CLOUDIO_CACHE_DIR="off", AWS_EC2_METADATA_DISABLED="true",
                       PYTHONPATH=os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH", "")) if p))
            started = time.monotonic()
            with ThreadPoolExecutor(jobs) as pool:
                outcomes = list(pool.map(lambda j: _job(j, root, env), range(jobs)))
            wall = time.monotonic() - started
            stats = front.stats()
    failed: Dict[str, Tuple[int, str]] = {}
    for step in STEPS:
        errors = [o[step] for o in outcomes if o[step] is not None]
        failed[step] = (len(errors), errors[0][-200:] if errors else "")
    return {"tree": tree, "rate": rate, "jobs": jobs, "depth": depth, "wall_s": round(wall, 1),
            "requests": stats["requests"], "throttled": stats["throttled"],
            "failed_jobs": {step: n for step, (n, _) in failed.items()},
            "first_error": {step: text for step, (_, text) in failed.items() if text}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="the checkout whose drop-in runs (default: this one)")
    parser.add_argument("--rate", type=float, default=2.0, help="requests/s per prefix the front lets through")
    parser.add_argument("--jobs", type=int, default=8, help="concurrent jobs")
    parser.add_argument("--depth", type=int, default=0, help="key directories in the front's prefix (0: the bucket)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(os.path.abspath(args.tree), args.rate, args.jobs, args.depth)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{args.jobs} jobs at {args.rate:g} requests/s per prefix, {result['wall_s']} s: "
              f"{result['requests']} requests, {result['throttled']} answered 503 SlowDown")
        for step in STEPS:
            print(f"  {step:7s} failed jobs {result['failed_jobs'][step]}/{args.jobs}  "
                  f"{result['first_error'].get(step, '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
