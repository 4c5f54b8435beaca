"""The backend contract: a small, object-store-shaped interface.

A backend speaks one protocol to one endpoint and nothing else: no retries across
requests, no threads, no caching, no bundling (those live in the engine). It raises only
:mod:`transfer.errors` exceptions, translated from its protocol's errors.

Optional capabilities are separate protocols, checked with ``isinstance``:
:class:`MultipartUploads`, :class:`RangedReads` and :class:`ServerSideCopy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

from transfer.errors import TransferError
from transfer.http.connection import FileRegion
from transfer.urls import Url

ByteRange = Tuple[int, int]  # [start, end) in bytes


@dataclass(frozen=True)
class ObjectInfo:
    """What the store says about an object. ``version`` is its ETag/generation, if any."""

    url: Url
    size: int
    version: Optional[str] = None
    mtime: Optional[float] = None


@runtime_checkable
class Backend(Protocol):
    """Every backend implements these. All methods are safe to call from many threads."""

    def stat(self, url: Url) -> ObjectInfo:
        """Size and version of one object; NotFound if absent."""

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        """Write the object (or ``byte_range`` of it) to ``sink``.

        Verifies the byte count and, where the store provides one, the checksum, raising
        ChecksumMismatch otherwise. One request per call.
        """

    def put(self, path: str, url: Url) -> ObjectInfo:
        """Store the local file ``path`` as ``url``, verified by size and checksum."""

    def list(self, url: Url) -> Iterator[ObjectInfo]:
        """Every object under ``url`` taken as a directory prefix, recursively."""

    def delete(self, urls: Sequence[Url]) -> List[Optional[TransferError]]:
        """Remove objects (batched where the protocol allows); one entry per URL, None = removed.

        Removing an object that does not exist succeeds.
        """

    def make_dirs(self, url: Url) -> None:
        """Create the directory (or the bucket of an object URL) if missing; idempotent."""

    def close(self) -> None:
        """Release connections."""


@runtime_checkable
class MultipartUploads(Protocol):
    """Large uploads in parts; the engine schedules the parts in parallel."""

    multipart_threshold: int
    part_size: int

    def start_upload(self, url: Url) -> str:
        """Begin an upload; returns its id."""

    def upload_part(self, url: Url, upload_id: str, number: int, region: FileRegion) -> str:
        """Send part ``number`` (1-based); returns the part's ETag."""

    def complete_upload(self, url: Url, upload_id: str, etags: Sequence[str]) -> ObjectInfo:
        """Assemble the parts in order."""

    def abort_upload(self, url: Url, upload_id: str) -> None:
        """Discard the parts; never raises for an already-finished upload."""


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
class ServerSideCopy(Protocol):
    """Copy between two URLs of the same endpoint without moving bytes through the client."""

    def copy(self, source: Url, dest: Url) -> ObjectInfo:
        """Copy ``source`` to ``dest`` inside the store."""
