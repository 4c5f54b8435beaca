"""The naive google-cloud-storage baseline: one fresh Python process and client per file.

This is what a per-file tool does (the stock pegasus-transfer runs one ``gsutil`` process per
gs:// file): ``python -m pegasus_cloudio_bench.naive_gcs --threads T get|put < pairs.json``
reads ``[[bucket, key, path], ...]`` and runs, T at a time,
``python -m pegasus_cloudio_bench.naive_gcs one get|put BUCKET KEY PATH``, each of which
builds ``storage.Client()`` (the emulator comes from ``STORAGE_EMULATOR_HOST``) and calls
``download_to_filename`` or ``upload_from_filename``. Exit status 1 if any file failed.
"""

from __future__ import annotations

import subprocess
import sys
from typing import List, Optional, Sequence

from pegasus_cloudio_bench import per_file

MODULE = "pegasus_cloudio_bench.naive_gcs"  # not __name__, which is "__main__" when run with -m


def one(direction: str, bucket: str, key: str, path: str) -> int:
    """Move one file with a fresh client, the way a per-file script would."""
    from google.cloud import storage

    blob = storage.Client().bucket(bucket).blob(key)
    if direction == "get":
        blob.download_to_filename(path)
    else:
        blob.upload_from_filename(path)
    return 0


def drive(direction: str, threads: int, items: Sequence[Sequence[str]]) -> int:
    """One child process per item, ``threads`` at a time; 1 if any failed."""
    def child(item: Sequence[str]) -> int:
        argv = [sys.executable, "-m", MODULE, "one", direction, *item]
        return subprocess.run(argv, stdin=subprocess.DEVNULL, check=False).returncode

    return per_file.each(child, threads, items)


def main(argv: Optional[List[str]] = None) -> int:
    parser = per_file.parser(MODULE)
    parser.add_argument("args", nargs="+", help="get|put (pairs on stdin), or: one get|put BUCKET KEY PATH")
    args = parser.parse_args(argv)
    if args.args[0] == "one" and len(args.args) == 5:
        return one(*args.args[1:])
    if len(args.args) == 1 and args.args[0] in ("get", "put"):
        return drive(args.args[0], args.threads, per_file.items_on_stdin())
    parser.error("expected get|put, or one get|put BUCKET KEY PATH")
    return 2


if __name__ == "__main__":
    sys.exit(main())
