"""ListMultipartUploads for ``lsup``/``rmup`` (pegasus-s3 4.x had both; 5.1.3 dropped them).

A protocol-level helper on the backend's signed requests; like ``list_buckets`` it belongs in
:class:`transfer.backends.s3.S3Backend` as an optional capability (that file is owned elsewhere).
Uploads that were neither completed nor aborted (a killed client, a crashed server) keep
their parts, billed, until removed; a bucket lifecycle rule
(``AbortIncompleteMultipartUpload``) is the hands-off remedy (docs/s3.md in the user guide).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Set, Tuple

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

    Stores disagree on ``prefix``: Amazon S3 matches it as a key prefix and lists everything
    without it, while MinIO lists nothing without it and matches it only as a whole key. So
    with a prefix, two listings are merged: one sent with the prefix (MinIO: the object's own
    uploads; Amazon: all under it) and one without, filtered here (Amazon: the same; MinIO:
    nothing). Each upload is listed once."""
    if not isinstance(backend, s3.S3Backend):
        raise InvalidInput("listing multipart uploads needs an S3 endpoint", operation="list")
    seen: Set[Tuple[str, str]] = set()
    for sent in ([prefix, None] if prefix else [None]):
        for upload in _list_pages(backend, bucket, sent):
            if (upload.key, upload.upload_id) not in seen and upload.key.startswith(prefix or ""):
                seen.add((upload.key, upload.upload_id))
                yield upload


def _list_pages(backend: "s3.S3Backend", bucket: str, prefix: Optional[str]) -> Iterator[Upload]:
    markers: Dict[str, str] = {"prefix": prefix} if prefix else {}
    while True:
        query = {"uploads": "", **markers}
        url = f"s3 uploads in {bucket}"
        with backend._send("GET", s3.S3Path(bucket, ""), query=query, url=url) as response:  # noqa: SLF001
            backend._check(response, url, "list")  # noqa: SLF001
            root = xml_tree(response.read())
        for item in root.iter("Upload"):
            yield Upload(item.findtext("Key") or "", item.findtext("UploadId") or "", item.findtext("Initiated") or "-")
        key_marker, id_marker = root.findtext("NextKeyMarker"), root.findtext("NextUploadIdMarker")
        if root.findtext("IsTruncated") != "true" or not (key_marker or id_marker):
            return
        markers = {**({"prefix": prefix} if prefix else {}),
                   "key-marker": key_marker or "", "upload-id-marker": id_marker or ""}
