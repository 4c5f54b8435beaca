"""Azure's :class:`~transfer.backends.base.BatchReads`: pipelined Get Blob requests of small blobs.

Blobs up to 1 MiB are read through :mod:`transfer.http.pipeline` over the account's keep-alive
connections (HTTP/1.1: the service, as every HTTP/1.1 server, answers pipelined requests in
order; Azurite, on Node's HTTP server, does too). Each request carries an
``x-ms-client-request-id`` naming it, which the service echoes on every answer; it is signed
with the rest (Shared Key), and needs no response-header override, so SAS and anonymous reads
are pipelined as well. An answer is taken only when it carries its request's id, its body has
the Content-Length the head says, and that body matches the blob's ``Content-MD5``: on a
pipelined connection a wrong Content-Length would pass the next answer's bytes off as this
blob's, so a blob without a stored MD5 (one committed from blocks without one) is left to the
ordinary path, which reads it alone. Imported only by a batch of small files.
"""

from __future__ import annotations

from transfer import _digests
from transfer.backends import _azure_wire as wire
from transfer.errors import Throttled, TransferError
from transfer.http.message import host_header, request_head
from transfer.http.proxy import absolute_form

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Tuple

    from transfer._threads import Cancel
    from transfer.backends.base import ObjectInfo, Take
    from transfer.http.pool import ConnectionPool
    from transfer.urls import Url

    Sign = Callable[[wire.AzurePath, str], Tuple[str, List[Tuple[str, str]]]]

__all__ = ["read_small", "verified"]

_SMALL_BODY = 1 << 20
_DEPTH = 8
_USELESS = 8  # answers none of which could be taken, after which the pass gives up
TAG = "pegasus-cloudio-get-"


def read_small(pool: ConnectionPool, sign: Sign, urls: Sequence[Url], take: Take, connections: int,
               cancel: Optional[Cancel], missing: Optional[Callable[[int], bool]], depth: Optional[int] = None,
               eager: bool = False, throttled: Optional[Callable[[float], None]] = None,
               draw: Optional[Callable[[], None]] = None) -> List[int]:
    """:meth:`AzureBackend.read_small <transfer.backends.azure.AzureBackend.read_small>`:
    ``sign(path, tag)`` gives the (target, headers) of a Get Blob of ``path`` carrying
    ``x-ms-client-request-id: tag``; ``draw()``, when given, before each request (it may wait:
    its token of a paced prefix); returns the positions in ``urls`` not taken, in order."""
    from transfer.http import pipeline
    left, indexes, paths = _blobs(urls)
    if not indexes:
        return left
    default_host = host_header(pool.host, pool.port, pool.scheme == "https")
    forward = pool.proxy if pool.scheme == "http" else None  # https goes through a CONNECT tunnel as is

    def head(k: int) -> bytes:
        if draw is not None:
            draw()
        target, headers = sign(paths[k], f"{TAG}{k}")
        if forward is not None:
            target, headers = absolute_form(target, headers, default_host, forward)
        return request_head("GET", target, headers, None, default_host, pool.base_url)

    taken = [0, 0]  # answers taken, answers not taken

    def deliver(k: int, status: int, headers: Dict[str, str], body: bytes, sent: float) -> bool:
        if status == 404 and missing is not None and missing(indexes[k]):
            raise pipeline.GiveUp()
        if _ends_pass(status, headers, body, throttled, sent):
            raise pipeline.GiveUp()
        info = verified(urls[indexes[k]], status, headers, body, f"{TAG}{k}")
        done = info is not None and take(indexes[k], body, info, sent)
        taken[0 if done else 1] += 1
        if not taken[0] and taken[1] >= _USELESS:  # a service that answers nothing usable here
            raise pipeline.GiveUp()
        return done

    rest = pipeline.fetch(pool, len(indexes), head, deliver, connections=connections, depth=depth or _DEPTH,
                          max_body=_SMALL_BODY, cancel=cancel, eager=eager)
    return sorted(left + [indexes[k] for k in rest])


def _blobs(urls: Sequence[Url]) -> Tuple[List[int], List[int], List[wire.AzurePath]]:
    """(positions of URLs that name no blob, positions of the others, their paths)."""
    left: List[int] = []
    indexes: List[int] = []
    paths: List[wire.AzurePath] = []
    for index, url in enumerate(urls):
        try:
            paths.append(wire.split_url(url, need_blob=True))
        except TransferError:
            left.append(index)
            continue
        indexes.append(index)
    return left, indexes, paths


def _ends_pass(status: int, headers: Dict[str, str], body: bytes, throttled: Optional[Callable[[float], None]],
               sent: float) -> bool:
    """Whether an answer ends the pass: refused credentials refuse every request (the per-file
    path says so, once each); a throttle answer (``ServerBusy``, 429) is told to ``throttled``."""
    if status in (401, 403):
        return True
    if status in (429, 503) and isinstance(wire.azure_error(status, headers, body, "", "get", "", ""), Throttled):
        if throttled is not None:
            throttled(sent)
        return True
    return False


def verified(url: Url, status: int, headers: Dict[str, str], body: bytes, tag: str) -> Optional[ObjectInfo]:
    """What the service says of the blob when a pipelined answer is this request's (its
    ``x-ms-client-request-id`` echoed), whole (its Content-Length) and right (the MD5 of the
    body is the blob's ``Content-MD5``); None otherwise, and None for a blob without a stored
    MD5 (see the module docstring)."""
    if status != 200 or headers.get("x-ms-client-request-id") != tag:
        return None
    try:
        info = wire.blob_info(url, headers)
    except TransferError:
        return None
    md5 = wire.md5_hex(headers)
    if info.size != len(body) or md5 is None:
        return None
    return info if _digests.md5(body).hex() == md5 else None
