"""Open multipart uploads for ``lsup``/``rmup`` (pegasus-s3 4.x had both; 5.1.3 dropped them),
on the backend's :class:`~transfer.backends.base.PendingUploads` capability.

Uploads that were neither completed nor aborted (a killed client, a crashed server) keep
their parts, billed, until removed. The engine aborts a key's old ones when it next uploads
that key (:mod:`transfer.uploads`); ``rmup -a --older-than`` sweeps a bucket from a cron;
a bucket lifecycle rule (``AbortIncompleteMultipartUpload``) is the store-side guard
(docs/s3.md).
"""

from __future__ import annotations

import time
from typing import Iterator, Optional

from transfer.backends.base import pending_uploads
from transfer.errors import InvalidInput
from transfer.lean import record
from transfer.urls import Url

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@record(frozen=True)
class Upload:
    key: str
    upload_id: str
    initiated: str
    age: Optional[float] = None  # seconds since it started, by this host's clock


def list_uploads(backend: object, url: Url) -> Iterator[Upload]:
    """Every upload in progress whose key starts with ``url``'s key (all pages)."""
    listing = pending_uploads(backend)
    if listing is None:
        raise InvalidInput("listing multipart uploads needs an S3 endpoint", operation="list")
    now = time.time()
    for found in listing.pending_uploads(url, whole_key=False):
        started = found.initiated
        text = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)) if started is not None else "-"
        yield Upload(found.key, found.upload_id, text, None if started is None else now - started)


def parse_duration(text: str) -> float:
    """``"90"``, ``"90s"``, ``"30m"``, ``"12h"``, ``"7d"``, ``"2w"`` -> seconds; InvalidInput otherwise."""
    body = text.strip().lower()
    unit = body[-1:] if body[-1:] in _UNITS else "s"
    digits = body[:-1] if body[-1:] in _UNITS else body
    if not (digits.isascii() and digits.isdigit()):
        raise InvalidInput(f"--older-than {text!r} is not a duration (e.g. 90s, 30m, 12h, 7d)", operation="rmup")
    return int(digits) * _UNITS[unit]
