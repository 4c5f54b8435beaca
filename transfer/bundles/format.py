"""The bundle format: many small files in one object, each readable alone by byte range.

Layout (all integers little-endian)::

    offset 0   magic  b"PCBNDL01"                      8 bytes
    offset 8   index length N                           8 bytes, unsigned
    offset 16  index: UTF-8 JSON, N bytes
               {"format": 1, "members": [[name, offset, size, sha256-hex], ...]}
    16 + N     member bytes, back to back; a member's offset is relative to 16 + N

A 300-byte member costs about 100 bytes of index instead of the 724 bytes of header and
padding a ustar member would add, and the index sits at the front, so one ranged GET of
the first few KiB returns the index (and, for a small bundle, the whole bundle). Whole-bundle
compression was rejected: it would make members unreachable by range.

A bundle is untrusted input. :func:`parse_index` refuses names that are absolute, contain
``..``, empty or ``.`` components, backslashes or control characters, duplicate names, and
offsets outside the data; members carry no types, so links and devices cannot be expressed.
Readers verify each member's SHA-256 before writing it anywhere.
"""

from __future__ import annotations

import struct
from transfer import _digests
from transfer.lean import Buffer, record
from transfer.lean_json import dumps

from transfer.bundles.scan import IndexSyntaxError, index_rows
from transfer.errors import ChecksumMismatch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

MAGIC = b"PCBNDL01"
PREAMBLE = 16
FORMAT = 1
MAX_INDEX_BYTES = 256 << 20  # about 2.5 million rows of short names
MAX_NAME = 1024
CHUNK = 1 << 20  # index bytes decoded at a time
MAX_MEMBERS = 2_000_000  # per directory (objects and members); docs/bundles.md gives the memory
_HEX_DIGITS = "0123456789abcdef"
_UNSAFE_CHARS = frozenset([chr(c) for c in range(0x20)] + ["\x7f", "\\"])  # control characters and backslash


class BundleFormatError(ChecksumMismatch):
    """The bytes are not a well-formed, safe bundle (retried: it may be a damaged download)."""


@record(frozen=True)
class Member:
    name: str
    offset: int  # relative to the data start
    size: int
    sha256: str


class BundleIndex:
    """The parsed index of one bundle; ``data_start`` is where member offsets count from.

    Stored compactly (a name -> row dictionary, offsets and sizes as 8-byte integers and
    digests as raw bytes in byte arrays: under 200 bytes per member), because a directory
    may hold a million members. (Not :mod:`array`: it imports ``collections``, ~4 ms of every
    job step that reads a bundle.)
    """

    def __init__(self, members: Iterable[Member], data_start: int) -> None:
        self.data_start = data_start
        self._rows: Dict[str, int] = {}  # insertion-ordered: rows are 0, 1, 2, ...
        self._offsets = bytearray()
        self._sizes = bytearray()
        self._digests = bytearray()
        for member in members:
            self._add(member.name, member.offset, member.size, member.sha256)

    def _add(self, name: str, offset: int, size: int, sha256: str) -> None:
        if name in self._rows:
            raise BundleFormatError(f"duplicate member name {name!r:.80}")
        self._rows[name] = len(self._rows)
        self._offsets += offset.to_bytes(8, "little", signed=True)
        self._sizes += size.to_bytes(8, "little", signed=True)
        self._digests += bytes.fromhex(sha256)

    def __len__(self) -> int:
        return len(self._rows)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, BundleIndex) and self.data_start == other.data_start
                and self.members == other.members)

    __hash__ = None  # type: ignore[assignment]

    def get(self, name: str) -> Optional[Member]:
        row = self._rows.get(name)
        return None if row is None else self._member(name, row)

    def _member(self, name: str, row: int) -> Member:
        at = 8 * row
        return Member(name, int.from_bytes(self._offsets[at:at + 8], "little", signed=True),
                      int.from_bytes(self._sizes[at:at + 8], "little", signed=True),
                      self._digests[32 * row:32 * row + 32].hex())

    @property
    def members(self) -> Tuple[Member, ...]:
        return tuple(self._member(name, row) for name, row in self._rows.items())

    def names(self) -> List[str]:
        return list(self._rows)

    def __iter__(self) -> Iterator[str]:
        """The member names, in index order (the index's own strings: no copies)."""
        return iter(self._rows)

    def by_name(self) -> Dict[str, Member]:
        return {m.name: m for m in self.members}

    @property
    def total_size(self) -> int:
        sizes = self._sizes
        return self.data_start + sum(int.from_bytes(sizes[at:at + 8], "little", signed=True)
                                     for at in range(0, len(sizes), 8))


def check_name(name: object) -> str:
    """Return ``name`` if it is a safe relative member name, else raise BundleFormatError."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise BundleFormatError(f"bad member name {name!r}")
    if name[0] == "/" or not _UNSAFE_CHARS.isdisjoint(name):
        raise BundleFormatError(f"unsafe member name {name!r}")
    parts = name.split("/")
    if "" in parts or "." in parts or ".." in parts:
        raise BundleFormatError(f"unsafe member name {name!r}")
    return name


def pack(members: Sequence[Tuple[str, bytes]], out: BinaryIO) -> BundleIndex:
    """Write a bundle of ``(name, data)`` pairs to ``out``; returns its index."""
    entries: List[Member] = []
    offset = 0
    for name, data in members:
        entries.append(Member(check_name(name), offset, len(data), _digests.sha256_hex(data)))
        offset += len(data)
    if len({m.name for m in entries}) != len(entries):
        raise BundleFormatError("duplicate member names")
    document = dumps({"format": FORMAT, "members": [[m.name, m.offset, m.size, m.sha256] for m in entries]},
                       separators=(",", ":")).encode()
    out.write(MAGIC + struct.pack("<Q", len(document)) + document)
    for _, data in members:
        out.write(data)
    return BundleIndex(entries, PREAMBLE + len(document))


def index_length(head: bytes) -> int:
    """Bytes needed from the start of the bundle to parse its index."""
    if len(head) < PREAMBLE or head[:8] != MAGIC:
        raise BundleFormatError("not a bundle (bad magic)")
    (length,) = struct.unpack("<Q", head[8:PREAMBLE])
    if length > MAX_INDEX_BYTES:
        raise BundleFormatError(f"bundle index of {length} bytes is too large")
    return PREAMBLE + int(length)


def parse_index(head: bytes, object_size: Optional[int] = None, max_members: int = MAX_MEMBERS) -> BundleIndex:
    """Parse and validate the index from the first bytes of a bundle (all of the index)."""
    end = index_length(head)
    if len(head) < end:
        raise BundleFormatError(f"need {end} bytes to read the index, have {len(head)}")
    view = memoryview(head)
    chunks = (view[start:min(start + CHUNK, end)] for start in range(PREAMBLE, end, CHUNK))
    return parse_index_chunks(chunks, end, object_size, max_members)


def parse_index_chunks(chunks: Iterable[Buffer], end: int, object_size: Optional[int] = None,
                       max_members: int = MAX_MEMBERS) -> BundleIndex:
    """Parse the index text arriving in ``chunks`` (the bytes after the preamble, up to ``end``).

    Rows are decoded one at a time from a small window into the compact index, so memory is
    one chunk plus under 200 bytes per member; more than ``max_members`` rows is an error."""
    data_size = None if object_size is None else object_size - end
    index = BundleIndex((), end)
    try:
        for row in index_rows(chunks, max_members):
            member = _member(row)
            if data_size is not None and member.offset + member.size > data_size:
                raise BundleFormatError(f"member {member.name!r:.80} lies outside the bundle")
            index._add(member.name, member.offset, member.size, member.sha256)
    except IndexSyntaxError as err:
        raise BundleFormatError(err.message) from None
    return index


def _member(row: object) -> Member:
    if not (isinstance(row, list) and len(row) == 4):
        raise BundleFormatError(f"bad index row {row!r:.80}")
    name, offset, size, digest = row
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (offset, size)):
        raise BundleFormatError(f"bad offset/size for {name!r:.80}")
    if not (isinstance(digest, str) and len(digest) == 64 and not digest.strip(_HEX_DIGITS)):
        raise BundleFormatError(f"bad checksum for {name!r:.80}")
    return Member(check_name(name), offset, size, digest)


def member_bytes(index: BundleIndex, member: Member, data: bytes, data_offset: int = 0) -> bytes:
    """The verified bytes of ``member`` from ``data``, which starts at bundle offset ``data_offset``."""
    start = index.data_start + member.offset - data_offset
    blob = data[start:start + member.size]
    if start < 0 or len(blob) != member.size:
        raise BundleFormatError(f"member {member.name!r} is truncated")
    if _digests.sha256_hex(blob) != member.sha256:
        raise BundleFormatError(f"member {member.name!r} fails its SHA-256 check")
    return blob


def coalesce(members: Iterable[Member], data_start: int, gap: int = 64 << 10) -> List[Tuple[int, int]]:
    """Absolute byte ranges [start, end) covering ``members``, merging ranges closer than ``gap``."""
    spans = sorted((data_start + m.offset, data_start + m.offset + m.size) for m in members)
    merged: List[Tuple[int, int]] = []
    for start, end in spans:
        if merged and start - merged[-1][1] <= gap:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged
