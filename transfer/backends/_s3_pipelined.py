"""S3's :class:`~transfer.backends.base.BatchReads` and
:class:`~transfer.backends.base.BatchWrites`: pipelined GETs of small objects, pipelined PUTs
of small files.

Objects up to 1 MiB are read through :mod:`transfer.http.pipeline`, grouped by the route of
their bucket (:mod:`transfer.backends._s3_route`). Each pipelined GET asks the store to echo a
tag naming it (the ``response-cache-control`` override), so an answer is written only to the
file it was asked for, even behind an intermediary that answers pipelined requests out of
order; an answer is taken only when it carries its tag and passes the checks
:meth:`S3Backend.get <transfer.backends.s3.S3Backend.get>` makes. Anonymous routes are not
pipelined (anonymous reads may not ask for ``response-*`` overrides). Through a plain-HTTP
proxy the heads are in absolute form, as the pool's own requests are.

A pipelined PUT (RFC 9110: PUT is idempotent, so one left unanswered may be sent again) carries
the file's bytes after its head, with the headers :meth:`S3Backend.put
<transfer.backends.s3.S3Backend.put>` sends (Content-MD5, the full-object CRC32); a file is read
when its request is sent, so only the requests in flight are in memory. A PUT's answer echoes no
tag, so an answer is taken only when it vouches for this request's bytes (the CRC32 echoed, or
an MD5 ETag) -- an intermediary that reorders answers can at worst swap the answers of two files
with the same bytes. Imported only by a batch of small files: a one-file job never loads it.
"""

from __future__ import annotations

from transfer import _digests
from transfer.backends._s3_checksum import CHECKSUM_HEADERS, CHECKSUM_MODE, response_check
from transfer.backends._s3_put import put_checks, put_verified
from transfer.backends._s3_wire import _info, etag_md5, s3_error, split_url
from transfer.backends._sigv4 import EMPTY_SHA256, UNSIGNED
from transfer.backends.base import ObjectInfo
from transfer.errors import Throttled, TransferError
from transfer.http.connection import file_body_crc32
from transfer.http.message import host_header, request_head
from transfer.http.proxy import absolute_form

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Tuple

    from transfer._threads import Cancel
    from transfer.backends._s3_route import Route, Router
    from transfer.backends._s3_wire import S3Path
    from transfer.backends.base import Stored, Take
    from transfer.urls import Url

__all__ = ["read_small", "verified", "write_small"]

_SMALL_BODY = 1 << 20
# GETs in flight per connection. One thread serves every connection of a pass, so while it
# writes files each connection's queue must outlast it (at 8, a pass of 2,000 small objects left
# connections idle). PUTs: 8, as MinIO serves a connection's requests one at a time (deeper
# queues measured no faster); bytes in flight are capped apart from depth
# (:data:`transfer.http.pipeline.MAX_BYTES`), so 1 MiB bodies stay bounded.
_DEPTH = 32
_PUT_DEPTH = 8
_USELESS = 8  # answers none of which could be taken, after which the pass gives up
_TAG = "pegasus-cloudio-get-"
_ERROR_BODY = 1 << 16  # a PUT's answer: empty, or an error document


def read_small(router: Router, urls: Sequence[Url], take: Take, connections: int, cancel: Optional[Cancel],
               missing: Optional[Callable[[int], bool]], depth: Optional[int] = None,
               eager: bool = False, throttled: Optional[Callable[[float], None]] = None,
               draw: Optional[Callable[[], None]] = None) -> List[int]:
    """:meth:`S3Backend.read_small <transfer.backends.s3.S3Backend.read_small>` over the routes
    ``router`` gives the buckets: the positions in ``urls`` not taken, in order (``depth``:
    requests in flight per connection, :data:`_DEPTH` by default; ``eager``: from the start;
    ``throttled(sent)``: told of the throttle answer that ended the pass; ``draw()``: before
    each request, may wait)."""
    left, groups = _by_route(router, urls)
    for route, indexes, paths in groups:
        left += _read_route(route, [urls[i] for i in indexes], paths, indexes, take, connections, cancel, missing,
                            depth or _DEPTH, eager, throttled, draw)
    return sorted(left)


def write_small(router: Router, items: Sequence[Tuple[str, Url]], stored: Stored, connections: int,
                cancel: Optional[Cancel], throttled: Optional[Callable[[float], None]], max_size: int,
                draw: Optional[Callable[[], None]] = None) -> List[int]:
    """:meth:`S3Backend.write_small <transfer.backends.s3.S3Backend.write_small>` over the
    routes ``router`` gives the buckets: the positions in ``items`` not stored, in order (a file
    over ``max_size`` bytes or 1 MiB is left over; ``draw()`` before each request, may wait)."""
    left, groups = _by_route(router, [url for _, url in items])
    for route, indexes, paths in groups:
        left += _write_route(route, [items[i] for i in indexes], paths, indexes, stored, connections, cancel,
                             throttled, min(max_size, _SMALL_BODY), draw)
    return sorted(left)


def _by_route(router: Router, urls: Sequence[Url]) -> Tuple[List[int], List[Tuple[Route, List[int], List[S3Path]]]]:
    """(positions of URLs that name no object, [(route, positions, paths)] of the others)."""
    left: List[int] = []
    groups: Dict[int, Tuple[Route, List[int], List[S3Path]]] = {}
    for index, url in enumerate(urls):
        try:
            path = split_url(url)
        except TransferError:
            left.append(index)
            continue
        if not path.key:
            left.append(index)
            continue
        route = router.for_bucket(path.bucket)
        group = groups.setdefault(id(route), (route, [], []))
        group[1].append(index)
        group[2].append(path)
    return left, list(groups.values())


class _Heads:
    """Signed request heads of one route, as its pool sends them (absolute form through a
    plain-HTTP proxy)."""

    def __init__(self, route: Route) -> None:
        pool = route.pool
        self.route = route
        self.default_host = host_header(pool.host, pool.port, pool.scheme == "https")
        self.endpoint = pool.base_url
        self.forward = pool.proxy if pool.scheme == "http" else None  # https goes through a CONNECT tunnel as is

    def head(self, method: str, path: S3Path, query: str, payload_hash: str, extra: List[Tuple[str, str]],
             length: Optional[int]) -> bytes:
        assert self.route.signer is not None
        host, encoded = self.route.target(path)
        if host != self.route.host_header:
            extra = [("Host", host), *extra]
        headers = self.route.signer.sign(method, host, encoded, query, payload_hash, extra)
        target = f"{encoded}?{query}" if query else encoded
        if self.forward is not None:
            target, headers = absolute_form(target, headers, self.default_host, self.forward)
        return request_head(method, target, headers, length, self.default_host, self.endpoint)


def _write_route(route: Route, items: List[Tuple[str, Url]], paths: List[S3Path], indexes: List[int],
                 stored: Stored, connections: int, cancel: Optional[Cancel],
                 throttled: Optional[Callable[[float], None]], max_size: int,
                 draw: Optional[Callable[[], None]]) -> List[int]:
    """:func:`write_small` for the files of one route (``indexes``: their positions in the
    caller's list, which ``stored`` and the result speak of)."""
    from transfer.http import pipeline
    if route.signer is None:  # anonymous writes: the per-file path tells the store's refusal
        return list(indexes)
    checks: Dict[int, Tuple[int, bytes, str]] = {}  # k -> (size, MD5, CRC32) of the request in flight
    head = _put_requests(route, items, paths, max_size, draw, checks)
    taken = [0, 0]

    def deliver(k: int, status: int, headers: Dict[str, str], body: bytes, sent: float) -> bool:
        if _ends_pass(status, body, "put", throttled, sent):
            raise pipeline.GiveUp()
        size, md5, crc = checks.pop(k)
        done = status == 200 and put_verified(headers, md5, crc)
        if done:
            etag = headers.get("etag", "").strip('"')
            done = stored(indexes[k], ObjectInfo(items[k][1], size, etag or None), sent)
        taken[0 if done else 1] += 1
        if not taken[0] and taken[1] >= _USELESS:  # a store that takes none of these
            raise pipeline.GiveUp()
        return done

    # eager: a batch of uploads knows all its requests at once; a store that refuses them costs
    # _PUT_DEPTH bodies per connection (MAX_BYTES in all, at most) before the pass ends
    left = pipeline.fetch(route.pool, len(items), head, deliver, connections=connections, depth=_PUT_DEPTH,
                          max_body=_ERROR_BODY, cancel=cancel, eager=True)
    return [indexes[k] for k in left]


def _put_requests(route: Route, items: List[Tuple[str, Url]], paths: List[S3Path], max_size: int,
                  draw: Optional[Callable[[], None]],
                  checks: Dict[int, Tuple[int, bytes, str]]) -> Callable[[int], bytes]:
    """:func:`_write_route`'s ``head(k)``: the signed PUT with its body of the ``k``-th file,
    whose (size, MD5, CRC32) go to ``checks``; ValueError for a file over ``max_size``."""
    heads = _Heads(route)

    def head(k: int) -> bytes:
        if draw is not None:
            draw()
        size, md5, crc32, body = file_body_crc32(items[k][0])
        if size > max_size or not isinstance(body, bytes):
            raise ValueError("not a small file")  # left over: the per-file path (multipart at its threshold)
        crc, extra = put_checks(md5, crc32)
        checks[k] = (size, md5, crc)
        return heads.head("PUT", paths[k], "", UNSIGNED, extra, size) + body

    return head


def _ends_pass(status: int, body: bytes, operation: str, throttled: Optional[Callable[[float], None]],
               sent: float) -> bool:
    """Whether an answer ends a pipelined pass: refused credentials refuse every request (the
    per-file path says so, once each); a throttle answer is told to ``throttled`` (no more
    pipelined requests into a store that throttles)."""
    if status in (401, 403):
        return True
    if status in (429, 503) and isinstance(s3_error(status, body, "", operation), Throttled):
        if throttled is not None:
            throttled(sent)
        return True
    return False


def _read_route(route: Route, urls: List[Url], paths: List[S3Path], indexes: List[int], take: Take,
                connections: int, cancel: Optional[Cancel], missing: Optional[Callable[[int], bool]],
                depth: int, eager: bool, throttled: Optional[Callable[[float], None]] = None,
                draw: Optional[Callable[[], None]] = None) -> List[int]:
    """:func:`read_small` for the objects of one route (``indexes``: their positions in the
    caller's list, which ``take`` and the result speak of)."""
    from transfer.http import pipeline
    if route.signer is None:  # anonymous reads may not ask for response-* overrides: no tag, no pipelining
        return list(indexes)
    heads = _Heads(route)

    def head(k: int) -> bytes:
        if draw is not None:
            draw()
        return heads.head("GET", paths[k], f"response-cache-control={_TAG}{k}", EMPTY_SHA256, [CHECKSUM_MODE], None)

    taken = [0, 0]  # answers taken, answers not taken

    def deliver(k: int, status: int, headers: Dict[str, str], body: bytes, sent: float) -> bool:
        if status == 404 and missing is not None and missing(indexes[k]):
            raise pipeline.GiveUp()
        if _ends_pass(status, body, "get", throttled, sent):
            raise pipeline.GiveUp()
        info = verified(urls[k], status, headers, body, f"{_TAG}{k}")
        done = info is not None and take(indexes[k], body, info, sent)
        taken[0 if done else 1] += 1
        if not taken[0] and taken[1] >= _USELESS:  # a store that answers nothing here (refuses the tag?)
            raise pipeline.GiveUp()
        return done

    left = pipeline.fetch(route.pool, len(urls), head, deliver, connections=connections, depth=depth,
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
