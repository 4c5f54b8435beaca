"""The azure-storage-blob baseline: one client, a thread pool, ``download_blob``/``upload_blob`` per file.

What a Python engine would write on Microsoft's client (the issue's fallback comparison: the
Azure CLI's ``az storage blob download`` per file does not install here):
``python -m pegasus_cloudio_bench.naive_azure --threads T get|put < items.json`` reads
``[[container, blob, path], ...]``, opens one ``BlobServiceClient`` from
``AZURE_STORAGE_CONNECTION_STRING`` and moves every file through a ``ThreadPoolExecutor`` of T
threads. Exit status 1 if any file failed.
"""

from __future__ import annotations

import os
import sys
from typing import Any, List, Optional, Sequence

from pegasus_cloudio_bench import per_file

MODULE = "pegasus_cloudio_bench.naive_azure"  # not __name__, which is "__main__" when run with -m


def drive(direction: str, threads: int, items: Sequence[Sequence[str]]) -> int:
    """Every item through one client's thread pool; 1 if any failed."""
    from azure.storage.blob import BlobServiceClient

    service: Any = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])

    def one(item: Sequence[str]) -> int:
        container, blob, path = item
        client = service.get_blob_client(container, blob)
        try:
            if direction == "get":
                with open(path, "wb") as sink:
                    client.download_blob().readinto(sink)
            else:
                with open(path, "rb") as source:
                    client.upload_blob(source, overwrite=True)
        except Exception as err:  # noqa: BLE001 - the baseline counts failures, as a script would
            print(f"{blob}: {type(err).__name__}: {err}", file=sys.stderr)
            return 1
        return 0

    return per_file.each(one, threads, items)


def main(argv: Optional[List[str]] = None) -> int:
    parser = per_file.parser(MODULE)
    per_file.add_direction(parser)
    args = parser.parse_args(argv)
    return drive(args.direction, args.threads, per_file.items_on_stdin())


if __name__ == "__main__":
    sys.exit(main())
