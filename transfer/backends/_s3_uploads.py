"""ListMultipartUploads: the uploads a bucket holds open, for the engine's sweep of the ones
an earlier run left behind (:mod:`transfer.uploads`) and for ``pegasus-cloudio-s3 lsup/rmup``.

Stores disagree on ``prefix``: Amazon S3 matches it as a key prefix, while MinIO matches it
only as a whole key and lists nothing without one. So a listing of one key sends the key as
the prefix and keeps that key's uploads (both stores agree there); a listing under a prefix
merges that with a listing without one, filtered here (Amazon: the same; MinIO: nothing).
"""

from __future__ import annotations

from transfer.backends._s3_wire import iso8601_epoch, xml_tree
from transfer.backends.base import PendingUpload

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterator, Optional, Set, Tuple

    # (query) -> the listing's XML body, the request sent and its answer checked
    ListPage = Callable[[Dict[str, str]], bytes]


def pending(list_page: ListPage, prefix: str, whole_key: bool) -> Iterator[PendingUpload]:
    """The open uploads of the key ``prefix`` (``whole_key``) or of every key under it, each once."""
    seen: Set[Tuple[str, str]] = set()
    for sent in ([prefix] if whole_key or not prefix else [prefix, None]):
        for upload in _pages(list_page, sent):
            wanted = upload.key == prefix if whole_key else upload.key.startswith(prefix)
            if wanted and (upload.key, upload.upload_id) not in seen:
                seen.add((upload.key, upload.upload_id))
                yield upload


def _pages(list_page: ListPage, prefix: Optional[str]) -> Iterator[PendingUpload]:
    markers: Dict[str, str] = {}
    while True:
        query = {"uploads": "", **({"prefix": prefix} if prefix else {}), **markers}
        root = xml_tree(list_page(query))
        for item in root.iter("Upload"):
            yield PendingUpload(item.findtext("Key") or "", item.findtext("UploadId") or "",
                                iso8601_epoch(item.findtext("Initiated")))
        key_marker, id_marker = root.findtext("NextKeyMarker"), root.findtext("NextUploadIdMarker")
        if root.findtext("IsTruncated") != "true" or not (key_marker or id_marker):
            return
        markers = {"key-marker": key_marker or "", "upload-id-marker": id_marker or ""}
