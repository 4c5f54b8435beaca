"""The backend contract: a small, object-store-shaped interface.

A backend speaks one protocol to one endpoint and nothing else: no retries across
requests, no threads, no caching, no bundling (those live in the engine). It raises only
:mod:`transfer.errors` exceptions, translated from its protocol's errors.

Every backend reads (:class:`Backend`). What only some can do is a separate protocol,
checked with ``isinstance``: :class:`Uploads` and :class:`Namespace` (together a
:class:`Store`; plain HTTP sources have neither), :class:`MultipartUploads`,
:class:`RangedReads`, :class:`BatchReads`, :class:`BatchWrites`, :class:`ServerSideCopy`, :class:`PagedListing`, :class:`TreeRemoval`, :class:`TempUploads`, :class:`ExclusiveCreate`, :class:`ConditionalPuts`, :class:`AttributedPuts`, :class:`Presigns`, :class:`Touches`, :class:`Buckets`, :class:`CacheKeys` and :class:`PeerScopes`. No backend has a
method that only refuses; :func:`uploads`, :func:`namespace` and :func:`store` give the one-line error for a missing
capability.
"""

from __future__ import annotations

from transfer.lean import record
from transfer.lean import Protocol, runtime_checkable

from transfer.errors import InvalidInput, TransferError
from transfer.http.connection import FileRegion
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union, cast

    from transfer._threads import Cancel
    from transfer.http.resume import ResumingBody
    from transfer.peer_scope import Scope

    Take = Callable[[int, bytes, "ObjectInfo", float], bool]
    Stored = Callable[[int, "ObjectInfo", float], bool]

if TYPE_CHECKING:
    ByteRange = Tuple[int, int]  # [start, end) in bytes
else:
    ByteRange = object  # the alias above is for type checkers; typing is not imported at run time

    def cast(kind, value):  # typing.cast, without importing typing
        return value


@record(frozen=True)
class Attributes:
    """An object's HTTP attributes and user metadata, as the store keeps them with it."""

    content_type: Optional[str] = None
    cache_control: Optional[str] = None
    metadata: Tuple[Tuple[str, str], ...] = ()  # (name, value) pairs, names lower-case
    checksum: Optional[str] = None  # the store's full-object checksum, "crc32:BASE64" (S3's names)


@record(frozen=True)
class ObjectInfo:
    """What the store says about an object. ``version`` is its ETag/generation, if any;
    ``attributes`` what a stat of it found (None where not asked or not kept); ``origin`` the
    read layer that served the bytes, when not the store (:mod:`transfer.layers`)."""

    url: Url
    size: int
    version: Optional[str] = None
    mtime: Optional[float] = None
    attributes: Optional[Attributes] = None
    origin: Optional[str] = None


@runtime_checkable
class Backend(Protocol):
    """Every backend implements these: reading. All methods are safe to call from many threads."""

    def stat(self, url: Url) -> ObjectInfo:
        """Size and version of one object; NotFound if absent."""

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        """Write the object (or ``byte_range`` of it) to ``sink``; the ObjectInfo returned is the
        whole object's (its size too, for a range).

        Verifies the byte count and, where the store provides one, the checksum, raising
        ChecksumMismatch otherwise. One request per call.
        """

    def close(self) -> None:
        """Release connections."""


@runtime_checkable
class Uploads(Protocol):
    """Backends that store files (all but plain HTTP sources)."""

    def put(self, path: str, url: Url) -> ObjectInfo:
        """Store the local file ``path`` as ``url``, verified by size and checksum."""


@runtime_checkable
class Namespace(Protocol):
    """Backends with a namespace to list, remove from and create directories (or buckets) in."""

    def list(self, url: Url) -> Iterator[ObjectInfo]:
        """Every object under ``url`` taken as a directory prefix, recursively."""

    def delete(self, urls: Sequence[Url]) -> List[Optional[TransferError]]:
        """Remove objects (batched where the protocol allows); one entry per URL, None = removed.

        Removing an object that does not exist succeeds.
        """

    def make_dirs(self, url: Url) -> None:
        """Create the directory (or the bucket of an object URL) if missing; idempotent."""


@runtime_checkable
class DirectoryListing(Protocol):
    """Backends that list one level of a namespace themselves (S3's delimiter listing)."""

    def list_dir(self, url: Url) -> Tuple[List[ObjectInfo], List[Url]]:
        """(objects directly under ``url`` taken as a directory, sub-directories' URLs ending in ``/``)."""


@runtime_checkable
class PagedListing(Protocol):
    """Backends that list one level a page at a time, from a name on (S3's ``start-after``)."""

    def list_dir_pages(self, url: Url, start_after: str = "") -> Iterator[Tuple[List[ObjectInfo], List[Url]]]:
        """Lazily, the pages of :meth:`DirectoryListing.list_dir`'s answer, in name order, of
        the names after ``start_after`` (a name in the directory; "" from the first)."""


@runtime_checkable
class Presigns(Protocol):
    """Backends that sign URLs for others to use without keys (S3's SigV4 query signing,
    GCS's V4 signed URLs)."""

    def presign(self, url: Url, method: str, expires: int) -> str:
        """A URL for one ``method`` (GET or PUT) on the object, valid ``expires`` seconds."""


@runtime_checkable
class Touches(Protocol):
    """Backends that renew an object's modification time in place (``touch``)."""

    def touch(self, url: Url) -> ObjectInfo:
        """Set the object's modification time to now, its bytes and attributes kept; NotFound
        when it does not exist."""


@runtime_checkable
class Buckets(Protocol):
    """Stores whose namespace is split into buckets that may not exist (S3, GCS): a missing
    bucket is no empty directory, and a listing of its root would not tell the two apart."""

    def bucket_exists(self, url: Url) -> bool:
        """Whether the bucket of ``url`` exists (one request); AuthError when the identity may
        not ask."""

    def names_bucket(self, url: Url) -> bool:
        """Whether ``url`` names a bucket itself, nothing in it (no request: the URL's shape,
        which only the backend knows: S3's bucket is a path segment or the host, Azure's
        container a path segment); InvalidInput for a URL the backend cannot parse."""


@runtime_checkable
class BucketRemoval(Protocol):
    """Stores whose buckets a client may delete (S3, GCS)."""

    def remove_bucket(self, url: Url) -> None:
        """Delete the bucket of ``url``, which must be empty: NotFound when there is none,
        RemoteError (409; fake-gcs-server 412) when something is still in it."""


@runtime_checkable
class Store(Backend, Uploads, Namespace, Protocol):
    """A full object store: read, upload, list, remove, make directories (S3, GCS, SFTP, local)."""


@runtime_checkable
class MultipartUploads(Protocol):
    """Large uploads in parts; the engine schedules the parts in parallel."""

    multipart_threshold: int
    part_size: int

    def start_upload(self, url: Url) -> str:
        """Begin an upload; returns its id."""

    def upload_part(self, url: Url, upload_id: str, number: int, region: Union[FileRegion, bytes]) -> str:
        """Send part ``number`` (1-based): a file region, or bytes already in memory (a stream
        written part by part); verified by the store. Returns the part's receipt (opaque:
        :meth:`complete_upload` takes the receipts in part order)."""

    def complete_upload(self, url: Url, upload_id: str, receipts: Sequence[str]) -> ObjectInfo:
        """Assemble the parts in order."""

    def abort_upload(self, url: Url, upload_id: str) -> None:
        """Discard the parts; never raises for an already-finished upload."""


@record(frozen=True)
class PendingUpload:
    """A multipart upload the store holds open: its key, id, and when it was started
    (``initiated``: epoch seconds by the store's clock, None if the store did not say)."""

    key: str
    upload_id: str
    initiated: Optional[float] = None


@runtime_checkable
class PendingUploads(Protocol):
    """Stores that list the multipart uploads left open (S3 ListMultipartUploads), so that an
    upload of a key can abort the ones an earlier run left behind (:mod:`transfer.uploads`).
    ``orphan_age``: seconds after its start an open upload of the same key counts as left
    behind rather than another writer's, still running."""

    orphan_age: float

    def pending_uploads(self, url: Url, *, whole_key: bool = True) -> Iterator[PendingUpload]:
        """The open uploads of ``url``'s key (every page); with ``whole_key`` False, of every
        key that starts with it."""


@runtime_checkable
class ExclusiveCreate(Protocol):
    """Backends whose store can refuse, atomically, to replace an object (S3 ``If-None-Match: *``)."""

    def put_new(self, path: str, url: Url) -> ObjectInfo:
        """Upload the local file ``path`` to ``url`` only if no object has that name when the
        store commits it; AlreadyExists otherwise (nothing of ours is then stored)."""


@runtime_checkable
class AttributedPuts(Protocol):
    """Backends that store an object's attributes (content type, cache control, user metadata) with it."""

    def put_with(self, path: str, url: Url, attributes: Attributes, *, if_none_match: bool = False,
                 if_match: Optional[str] = None) -> ObjectInfo:
        """Upload the local file ``path`` to ``url`` in one request with ``attributes`` (and the
        conditions of :class:`ExclusiveCreate` and :class:`ConditionalPuts`, raising as they do)."""


@runtime_checkable
class ConditionalPuts(Protocol):
    """Backends whose store replaces an object only while it is the version expected (S3 ``If-Match``)."""

    def put_if_match(self, path: str, url: Url, version: str) -> ObjectInfo:
        """Upload the local file ``path`` to ``url`` only if the object there is still the one
        of ETag ``version`` when the store commits it; RemoteError (status 412) otherwise,
        nothing stored."""


@runtime_checkable
class TempUploads(Protocol):
    """Backends whose uploads write a temp file on the server first (SFTP's ``.part``): on a
    signal the process ends without unwinding its workers, so these are removed for it."""

    def discard_in_flight(self, seconds: float) -> None:
        """For signal handlers: remove the temp files of uploads in flight, giving up after
        ``seconds``; never raises."""


class RunningCheck(Protocol):
    """A whole-object checksum computed while the bytes go past, in order."""

    name: str

    def update(self, data: bytes) -> None:
        """Feed the next bytes of the object."""

    def matches(self) -> bool:
        """Whether the bytes fed so far end at the store's value."""


class ObjectStream(Protocol):
    """A full-object GET whose response head has arrived; the caller reads the body.

    ``info`` gives the size and version (ETag) the store answered with, ``check`` the
    whole-object checksum the body must match (None: the store gave none; size only)."""

    info: ObjectInfo
    check: Optional[RunningCheck]

    def read(self, length: int, write: Callable[[bytes], object]) -> int:
        """Stream the next ``length`` bytes of the body to ``write``; raises TransientError
        on a cut body. The check is not fed: the caller feeds it in object order."""

    def close(self) -> None:
        """Drop the unread rest of the body (its connection is closed if any is left)."""


class BodyStream:
    """The :class:`ObjectStream` of a backend whose whole-object GET body resumes after a cut
    (:class:`~transfer.http.resume.ResumingBody`): S3 and Azure."""

    def __init__(self, body: "ResumingBody", info: ObjectInfo, check: Optional[RunningCheck]) -> None:
        self._body = body
        self.info = info
        self.check = check

    def read(self, length: int, write: Callable[[bytes], object]) -> int:
        return self._body.read_part(length, write)

    def close(self) -> None:
        self._body.discard()


@runtime_checkable
class RangedReads(Protocol):
    """Backends that read one object as several ranges at once (large downloads)."""

    def open_read(self, url: Url) -> ObjectStream:
        """Send a full-object GET and return once its head has arrived."""

    def get_range(self, url: Url, byte_range: ByteRange, version: str, size: int,
                  write: Callable[[bytes], object]) -> int:
        """Stream ``byte_range`` of the object to ``write``, only while it is still the one of
        ETag ``version`` and ``size`` bytes: RemoteError otherwise (the object changed),
        ChecksumMismatch on a short body. Returns the byte count."""


@runtime_checkable
class BatchReads(Protocol):
    """Backends that read many small whole objects at once (pipelined requests, one thread)."""

    def read_small(self, urls: Sequence[Url], take: Take, *, connections: int, cancel: Optional[Cancel] = None,
                   missing: Optional[Callable[[int], bool]] = None, depth: Optional[int] = None,
                   eager: bool = False, throttled: Optional[Callable[[float], None]] = None,
                   draw: Optional[Callable[[], None]] = None) -> List[int]:
        """Fetch the objects of ``urls`` over up to ``connections`` connections, at most
        ``depth`` requests in flight on each (None: the backend's own; a caller with a few
        objects and a round trip to hide asks for a small one, which spreads them over more
        connections; with ``eager``, a caller whose objects were just listed, every connection
        starts with ``depth`` requests in flight instead of working up to it), and give each
        whose body arrived whole and passed the checks :meth:`Backend.get` makes (size, and
        the store's checksum) to ``take(index, body, info, sent)`` (``sent``: monotonic time
        of its request), which returns whether it took it. ``missing(index)`` is told of an
        object the store does not have; True ends the pass (the caller found where the rest
        is: a bundle). A throttle answer (503 SlowDown, 429) ends the pass, and is told to
        ``throttled(sent)`` when given; ``draw()``, when given, is called before each request
        goes out and may wait (its token of a paced prefix). Returns, in order, the indexes of the rest -- any other answer, a failed
        check, a large object, no answer, ``take`` said no, the pass ended -- for the caller
        to read one by one, which reports their errors. Never raises."""


@runtime_checkable
class BatchWrites(Protocol):
    """Backends that write many small local files at once (pipelined PUTs, one thread)."""

    def write_small(self, items: Sequence[Tuple[str, Url]], stored: Stored, *, connections: int,
                    cancel: Optional[Cancel] = None, throttled: Optional[Callable[[float], None]] = None,
                    draw: Optional[Callable[[], None]] = None) -> List[int]:
        """Store each local file ``path`` of ``items`` (path, URL) as its URL, over up to
        ``connections`` connections, and tell each the store answered for with the checks
        :meth:`Uploads.put` makes (its checksum echoed or its MD5 ETag) to
        ``stored(index, info, sent)`` (``sent``: monotonic time of its request), which returns
        whether it took it. A throttle answer (503 SlowDown, 429) ends the pass, and is told to
        ``throttled(sent)`` when given; ``draw()`` as :meth:`BatchReads.read_small`'s. Returns, in order, the indexes of the rest -- a file
        too large or unreadable, any other answer, a failed check, no answer, the pass ended --
        for the caller to upload one by one, which reports their errors. Never raises."""


@runtime_checkable
class DialsAhead(Protocol):
    """Backends that can start their connections before the requests that will use them."""

    def dial_ahead(self, url: Url, connections: int) -> None:
        """Start opening up to ``connections`` connections to the endpoint that serves ``url``
        without waiting for them (a caller about to send that many requests at once, with a
        round trip to wait on meanwhile). Best effort: never raises; requests made later use
        them or dial as usual."""


@runtime_checkable
class TreeRemoval(Protocol):
    """Backends with real directories remove a whole tree themselves (files and directories)."""

    def delete_tree(self, url: Url) -> Optional[TransferError]:
        """Remove ``url`` and everything below it; a missing tree is success."""


@runtime_checkable
class CacheKeys(Protocol):
    """Backends whose objects may be shared through the node cache."""

    def cache_key(self, url: Url) -> str:
        """A name for the object that is the same for every job on the node that reads it
        (endpoint and path; not the credentials file or identity used to reach it)."""


@runtime_checkable
class PeerScopes(Protocol):
    """Backends whose objects peers may share: each names the scope of the identity that
    reads a URL (see :class:`transfer.peers.Scope`; ``docs/security.md``)."""

    def peer_scope(self, url: Url) -> Optional["Scope"]:
        """The scope of this backend's identity for ``url``'s bucket; None when the reads
        are anonymous (nothing then proves who may read the object: it is not shared)."""


@runtime_checkable
class ServerSideCopy(Protocol):
    """Copy between two URLs of the same endpoint without moving bytes through the client."""

    def copy(self, source: Url, dest: Url, draw: Optional[Callable[[], None]] = None) -> ObjectInfo:
        """Copy ``source`` to ``dest`` inside the store. ``draw`` is called before each request
        after the first (the copy's closing HEAD, a poll): the caller drew the first's token
        from a paced prefix (:mod:`transfer.pacing`), and each later request waits for its own,
        so a copy never sends its requests faster than the prefix's pace."""


_KNOWN: Dict[Tuple[type, type], bool] = {}


def _has(backend: object, protocol: type) -> bool:
    """``isinstance(backend, protocol)``, remembered per class: a check against a runtime
    protocol costs 30-80 us on CPython 3.11, and the engine asks for every file. (A pure memo of
    what a class implements, never cleared; backends set their capability attributes in
    ``__init__``.)"""
    key = (type(backend), protocol)
    known = _KNOWN.get(key)
    if known is None:
        known = _KNOWN[key] = isinstance(backend, protocol)
    return known


def ranged_reads(backend: Backend) -> Optional[RangedReads]:
    """``backend`` as :class:`RangedReads`, or None."""
    return cast(RangedReads, backend) if _has(backend, RangedReads) else None


def batch_reads(backend: Backend) -> Optional[BatchReads]:
    """``backend`` as :class:`BatchReads`, or None."""
    return cast(BatchReads, backend) if _has(backend, BatchReads) else None


def batch_writes(backend: Backend) -> Optional[BatchWrites]:
    """``backend`` as :class:`BatchWrites`, or None."""
    return cast(BatchWrites, backend) if _has(backend, BatchWrites) else None


def dials_ahead(backend: Backend) -> Optional[DialsAhead]:
    """``backend`` as :class:`DialsAhead`, or None."""
    return cast(DialsAhead, backend) if _has(backend, DialsAhead) else None


def multipart_uploads(backend: Backend) -> Optional[MultipartUploads]:
    """``backend`` as :class:`MultipartUploads`, or None."""
    return cast(MultipartUploads, backend) if _has(backend, MultipartUploads) else None


def pending_uploads(backend: object) -> Optional[PendingUploads]:
    """``backend`` as :class:`PendingUploads`, or None."""
    return cast(PendingUploads, backend) if _has(backend, PendingUploads) else None


def cache_keys(backend: Backend) -> Optional[CacheKeys]:
    """``backend`` as :class:`CacheKeys`, or None."""
    return cast(CacheKeys, backend) if _has(backend, CacheKeys) else None


def peer_scopes(backend: Backend) -> Optional[PeerScopes]:
    """``backend`` as :class:`PeerScopes`, or None."""
    return cast(PeerScopes, backend) if _has(backend, PeerScopes) else None


def uploads(backend: Backend, url: Url, operation: str = "put") -> Uploads:
    """``backend`` as :class:`Uploads`, or InvalidInput naming ``url`` when it cannot store files."""
    if _has(backend, Uploads):
        return cast(Uploads, backend)
    raise _read_only(url, "uploaded to", operation)


def namespace(backend: Backend, url: Url, operation: str) -> Namespace:
    """``backend`` as :class:`Namespace`, or InvalidInput naming ``url`` when it has none."""
    if _has(backend, Namespace):
        return cast(Namespace, backend)
    raise _read_only(url, "listed, removed from or created", operation)


def store(backend: Backend, url: Url, operation: str) -> Store:
    """``backend`` as a full :class:`Store`, or InvalidInput naming ``url``."""
    if _has(backend, Store):
        return cast(Store, backend)
    raise _read_only(url, "used as a store", operation)


def _read_only(url: Url, what: str, operation: str) -> InvalidInput:
    return InvalidInput(f"{url.scheme}:// URLs are read-only sources: they cannot be {what}", url=str(url),
                        operation=operation)
