"""Streaming member bytes out of a bundle: memory stays flat whatever the bundle holds.

:func:`stream_members` fetches the bytes of the wanted members in the fewest requests (none
when the bundle's head already holds them, the whole bundle when most of it is wanted, else
coalesced ranges) and hands each member's bytes, as they arrive, to a :class:`Writer` opened
for it. Gaps between merged ranges pass through and are dropped, never buffered. A member is
committed only after its SHA-256 matched the index; a mismatch or a short member aborts that
member's writer alone and is reported for it, naming the bundle.
"""

from __future__ import annotations


from transfer import _digests
from transfer.backends.base import Backend
from transfer.bundles.directory import WHOLE_FRACTION, LoadedBundle
from transfer.bundles.format import BundleFormatError, Member, coalesce
from transfer.errors import TransferError
from transfer.lean import Protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Sequence, Tuple


class Writer(Protocol):
    """Where one member's bytes go; exactly one of commit/abort is called."""

    def write(self, data: bytes) -> None: ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...


if TYPE_CHECKING:
    OpenWriter = Callable[[Member], Writer]
else:
    OpenWriter = object  # the alias above is for type checkers; typing is not imported at run time


def stream_members(backend: Backend, bundle: LoadedBundle, wanted: Sequence[Member],
                   open_writer: OpenWriter) -> Dict[str, TransferError]:
    """Deliver ``wanted`` members to writers; returns the members that failed their check.

    Transport errors of the store propagate (members already committed stay committed, the
    others' writers are aborted) so that the caller may retry the rest."""
    unique = list({m.name: m for m in wanted}.values())
    failures: Dict[str, TransferError] = {}
    for start, end, members in _plan(bundle, unique):
        splitter = _Splitter(bundle, start, members, open_writer, failures)
        try:
            if bundle.complete or end <= start:  # nothing to ask the store for
                splitter.write(bundle.head[start:end])
            else:
                backend.get(bundle.url, splitter, byte_range=(start, end))  # type: ignore[arg-type]
            splitter.close()
        except BaseException:
            splitter.abort()
            raise
    return failures


def _plan(bundle: LoadedBundle, members: List[Member]) -> List[Tuple[int, int, List[Member]]]:
    """Byte ranges [start, end) to fetch and the members each covers."""
    if not members:
        return []
    data_start = bundle.index.data_start
    data_size = bundle.size - data_start
    if bundle.complete or (data_size and sum(m.size for m in members) >= WHOLE_FRACTION * data_size):
        first = min(data_start + m.offset for m in members)
        last = max(data_start + m.offset + m.size for m in members)
        return [(first, last, members)]
    ranges = coalesce(members, data_start)
    plan: List[Tuple[int, int, List[Member]]] = [(s, e, []) for s, e in ranges]
    for member in members:
        absolute = data_start + member.offset
        for start, end, covered in plan:
            if start <= absolute and absolute + member.size <= end:
                covered.append(member)
                break
    return plan


class _Open:
    __slots__ = ("member", "start", "end", "writer", "digest", "written")

    def __init__(self, member: Member, start: int, writer: Writer) -> None:
        self.member, self.start, self.end, self.writer = member, start, start + member.size, writer
        self.digest = _digests.new("sha256", member.size)
        self.written = 0


class _Splitter:
    """A write-only sink for bundle bytes from ``start`` on; routes them to member writers."""

    def __init__(self, bundle: LoadedBundle, start: int, members: List[Member], open_writer: OpenWriter,
                 failures: Dict[str, TransferError]) -> None:
        self._bundle, self._pos, self._open_writer, self._failures = bundle, start, open_writer, failures
        data_start = bundle.index.data_start
        self._pending = sorted(members, key=lambda m: (m.offset, m.size), reverse=True)  # pop() = next
        self._data_start = data_start
        self._active: List[_Open] = []

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:
        end = self._pos + len(data)
        view = memoryview(data)
        self._start_due(end)
        for item in list(self._active):
            lo, hi = max(item.start, self._pos), min(item.end, end)
            if lo < hi:
                chunk = bytes(view[lo - self._pos:hi - self._pos])
                item.digest.update(chunk)
                item.writer.write(chunk)
                item.written += len(chunk)
            if item.end <= end:
                self._finish(item)
        self._pos = end
        return len(data)

    def _start_due(self, end: int) -> None:
        """Open writers for the members that start before ``end``."""
        while self._pending and self._data_start + self._pending[-1].offset < end:
            member = self._pending.pop()
            self._active.append(_Open(member, self._data_start + member.offset, self._open_writer(member)))

    def _finish(self, item: _Open) -> None:
        self._active.remove(item)
        if item.written == item.member.size and item.digest.hexdigest() == item.member.sha256:
            item.writer.commit()
            return
        item.writer.abort()
        problem = "is truncated" if item.written != item.member.size else "fails its SHA-256 check"
        self._failures[item.member.name] = BundleFormatError(
            f"member {item.member.name!r} of bundle {self._bundle.url} {problem}", url=str(self._bundle.url),
            operation="get")

    def close(self) -> None:
        """The range ended: members not complete by now are truncated."""
        for item in list(self._active):
            self._finish(item)
        while self._pending:
            member = self._pending.pop()
            item = _Open(member, self._data_start + member.offset, self._open_writer(member))
            self._active.append(item)
            self._finish(item)

    def abort(self) -> None:
        for item in self._active:
            item.writer.abort()
        self._active = []
        self._pending = []
