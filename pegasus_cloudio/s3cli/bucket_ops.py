"""ListBuckets, the one S3 request pegasus-s3 needs that the backend contract lacks.

This is deliberately tiny and protocol-level: it reuses the backend's signed-request
plumbing (connection pool, SigV4, error translation) and only adds the request itself.
It belongs in :class:`transfer.backends.s3.S3Backend` as an optional capability
(``list_buckets() -> List[str]``); until then it lives here.
"""

from __future__ import annotations

from typing import List

from transfer.backends import s3
from transfer.errors import InvalidInput


def list_buckets(backend: object) -> List[str]:
    """Names of the buckets the identity owns, in the store's order."""
    if not isinstance(backend, s3.S3Backend):
        raise InvalidInput("listing buckets needs an S3 endpoint", operation="list")
    root = s3.S3Path("", "")
    with backend._send("GET", root, url="s3 buckets") as response:  # noqa: SLF001 - see module doc
        backend._check(response, "s3 buckets", "list")  # noqa: SLF001
        tree = s3._xml(response.read())  # noqa: SLF001
    return [item.findtext("Name") or "" for item in tree.iter("Bucket")]
