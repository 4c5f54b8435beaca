"""Peak RSS of a long stage-in with the drop-in's cyclic-collector threshold and with Python's.

    .venv/bin/python scripts/gc_threshold_rss.py [--count 6000] [--size 300] [--rounds 2] [--missing]

The wheel's ``pegasus-cloudio-transfer-py`` code stages ``--count`` objects of ``--size``
bytes in from MinIO (8 threads, node cache off), alternating ``launch.GC_THRESHOLD`` between
10,000 (what the drop-in sets) and 700 (Python's default). ``--missing`` stages in objects
that do not exist (every file fails). Per run: the exit status, peak RSS (``wait4``), wall and
CPU seconds, and, in the last round, the objects the collector found in cycles over the whole
run and in how many collections. A development measurement (review of commit 58c2a27).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pegasus_cloudio_bench.harness import make_inputs, tool_env  # noqa: E402
from pegasus_cloudio_bench.small_files import transfer_spec  # noqa: E402
from pegasus_cloudio_testbed.minio import MinioServer  # noqa: E402
from pegasus_cloudio_testbed.wheel import installed_bin  # noqa: E402

SITE, USER = "minio", "bench"
THRESHOLDS = (10_000, 700)
# The drop-in as its script starts it, with launch.GC_THRESHOLD set from the environment and,
# with R9_COUNT, the collector's findings summed over the run (printed last on stderr).
PROBE = r'''
import atexit, gc, os, sys
found = [0, 0]
def count(phase, info):
    if phase == "stop":
        found[0] += info["collected"]
        found[1] += 1
if os.environ.get("R9_COUNT"):
    gc.callbacks.append(count)
    atexit.register(lambda: os.write(2, b"cycles: %d objects in %d collections\n" % tuple(found)))
import pegasus_cloudio.dropin.launch as launch
launch.GC_THRESHOLD = int(os.environ["R9_THRESHOLD"])
sys.argv[0] = os.path.join(os.path.dirname(sys.executable), "pegasus-cloudio-transfer-py")
launch.console_main()
'''


def run(python: str, env: Dict[str, str], spec: bytes, threshold: int, count: bool) -> Tuple[int, float, float, float, str]:
    """(exit status, peak RSS MiB, wall s, CPU s, the cycles line) of one drop-in run."""
    env = dict(env, R9_THRESHOLD=str(threshold), **({"R9_COUNT": "1"} if count else {}))
    started = time.monotonic()
    proc = subprocess.Popen([python, "-c", PROBE, "--threads", "8"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stderr is not None
    errors: List[bytes] = []
    reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()))  # type: ignore[union-attr]
    reader.start()
    proc.stdin.write(spec)
    proc.stdin.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join()
    lines = errors[0].decode(errors="replace").splitlines()
    cycles = next((line for line in lines if line.startswith("cycles:")), "")
    return (proc.returncode, usage.ru_maxrss / 1024, time.monotonic() - started, usage.ru_utime + usage.ru_stime,
            cycles)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=6000)
    parser.add_argument("--size", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--missing", action="store_true", help="objects that do not exist (every file fails)")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="gc-threshold-rss-")
    try:
        python = os.path.join(installed_bin(os.path.join(root, "wheel")), "python")
        with MinioServer() as server:
            bucket = f"gc-{uuid.uuid4().hex[:8]}"
            creds = server.write_pegasus_credentials(os.path.join(root, "credentials.conf"), site=SITE, user=USER)
            env = tool_env({"PEGASUS_CREDENTIALS": str(creds), "PEGASUS_CLOUDIO_CONFIG": os.devnull, "HOME": root,
                            "AWS_EC2_METADATA_DISABLED": "true"})
            src, names = make_inputs(root, args.count, args.size)
            prefix = f"s3://{USER}@{SITE}/{bucket}"
            mkdir = b'[{"type": "mkdir", "target": {"site_label": "%s", "url": "%s"}}]' % (SITE.encode(), prefix.encode())
            assert run(python, env, mkdir, 700, False)[0] == 0, "cannot create the bucket"
            if not args.missing:
                out = transfer_spec([(f"file://{src}/{n}", f"{prefix}/d/{n}") for n in names], "local", SITE)
                assert run(python, env, out, 700, False)[0] == 0, "stage-out failed"
            folder = "missing" if args.missing else "d"
            for number in range(args.rounds):
                for threshold in THRESHOLDS:
                    dest = os.path.join(root, f"in-{threshold}-{number}")
                    spec = transfer_spec([(f"{prefix}/{folder}/{n}", f"file://{dest}/{n}") for n in names], SITE,
                                         "local")
                    code, rss, wall, cpu, cycles = run(python, env, spec, threshold, number == args.rounds - 1)
                    print(f"threshold {threshold:6d} round {number}: exit {code}, peak RSS {rss:.1f} MiB, "
                          f"wall {wall:.2f} s, CPU {cpu:.2f} s {cycles}", flush=True)
                    shutil.rmtree(dest, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
