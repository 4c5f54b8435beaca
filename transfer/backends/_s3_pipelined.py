"""S3's :class:`~transfer.backends.base.BatchReads`: pipelined GETs of small objects.

Objects up to 1 MiB are read through :mod:`transfer.http.pipeline`, grouped by the route of
their bucket (:mod:`transfer.backends._s3_route`). Each pipelined GET asks the store to echo a
tag naming it (the ``response-cache-control`` override), so an answer is written only to the
file it was asked for, even behind an intermediary that answers pipelined requests out of
order; an answer is taken only when it carries its tag and passes the checks
:meth:`S3Backend.get <transfer.backends.s3.S3Backend.get>` makes. Anonymous routes are not
pipelined (anonymous reads may not ask for ``response-*`` overrides). Through a plain-HTTP
proxy the heads are in absolute form, as the pool's own requests are. Imported only by a batch
of small downloads: a one-file job never loads it.
"""

from __future__ import annotations

from transfer import _digests
from transfer.backends._s3_checksum import CHECKSUM_HEADERS, CHECKSUM_MODE, response_check
from transfer.backends._s3_wire import _info, etag_md5, s3_error, split_url
from transfer.backends._sigv4 import EMPTY_SHA256
from transfer.backends.base import ObjectInfo
from transfer.errors import Throttled, TransferError
from transfer.http.message import host_header, request_head
from transfer.http.proxy import absolute_form

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Tuple

    from transfer._threads import Cancel
    from transfer.backends._s3_route import Route, Router
    from transfer.backends._s3_wire import S3Path
    from transfer.backends.base import Take
    from transfer.urls import Url

__all__ = ["read_small", "verified"]

_SMALL_BODY = 1 << 20
_DEPTH = 8
_USELESS = 8  # answers none of which could be taken, after which the pass gives up
_TAG = "pegasus-cloudio-get-"


def read_small(router: Router, urls: Sequence[Url], take: Take, connections: int, cancel: Optional[Cancel],
               missing: Optional[Callable[[int], bool]], depth: Optional[int] = None,
               eager: bool = False, throttled: Optional[Callable[[float], None]] = None) -> List[int]:
    """:meth:`S3Backend.read_small <transfer.backends.s3.S3Backend.read_small>` over the routes
    ``router`` gives the buckets: the positions in ``urls`` not taken, in order (``depth``:
    requests in flight per connection, :data:`_DEPTH` by default; ``eager``: from the start;
    ``throttled(sent)``: told of the throttle answer that ended the pass)."""
    left: List[int] = []
    groups: Dict[int, Tuple[Route, List[int], List[S3Path]]] = {}
    for index, url in enumerate(urls):
        try:
            path = split_url(url)
        except TransferError:
            left.append(index)
            continue
        route = router.for_bucket(path.bucket)
        group = groups.setdefault(id(route), (route, [], []))
        group[1].append(index)
        group[2].append(path)
    for route, indexes, paths in groups.values():
        left += _read_route(route, [urls[i] for i in indexes], paths, indexes, take, connections, cancel, missing,
                            depth or _DEPTH, eager, throttled)
    return sorted(left)


def _read_route(route: Route, urls: List[Url], paths: List[S3Path], indexes: List[int], take: Take,
                connections: int, cancel: Optional[Cancel], missing: Optional[Callable[[int], bool]],
                depth: int, eager: bool, throttled: Optional[Callable[[float], None]] = None) -> List[int]:
    """:func:`read_small` for the objects of one route (``indexes``: their positions in the
    caller's list, which ``take`` and the result speak of)."""
    from transfer.http import pipeline
    pool = route.pool
    default_host = host_header(pool.host, pool.port, pool.scheme == "https")
    endpoint = pool.base_url
    forward = pool.proxy if pool.scheme == "http" else None  # https goes through a CONNECT tunnel as is

    signer = route.signer
    if signer is None:  # anonymous reads may not ask for response-* overrides: no tag, no pipelining
        return list(indexes)

    def head(k: int) -> bytes:
        host, encoded = route.target(paths[k])
        extra = [CHECKSUM_MODE] if host == route.host_header else [("Host", host), CHECKSUM_MODE]
        query = f"response-cache-control={_TAG}{k}"
        headers = signer.sign("GET", host, encoded, query, EMPTY_SHA256, extra)
        target = f"{encoded}?{query}"
        if forward is not None:
            target, headers = absolute_form(target, headers, default_host, forward)
        return request_head("GET", target, headers, None, default_host, endpoint)

    taken = [0, 0]  # answers taken, answers not taken

    def deliver(k: int, status: int, headers: Dict[str, str], body: bytes, sent: float) -> bool:
        if status == 404 and missing is not None and missing(indexes[k]):
            raise pipeline.GiveUp()
        if status in (401, 403):  # refused credentials refuse every object: the per-file path says so, once each
            raise pipeline.GiveUp()
        if status in (429, 503) and isinstance(s3_error(status, body, "", "get"), Throttled):
            if throttled is not None:  # the store throttles: no more pipelined requests into it
                throttled(sent)
            raise pipeline.GiveUp()
        info = verified(urls[k], status, headers, body, f"{_TAG}{k}")
        done = info is not None and take(indexes[k], body, info, sent)
        taken[0 if done else 1] += 1
        if not taken[0] and taken[1] >= _USELESS:  # a store that answers nothing here (refuses the tag?)
            raise pipeline.GiveUp()
        return done

    left = pipeline.fetch(pool, len(urls), head, deliver, connections=connections, depth=depth,
                          max_body=_SMALL_BODY, cancel=cancel, eager=eager)
    return [indexes[k] for k in left]


def verified(url: Url, status: int, headers: Dict[str, str], body: bytes, tag: str) -> Optional[ObjectInfo]:
    """What the store says of the object when a pipelined answer is this request's (its tag
    echoed), whole and right: the checks
    :meth:`S3Backend.get <transfer.backends.s3.S3Backend.get>` makes (size, then checksum
    header or MD5 ETag); None otherwise, and None for an answer with nothing but its size to
    check (a multipart or SSE-KMS ETag and no checksum header): on a pipelined connection the
    body is whatever its Content-Length spans, so a wrong one (a head sent without its body)
    would pass the next answer's bytes off as this object. The ordinary path reads it alone."""
    if status != 200 or headers.get("cache-control") != tag:
        return None
    info = _info(url, 200, headers)
    if info.size != len(body):
        return None
    md5 = etag_md5(info, headers)
    if md5 is not None and not any(header in headers for header in CHECKSUM_HEADERS):
        return info if _digests.md5(body).hex() == md5.lower() else None  # response_check's choice, at once
    check = response_check(headers, md5, info.size)
    if check is None:
        return None
    check.update(body)
    return info if check.matches() else None
