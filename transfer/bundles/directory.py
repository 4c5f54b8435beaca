"""The bundles of one object-store directory: where they are, what they hold, what was removed.

Bundles of directory ``D`` are objects ``D/.cloudio-bundles/<name>.pcb``; removing bundled
members writes a record ``D/.cloudio-bundles/<name>.pcb.rm-<id>`` (a JSON list of names).
Everything lives under ``D/``, so a recursive remove of ``D`` removes bundles too.

:meth:`BundleDirectory.load` costs one LIST of ``D/`` (per 1,000 objects; it shows the plain
objects and the bundles together) plus one GET of the first :data:`HEAD_BYTES` of each
bundle, which for a bundle of small files is the whole bundle (such bundles are read in one
pipelined pass where the backend offers it); those bytes are kept (up to
:data:`KEPT_HEAD_BYTES` per directory), so such a bundle is never downloaded twice. A reader
that takes members one at a time (the per-file path) asks :meth:`BundleDirectory.resident`
first, which fetches a larger bundle whole, once, within the same budget: 6,173 members of
300 B are then one GET, not one ranged GET each.

Isolation and precedence (docs/bundles.md): a bundle that cannot be read or fails validation
is set aside as *broken*; it affects only lookups that find nothing else, whose error then
names it. A plain object wins over a bundle member of the same name; such conflicts are
reported once per directory. Later bundles win over earlier ones on duplicate member names.
"""

from __future__ import annotations

import io
import os
import posixpath
import time

from transfer import _threads
from transfer.lean import logger, field, record
from transfer.lean_json import loads

from transfer.backends.base import Backend, Namespace, ObjectInfo, batch_reads, dials_ahead
from transfer.bundles.format import (
    CHUNK,
    MAX_MEMBERS,
    PREAMBLE,
    BundleFormatError,
    BundleIndex,
    Member,
    index_length,
    parse_index,
    parse_index_chunks,
)
from transfer.errors import NotFound, TransferError
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from _thread import LockType
    from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

BUNDLE_DIR = ".cloudio-bundles"
SUFFIX = ".pcb"
HEAD_BYTES = 256 << 10
KEPT_HEAD_BYTES = 16 << 20  # bytes of small bundles kept in memory per directory
_log = logger(__name__)  # logging is imported when a warning is first logged
# Requests in flight per connection when reading heads, at most: a directory's bundles were just
# listed, so they are spread over every connection and sent at once (one round trip for up to
# connections x this many), and a deeper pass would hold too many unparsed heads.
_HEADS_DEPTH = 8
WHOLE_FRACTION = 0.5  # fetch the whole bundle when at least this share of its data is wanted
# Bytes of the directory's bundles per file a batch wants below which the load reads them whole
# (up to KEPT_HEAD_BYTES): the gap under which ranged reads of members are merged anyway
# (format.coalesce), so a whole bundle costs no more bytes than its members would, and the
# GETs of the rest of its index and then of its data (two round trips) are never sent.
WHOLE_PER_FILE = 64 << 10

if TYPE_CHECKING:
    MapFn = Callable[[Callable[[Any], Any], Iterable[Any]], Iterator[Any]]  # map, or Executor.map
else:
    MapFn = object  # the alias above is for type checkers; typing is not imported at run time


@record
class LoadedBundle:
    """One bundle: its URL and size, its index, and (for a small bundle) all its bytes."""

    url: Url
    size: int
    index: BundleIndex
    head: bytes
    removed: Set[str] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        return len(self.head) >= self.size

    def live(self, name: str) -> Optional[Member]:
        return None if name in self.removed else self.index.get(name)

    def live_members(self) -> List[Member]:
        return [m for m in self.index.members if m.name not in self.removed]


@record(frozen=True)
class BrokenBundle:
    """A bundle set aside: it could not be fetched or failed validation."""

    url: Url
    error: TransferError


def bundle_dir_url(directory: Url) -> Url:
    """``directory``'s bundle directory (its query, a SAS, kept as a query: never in the key)."""
    return directory.with_bare_path(posixpath.join(directory.bare_path.rstrip("/"), BUNDLE_DIR))


def new_bundle_url(directory: Url) -> Url:
    """A fresh, time-ordered bundle name (later bundles win on duplicate member names)."""
    name = f"{time.time_ns():020d}-{os.urandom(6).hex()}"  # as random as uuid4's first 12 digits, no uuid import
    bundles = bundle_dir_url(directory)
    return bundles.with_bare_path(f"{bundles.bare_path}/{name}{SUFFIX}")


class BundleDirectory:
    """The loaded bundle index of one directory; member lookups are pure dictionary reads."""

    def __init__(self, directory: Url, bundles: Sequence[LoadedBundle], plain: Iterable[str] = (),
                 broken: Sequence[BrokenBundle] = ()) -> None:
        self.directory = directory
        self.bundles = list(bundles)  # oldest first
        self.plain = plain if isinstance(plain, (set, frozenset)) else set(plain)
        self.broken = list(broken)
        # With several bundles, one name -> bundle table spares a scan of every bundle per
        # lookup (~45 bytes per member; its keys are the indexes' own strings).
        self._where: Optional[Dict[str, int]] = None
        if len(self.bundles) > 1:
            self._where = {}
            for position, bundle in enumerate(self.bundles):
                for name in bundle.index:
                    self._where[name] = position
        self._kept = sum(len(b.head) for b in self.bundles)
        self._fill_locks: Dict[str, LockType] = {}
        self._lock = _threads.Lock()
        self.conflicts = sorted(name for name in self.plain if self._member(name) is not None)
        if self.conflicts:
            _log.warning("%s: %d plain object(s) share a name with a bundle member (e.g. %s); the plain "
                         "object is served", directory, len(self.conflicts), self.conflicts[0])

    def lookup(self, name: str) -> Optional[Tuple[LoadedBundle, Member]]:
        """The member serving ``name``: None when a plain object has that name or no bundle does."""
        return None if name in self.plain else self._member(name)

    def _member(self, name: str) -> Optional[Tuple[LoadedBundle, Member]]:
        """The live member of the latest bundle holding ``name``."""
        candidates: Sequence[LoadedBundle] = self.bundles
        if self._where is not None:
            position = self._where.get(name)
            if position is None:
                return None
            candidates = self.bundles[:position + 1]  # a removal may uncover an older bundle's
        for bundle in reversed(candidates):
            member = bundle.live(name)
            if member is not None:
                return bundle, member
        return None

    def resident(self, backend: Backend, bundle: LoadedBundle) -> LoadedBundle:
        """``bundle`` with all its bytes in memory when they fit what the directory may still
        keep (:data:`KEPT_HEAD_BYTES`): fetched whole by one GET, once; concurrent callers wait
        for that one fetch. A bundle that does not fit, or whose fetch fails, is returned as
        is (the member read then uses ranges, and reports any error)."""
        if bundle.complete or bundle.size > KEPT_HEAD_BYTES:
            return bundle
        with self._lock:
            lock = self._fill_locks.setdefault(bundle.url.path, _threads.Lock())
        with lock:  # one fetch per bundle; other bundles of the directory are not held up
            with self._lock:
                if bundle.complete or self._kept + bundle.size > KEPT_HEAD_BYTES:
                    return bundle
            try:
                data = _get_range(backend, bundle.url, 0, bundle.size)
            except TransferError:
                return bundle  # the member read meets the same error and reports it
            with self._lock:
                if self._kept + len(data) <= KEPT_HEAD_BYTES:
                    bundle.head = data
                    self._kept += len(data)
        return bundle

    def why_missing(self) -> str:
        """For a NotFound error: the bundles of this directory that could not be searched."""
        if not self.broken:
            return ""
        first = self.broken[0]
        more = f" and {len(self.broken) - 1} more" if len(self.broken) > 1 else ""
        return f" (bundle {first.url}{more} in its directory could not be read: {first.error.message})"

    @classmethod
    def load(cls, backend: Backend, directory: Url, map_fn: MapFn = map,
             max_entries: int = MAX_MEMBERS, connections: int = 1, wanted: int = 0) -> "BundleDirectory":
        """List ``directory`` once and read its bundles' indexes; a bad bundle is set aside.
        Bundles no larger than :data:`HEAD_BYTES` are read whole in one pipelined pass over up
        to ``connections`` connections when the backend offers it (:func:`_read_whole`), the
        rest through ``map_fn``; the pass's connections are dialled while the listing is in
        flight (:class:`~transfer.backends.base.DialsAhead`), so their TCP handshakes cost no
        round trip of their own (over TLS, their TLS handshakes one round trip together).
        A caller that will read ``wanted`` files of the directory has larger bundles read whole
        too, in one GET each, when all of the directory's bundles come to less than
        :data:`WHOLE_PER_FILE` per wanted file and fit :data:`KEPT_HEAD_BYTES` (a head of
        :data:`HEAD_BYTES` would be followed by a GET of the rest of the index, then one of
        the data).

        Raises TransferError when the listing fails or the directory holds more than
        ``max_entries`` objects and members together."""
        ahead = dials_ahead(backend) if connections > 1 and batch_reads(backend) is not None else None
        if ahead is not None:
            ahead.dial_ahead(directory, connections)
        bundles, records, plain = _list(backend, directory, max_entries)
        results: List["LoadedBundle | BrokenBundle | None"] = _read_whole(backend, bundles, max_entries, connections)
        rest = [info for info, result in zip(bundles, results) if result is None]
        total = sum(info.size for info in bundles)
        head = total if total <= min(KEPT_HEAD_BYTES, wanted * WHOLE_PER_FILE) else HEAD_BYTES
        loaded_rest = iter(map_fn(lambda info: _try_load(backend, info, max_entries, head), rest))
        results = [next(loaded_rest) if result is None else result for result in results]
        loaded = [r for r in results if isinstance(r, LoadedBundle)]
        broken = [r for r in results if isinstance(r, BrokenBundle)]
        entries = len(plain) + sum(len(b.index) for b in loaded)
        if entries > max_entries:
            raise BundleFormatError(f"{directory} holds {entries} objects and bundle members, more than "
                                    f"the bundle index limit of {max_entries}", url=str(directory))
        _drop_heads(loaded)
        by_path = {b.url.bare_path: b for b in loaded}
        for path, names in map_fn(lambda info: (info.url.bare_path, _read_record(backend, info.url)), records):
            owner = by_path.get(path.rsplit(".rm-", 1)[0])
            if owner is not None:
                owner.removed.update(names)
        return cls(directory, loaded, plain, broken)


def _list(backend: Backend, directory: Url, max_entries: int) -> Tuple[List[ObjectInfo], List[ObjectInfo], Set[str]]:
    """(bundles oldest first, removal records, plain names relative to ``directory``)."""
    prefix = directory.bare_path.rstrip("/") + "/"
    marker = prefix + BUNDLE_DIR + "/"
    bundles: List[ObjectInfo] = []
    records: List[ObjectInfo] = []
    plain: Set[str] = set()
    if not isinstance(backend, Namespace):
        return bundles, records, plain  # a source that cannot be listed holds no bundles we can find
    try:
        for info in backend.list(directory):
            path = info.url.bare_path  # a listing's URLs keep the directory's query (a SAS)
            if path.startswith(marker):
                if path.endswith(SUFFIX):
                    bundles.append(info)
                elif f"{SUFFIX}.rm-" in posixpath.basename(path):
                    records.append(info)
            elif path.startswith(prefix):
                plain.add(path[len(prefix):])
                if len(plain) > max_entries:
                    raise BundleFormatError(f"{directory} holds more than {max_entries} objects, the bundle "
                                            "index limit", url=str(directory))
    except NotFound:
        pass
    bundles.sort(key=lambda i: i.url.bare_path)
    return bundles, records, plain


def _read_whole(backend: Backend, bundles: Sequence[ObjectInfo], max_members: int,
                connections: int) -> List["LoadedBundle | BrokenBundle | None"]:
    """The small bundles of ``bundles`` (at most :data:`HEAD_BYTES`, so a head would be all of
    each) read whole in one pass of pipelined GETs (:class:`BatchReads`), by position; None
    where a bundle is left to :func:`_try_load` -- a larger one, a backend without pipelined
    reads, fewer than two small bundles, and any the pass did not take (an error answer, a
    failed check, a body whose size differs from the listing's, an index that does not parse):
    the one-request path reads it again and reports what it meets, as without this pass.
    The bundles were just listed, so the pass sends them all at once, spread over the
    connections (at most :data:`_HEADS_DEPTH` on each): at 7 connections, up to 56 bundles'
    heads take one round trip (16 took three when each connection started with one request)."""
    results: List["LoadedBundle | BrokenBundle | None"] = [None] * len(bundles)
    reader = batch_reads(backend)
    small = [k for k, info in enumerate(bundles) if info.size <= HEAD_BYTES]
    if reader is None or len(small) < 2:
        return results

    def take(j: int, body: bytes, stored: ObjectInfo, sent: float) -> bool:
        info = bundles[small[j]]
        if len(body) != info.size or index_length(body) > len(body):
            return False
        results[small[j]] = LoadedBundle(info.url, info.size, parse_index(body, info.size, max_members), body)
        return True  # what parse_index raises leaves the bundle to the one-request path

    connections = max(1, connections)
    depth = min(_HEADS_DEPTH, -(-len(small) // connections))
    reader.read_small([bundles[k].url for k in small], take, connections=connections, depth=depth, eager=True)
    return results


def _try_load(backend: Backend, info: ObjectInfo, max_members: int,
              head_bytes: int = HEAD_BYTES) -> "LoadedBundle | BrokenBundle":
    try:
        return _load_bundle(backend, info, max_members, head_bytes)
    except TransferError as err:
        err.url = err.url or str(info.url)
        _log.warning("bundle %s set aside: %s", info.url, err.message)
        return BrokenBundle(info.url, err)


def _load_bundle(backend: Backend, info: ObjectInfo, max_members: int, head_bytes: int = HEAD_BYTES) -> LoadedBundle:
    """Fetch its first ``head_bytes`` and parse one bundle's index; an index longer than the
    head arrives in CHUNK ranges."""
    if info.size < PREAMBLE:  # no range to ask for: say what is wrong, not what a store answers
        why = "empty" if not info.size else f"{info.size} bytes, shorter than its {PREAMBLE}-byte preamble"
        raise BundleFormatError(f"the bundle is {why}", url=str(info.url))
    head = _get_range(backend, info.url, 0, min(info.size, head_bytes))
    end = index_length(head)
    if end > info.size:
        raise BundleFormatError(f"bundle index of {end} bytes is longer than the bundle", url=str(info.url))
    if end <= len(head):
        index = parse_index(head, info.size, max_members)
    else:
        def chunks() -> Iterator[bytes]:
            yield head[PREAMBLE:]
            for start in range(len(head), end, CHUNK):
                yield _get_range(backend, info.url, start, min(start + CHUNK, end))

        index = parse_index_chunks(chunks(), end, info.size, max_members)
    return LoadedBundle(info.url, info.size, index, head if len(head) >= info.size else b"")


def _drop_heads(bundles: Sequence[LoadedBundle]) -> None:
    """Keep the bytes of complete small bundles up to KEPT_HEAD_BYTES per directory."""
    kept = 0
    for bundle in bundles:
        if bundle.head:
            kept += len(bundle.head)
            if kept > KEPT_HEAD_BYTES:
                bundle.head = b""


def _get_range(backend: Backend, url: Url, start: int, end: int) -> bytes:
    """Bytes [start, end) of ``url``: one ranged GET, none for an empty range (which a Range
    header cannot express)."""
    if end <= start:
        return b""
    sink = io.BytesIO()
    backend.get(url, sink, byte_range=(start, end))
    data = sink.getvalue()
    if len(data) != end - start:
        raise BundleFormatError(f"short read of bundle bytes {start}-{end}", url=str(url))
    return data


def _read_record(backend: Backend, url: Url) -> List[str]:
    sink = io.BytesIO()
    backend.get(url, sink)
    try:
        names = loads(sink.getvalue().decode())
    except ValueError:
        raise BundleFormatError("malformed removal record", url=str(url)) from None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def removal_record_url(bundle: LoadedBundle) -> Url:
    return bundle.url.with_bare_path(f"{bundle.url.bare_path}.rm-{os.urandom(16).hex()}")
