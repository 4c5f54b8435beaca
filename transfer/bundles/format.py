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

import hashlib
import json
import re
import struct
from dataclasses import dataclass
from typing import BinaryIO, Dict, Iterable, List, Optional, Sequence, Tuple

from transfer.errors import ChecksumMismatch

MAGIC = b"PCBNDL01"
PREAMBLE = 16
FORMAT = 1
MAX_INDEX_BYTES = 64 << 20
MAX_NAME = 1024
_UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")  # control characters and backslash


class BundleFormatError(ChecksumMismatch):
    """The bytes are not a well-formed, safe bundle (retried: it may be a damaged download)."""


@dataclass(frozen=True)
class Member:
    name: str
    offset: int  # relative to the data start
    size: int
    sha256: str


@dataclass(frozen=True)
class BundleIndex:
    """The parsed index of one bundle; ``data_start`` is where member offsets count from."""

    members: Tuple[Member, ...]
    data_start: int

    def by_name(self) -> Dict[str, Member]:
        return {m.name: m for m in self.members}

    @property
    def total_size(self) -> int:
        return self.data_start + sum(m.size for m in self.members)


def check_name(name: object) -> str:
    """Return ``name`` if it is a safe relative member name, else raise BundleFormatError."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise BundleFormatError(f"bad member name {name!r}")
    if name[0] == "/" or _UNSAFE_CHARS.search(name):
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
        entries.append(Member(check_name(name), offset, len(data), hashlib.sha256(data).hexdigest()))
        offset += len(data)
    if len({m.name for m in entries}) != len(entries):
        raise BundleFormatError("duplicate member names")
    index = json.dumps({"format": FORMAT, "members": [[m.name, m.offset, m.size, m.sha256] for m in entries]},
                       separators=(",", ":")).encode()
    out.write(MAGIC + struct.pack("<Q", len(index)) + index)
    for _, data in members:
        out.write(data)
    return BundleIndex(tuple(entries), PREAMBLE + len(index))


def index_length(head: bytes) -> int:
    """Bytes needed from the start of the bundle to parse its index."""
    if len(head) < PREAMBLE or head[:8] != MAGIC:
        raise BundleFormatError("not a bundle (bad magic)")
    (length,) = struct.unpack("<Q", head[8:PREAMBLE])
    if length > MAX_INDEX_BYTES:
        raise BundleFormatError(f"bundle index of {length} bytes is too large")
    return PREAMBLE + int(length)


def parse_index(head: bytes, object_size: Optional[int] = None) -> BundleIndex:
    """Parse and validate the index from the first bytes of a bundle."""
    end = index_length(head)
    if len(head) < end:
        raise BundleFormatError(f"need {end} bytes to read the index, have {len(head)}")
    try:
        document = json.loads(head[PREAMBLE:end].decode("utf-8"))
        rows = document["members"] if document.get("format") == FORMAT else None
    except (ValueError, AttributeError, KeyError, TypeError):
        raise BundleFormatError("bundle index is not valid JSON of format 1") from None
    if not isinstance(rows, list):
        raise BundleFormatError("bundle index has no member list")
    members = tuple(_member(row) for row in rows)
    if len({m.name for m in members}) != len(members):
        raise BundleFormatError("duplicate member names")
    data_size = None if object_size is None else object_size - end
    for m in members:
        if data_size is not None and m.offset + m.size > data_size:
            raise BundleFormatError(f"member {m.name!r} lies outside the bundle")
    return BundleIndex(members, end)


def _member(row: object) -> Member:
    if not (isinstance(row, list) and len(row) == 4):
        raise BundleFormatError(f"bad index row {row!r:.80}")
    name, offset, size, digest = row
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (offset, size)):
        raise BundleFormatError(f"bad offset/size for {name!r:.80}")
    if not (isinstance(digest, str) and len(digest) == 64):
        raise BundleFormatError(f"bad checksum for {name!r:.80}")
    return Member(check_name(name), offset, size, digest)


def member_bytes(index: BundleIndex, member: Member, data: bytes, data_offset: int = 0) -> bytes:
    """The verified bytes of ``member`` from ``data``, which starts at bundle offset ``data_offset``."""
    start = index.data_start + member.offset - data_offset
    blob = data[start:start + member.size]
    if start < 0 or len(blob) != member.size:
        raise BundleFormatError(f"member {member.name!r} is truncated")
    if hashlib.sha256(blob).hexdigest() != member.sha256:
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
