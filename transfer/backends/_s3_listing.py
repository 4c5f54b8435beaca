"""S3 listings: ListObjectsV2 pages, each requested when the one before it has been taken.

Keys come URL-encoded (``encoding-type=url``, as botocore asks) so that names XML 1.0 cannot
carry survive; a listing of ``s3://BUCKET/a/b`` lists under the prefix ``a/b/``.
"""

from __future__ import annotations

from transfer.backends._s3_route import check_reply
from transfer.backends._s3_wire import S3Path, _child_url, iso8601_epoch, split_url, xml_tree
from transfer.backends._sigv4 import EMPTY_SHA256
from transfer.backends._wire_common import canonical_query
from transfer.backends.base import ObjectInfo
from transfer.urls import Url, unquote_plus

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator, List, Optional, Tuple

    from transfer.backends._s3_route import Router
    from transfer.backends._s3_xml import Node

__all__ = ["dir_page", "list_pages", "page_objects"]


def list_pages(router: Router, url: Url, delimiter: Optional[str], start_after: str = "") -> Iterator[Node]:
    """The XML pages of a listing under ``url`` (``start_after``: a name under it to list after),
    holding none while the next one is asked for."""
    path = split_url(url)
    prefix = path.key.rstrip("/") + "/" if path.key else ""
    token: Optional[str] = None
    while True:
        query = {"list-type": "2", "prefix": prefix, "encoding-type": "url"}
        if delimiter:
            query["delimiter"] = delimiter
        if start_after and not token:
            query["start-after"] = prefix + start_after
        if token:
            query["continuation-token"] = token
        with router.send("GET", S3Path(path.bucket, ""), canonical_query(query), [], None, EMPTY_SHA256,
                         str(url)) as response:
            check_reply(response, str(url), "list")
            root = xml_tree(response.read())
        yield root
        token = root.findtext("NextContinuationToken")
        more = root.findtext("IsTruncated") == "true"
        del root  # a page taken and dropped is freed before the next one is asked for
        if not more or not token:
            return


def page_objects(url: Url, page: Node) -> Iterator[ObjectInfo]:
    """The objects of a listing page of ``url``."""
    bucket = split_url(url).bucket
    for item in page.iter("Contents"):
        key = unquote_plus(item.findtext("Key") or "")
        yield ObjectInfo(_child_url(url, bucket, key), int(item.findtext("Size") or 0),
                         (item.findtext("ETag") or "").strip('"') or None,
                         iso8601_epoch(item.findtext("LastModified")))


def dir_page(url: Url, page: Node) -> Tuple[List[ObjectInfo], List[Url]]:
    """(objects, sub-prefixes each ending in ``/``) of a page listed with delimiter ``/``."""
    bucket = split_url(url).bucket
    prefixes = [_child_url(url, bucket, unquote_plus(item.findtext("Prefix") or ""))
                for item in page.iter("CommonPrefixes")]
    return list(page_objects(url, page)), prefixes
