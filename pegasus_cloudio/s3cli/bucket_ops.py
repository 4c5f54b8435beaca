"""ListBuckets, the one S3 request pegasus-s3 needs that the backend contract lacks.

The request itself is :meth:`transfer.backends.s3.S3Backend.list_buckets`; this only checks
that the URL's backend is S3.
"""

from __future__ import annotations

from typing import List

from transfer.backends import s3
from transfer.errors import InvalidInput


def list_buckets(backend: object) -> List[str]:
    """Names of the buckets the identity owns, in the store's order."""
    if not isinstance(backend, s3.S3Backend):
        raise InvalidInput("listing buckets needs an S3 endpoint", operation="list")
    return backend.list_buckets()
