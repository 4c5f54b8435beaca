"""ListMultipartUploads for ``lsup``/``rmup`` (pegasus-s3 4.x had both; 5.1.3 dropped them).

A protocol-level helper on the backend's signed requests; like ``list_buckets`` it belongs in
:class:`transfer.backends.s3.S3Backend` as an optional capability (that file is owned elsewhere).
Uploads that were neither completed nor aborted (a killed client, a crashed server) keep
their parts, billed, until removed; a bucket lifecycle rule
(``AbortIncompleteMultipartUpload``) is the hands-off remedy (docs/s3.md in the user guide).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, Optional

from transfer.backends import s3
from transfer.backends._s3_wire import xml_tree
from transfer.errors import InvalidInput


@dataclass(frozen=True)
class Upload:
    key: str
    upload_id: str
    initiated: str


def list_uploads(backend: object, bucket: str, prefix: Optional[str] = None) -> Iterator[Upload]:
    """Every upload in progress in ``bucket`` whose key starts with ``prefix`` (all pages).

    The prefix is applied here, not sent: MinIO matches a ``prefix`` only as a whole key."""
    if not isinstance(backend, s3.S3Backend):
        raise InvalidInput("listing multipart uploads needs an S3 endpoint", operation="list")
    markers: Dict[str, str] = {}
    while True:
        query = {"uploads": "", **markers}
        url = f"s3 uploads in {bucket}"
        with backend._send("GET", s3.S3Path(bucket, ""), query=query, url=url) as response:  # noqa: SLF001
            backend._check(response, url, "list")  # noqa: SLF001
            root = xml_tree(response.read())
        for item in root.iter("Upload"):
            key = item.findtext("Key") or ""
            if not prefix or key.startswith(prefix):
                yield Upload(key, item.findtext("UploadId") or "", item.findtext("Initiated") or "-")
        key_marker, id_marker = root.findtext("NextKeyMarker"), root.findtext("NextUploadIdMarker")
        if root.findtext("IsTruncated") != "true" or not (key_marker or id_marker):
            return
        markers = {"key-marker": key_marker or "", "upload-id-marker": id_marker or ""}
