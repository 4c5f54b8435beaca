"""The one way the engine reads bundle members: node cache (member keys) first, then one stream.

Cache entries filled from a bundle are keyed by :func:`member_key`: the bundle object's own
cache key plus the member's name and SHA-256. Only a read that resolved (through the
directory's index, see :class:`~transfer.bundles.directory.BundleDirectory`) to that very
member of that very bundle computes that key, so a member can never answer a plain read of
the same name, nor of any other name (docs/bundles.md, "Precedence").

:func:`read_group` serves every wanted member of one bundle: members the cache holds are
materialised from it; the rest are streamed from the bundle in one pass straight into their
destinations (atomically, verified by SHA-256) and then inserted into the cache.
"""

from __future__ import annotations

from transfer.lean import record

from transfer.atomic import AtomicFile, atomic_write_bytes
from transfer.backends.base import Backend, ObjectInfo
from transfer.bundles.directory import LoadedBundle
from transfer.bundles.fetch import Writer, stream_members
from transfer.bundles.format import BundleFormatError, Member
from transfer.errors import TransferError
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Callable, Dict, List, Optional, Tuple

    from transfer.cache import NodeCache  # imported at run time only with the cache on

BUFFERED = 1 << 20  # members up to this size are written from memory in one go
if TYPE_CHECKING:
    Stored = Callable[[str], None]  # told the key of every entry inserted (peers publish them)
    Pending = Tuple[str, bytes, str, List["MemberRead"]]  # key, bytes, SHA-256, reads still to write
else:
    Stored = Pending = object  # the alias above is for type checkers; typing is not imported at run time


@record
class MemberRead:
    """One wanted member: where it goes, and the URL the caller asked for (named in errors)."""

    position: int
    source: Url
    dest_path: str
    member: Member
    symlink: bool = False


def member_key(bundle_key: str, member: Member) -> str:
    return f"{bundle_key}#member={member.name}#sha256={member.sha256}"


@record
class GroupState:
    """What one group read achieved so far (kept across retries): bytes or error per position."""

    done: Dict[int, int]
    failed: Dict[int, TransferError]

    @classmethod
    def empty(cls) -> "GroupState":
        return cls({}, {})


def read_group(backend: Backend, bundle: LoadedBundle, reads: List[MemberRead], state: GroupState,
               cache: Optional[NodeCache] = None, bundle_key: Optional[str] = None,
               stored: Optional[Stored] = None) -> None:
    """Serve ``reads`` not yet in ``state``; member failures land in ``state.failed`` (naming
    the requested URL and the bundle), store errors propagate for the caller to retry."""
    pending = [r for r in reads if r.position not in state.done and r.position not in state.failed]
    streamed: Dict[str, List[MemberRead]] = {}
    for read in pending:
        key = member_key(bundle_key, read.member) if cache is not None and bundle_key else None
        if key is not None and cache is not None and cache.contains(key):
            member = read.member

            def download(sink: BinaryIO) -> ObjectInfo:
                return read_member(backend, bundle, member, sink)

            state.done[read.position] = cache.fetch(key, read.dest_path, download, symlink=read.symlink)[0]
        else:
            streamed.setdefault(read.member.name, []).append(read)
    if not streamed:
        return

    batch: List[Pending] = []  # small members for the node cache, inserted together
    from_entry = cache is not None and not _collecting()

    def open_writer(member: Member) -> Writer:
        key = member_key(bundle_key, member) if bundle_key else None
        return _FanOut(streamed[member.name], state, cache, key, stored, (member.sha256, batch, from_entry))

    try:
        failures = stream_members(backend, bundle, [items[0].member for items in streamed.values()], open_writer)
    finally:
        if batch and cache is not None:  # members already verified are delivered even when the rest failed
            _insert_batch(cache, batch, state, stored)
    for name, err in failures.items():
        for read in streamed[name]:
            state.failed[read.position] = BundleFormatError(err.message, url=str(read.source), operation="get")


def _collecting() -> bool:
    from transfer.cache import behind
    return behind.collecting()


def _insert_batch(cache: NodeCache, batch: List[Pending], state: GroupState, stored: Optional[Stored]) -> None:
    """The node-cache inserts of one group's small members, and the destinations left to them.

    A process that collects inserts (:mod:`transfer.cache.behind`, the node stager) wrote the
    destinations already and inserts after the job's answer (not with peers, who publish at
    once); otherwise one batch now, which also materialises each member's destinations from
    its new entry (as a hit would: one file written per member, not two). Members the cache
    could not take are written directly."""
    from transfer.cache import behind
    members = [(key, data, sha256) for key, data, sha256, _ in batch]
    if stored is None and not any(reads for _, _, _, reads in batch) and behind.offer(cache, members):
        return
    done = set(cache.insert_members(members, dests=[[r.dest_path for r in reads] for _, _, _, reads in batch]))
    for key, data, _, reads in batch:
        for read in reads:
            if key not in done:
                atomic_write_bytes(read.dest_path, data)
            state.done[read.position] = len(data)
        if stored is not None and key in done:
            stored(key)


def read_member(backend: Backend, bundle: LoadedBundle, member: Member, sink: BinaryIO) -> ObjectInfo:
    """One member streamed into ``sink`` (a node-cache entry's temp file, or any writable),
    checked against its SHA-256 (BundleFormatError when it fails); NotFound when the bundle is
    gone, before any byte."""
    failures = stream_members(backend, bundle, [member], lambda m: _SinkWriter(sink))
    if failures:
        raise failures[member.name]
    return ObjectInfo(bundle.url, member.size)


class _SinkWriter:
    def __init__(self, sink: BinaryIO) -> None:
        self._sink = sink

    def write(self, data: bytes) -> None:
        self._sink.write(data)

    def commit(self) -> None:
        pass

    def abort(self) -> None:
        pass


class _FanOut:
    """Writes one member to every destination that wants it; commit publishes them all and
    hands the member to the node cache under its key.

    A member of up to :data:`BUFFERED` bytes is kept in memory. With the cache on, it joins
    the group's ``batch`` (its bytes, the SHA-256 they were verified against, and, when
    ``from_entry``, its destinations, which :func:`_insert_batch` then makes from the new entry);
    without, each destination is written with one ``atomic_write_bytes`` (four system calls).
    A bigger member streams into atomic temp files from its first byte past the limit, and its
    first destination is hard-linked into the cache."""

    def __init__(self, reads: List[MemberRead], state: GroupState, cache: Optional[NodeCache],
                 key: Optional[str], stored: Optional[Stored], batching: Tuple[str, List[Pending], bool]) -> None:
        self._reads, self._state, self._cache, self._key, self._stored = reads, state, cache, key, stored
        self._sha256, self._batch, self._from_entry = batching
        self._buffer: Optional[bytearray] = bytearray()
        self._files: List[AtomicFile] = []
        self._size = 0

    def write(self, data: bytes) -> None:
        self._size += len(data)
        if self._buffer is not None:
            self._buffer += data
            if len(self._buffer) <= BUFFERED:
                return
            data, self._buffer = bytes(self._buffer), None
            self._open_files()
        for out in self._files:
            out.file.write(data)

    def _open_files(self) -> None:
        try:
            for read in self._reads:
                self._files.append(AtomicFile(read.dest_path).__enter__())
        except BaseException:
            self.abort()
            raise

    def commit(self) -> None:
        data = bytes(self._buffer) if self._buffer is not None else None
        if data is not None and self._cache is not None and self._key is not None:
            if self._from_entry and not any(read.symlink for read in self._reads):
                self._batch.append((self._key, data, self._sha256, self._reads))  # written from the entry
                return
            self._batch.append((self._key, data, self._sha256, []))
        if data is not None:
            for read in self._reads:
                atomic_write_bytes(read.dest_path, data)
        else:
            try:
                for out in self._files:
                    out.commit(self._size)
            finally:
                self.abort()  # closes what is left (committed files are already in place)
        for read in self._reads:
            self._state.done[read.position] = self._size
        if self._cache is not None and self._key is not None and data is None:
            # A hard link where the cache hands out links anyway (what a hit would give the job):
            # one directory entry instead of a copy in a new temp file.
            if self._cache.insert_file(self._key, self._reads[0].dest_path, link=True) and self._stored is not None:
                self._stored(self._key)

    def abort(self) -> None:
        files, self._files = self._files, []
        self._buffer = None
        for out in files:
            out.__exit__(None, None, None)
