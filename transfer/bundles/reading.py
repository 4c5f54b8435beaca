"""Reading one bundle member, and the key its node-cache entry is kept under.

Cache entries filled from a bundle are keyed by :func:`member_key`: the bundle object's own
cache key plus the member's name and SHA-256. Only a read that resolved (through the
directory's index, see :class:`~transfer.bundles.directory.BundleDirectory`) to that very
member of that very bundle computes that key, so a member can never answer a plain read of
the same name, nor of any other name (docs/bundles.md, "Precedence").

A batch's members are read a bundle at a time by the read stack's bundle layer
(:meth:`~transfer.layers.bundles.BundleLayer.prepare`, through
:func:`~transfer.bundles.fetch.stream_members`); :func:`read_member` is the read of one.
"""

from __future__ import annotations

from transfer.backends.base import Backend, ObjectInfo
from transfer.bundles.directory import LoadedBundle
from transfer.bundles.fetch import stream_members
from transfer.bundles.format import Member

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO


def member_key(bundle_key: str, member: Member) -> str:
    return f"{bundle_key}#member={member.name}#sha256={member.sha256}"


def read_member(backend: Backend, bundle: LoadedBundle, member: Member, sink: BinaryIO) -> ObjectInfo:
    """One member streamed into ``sink`` (a node-cache entry's temp file, or any writable),
    checked against its SHA-256 (BundleFormatError naming the bundle when it fails); NotFound
    when the bundle is gone, before any byte."""
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
