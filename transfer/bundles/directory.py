"""The bundles of one object-store directory: where they are, what they hold, what was removed.

Bundles of directory ``D`` are objects ``D/.cloudio-bundles/<name>.pcb``; removing bundled
members writes a record ``D/.cloudio-bundles/<name>.pcb.rm-<id>`` (a JSON list of names).
Everything lives under ``D/``, so a recursive remove of ``D`` removes bundles too.

:meth:`BundleDirectory.load` costs one LIST (per 1,000 bundles) plus one ranged GET of the
first :data:`HEAD_BYTES` of each bundle, which for a bundle of small files is the whole
bundle; those bytes are kept, so such a bundle is never downloaded twice.
"""

from __future__ import annotations

import io
import json
import posixpath
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from transfer.backends.base import Backend, ObjectInfo
from transfer.bundles.format import BundleFormatError, BundleIndex, Member, coalesce, index_length, parse_index
from transfer.errors import NotFound
from transfer.urls import Url

BUNDLE_DIR = ".cloudio-bundles"
SUFFIX = ".pcb"
HEAD_BYTES = 256 << 10
WHOLE_FRACTION = 0.5  # fetch the whole bundle when at least this share of its data is wanted

MapFn = Callable[[Callable[[Any], Any], Iterable[Any]], Iterator[Any]]  # map, or Executor.map


@dataclass
class LoadedBundle:
    """One bundle: its URL and size, its index, and any leading bytes already fetched."""

    url: Url
    size: int
    index: BundleIndex
    head: bytes
    removed: Set[str] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        return len(self.head) >= self.size

    def live_members(self) -> List[Member]:
        return [m for m in self.index.members if m.name not in self.removed]


def bundle_dir_url(directory: Url) -> Url:
    return directory.with_path(posixpath.join(directory.path.rstrip("/"), BUNDLE_DIR))


def new_bundle_url(directory: Url) -> Url:
    """A fresh, time-ordered bundle name (later bundles win on duplicate member names)."""
    name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:12]}"
    return bundle_dir_url(directory).with_path(f"{bundle_dir_url(directory).path}/{name}{SUFFIX}")


class BundleDirectory:
    """The loaded bundle index of one directory; member lookups are pure dictionary reads."""

    def __init__(self, directory: Url, bundles: Sequence[LoadedBundle]) -> None:
        self.directory = directory
        self.bundles = list(bundles)
        self._members: Dict[str, Tuple[LoadedBundle, Member]] = {}
        for bundle in self.bundles:  # oldest first, so later bundles win
            for member in bundle.live_members():
                self._members[member.name] = (bundle, member)

    def __len__(self) -> int:
        return len(self._members)

    def lookup(self, name: str) -> Optional[Tuple[LoadedBundle, Member]]:
        return self._members.get(name)

    @classmethod
    def load(cls, backend: Backend, directory: Url, map_fn: MapFn = map) -> "BundleDirectory":
        try:
            listed = list(backend.list(bundle_dir_url(directory)))
        except NotFound:
            return cls(directory, [])
        bundles = sorted((i for i in listed if i.url.path.endswith(SUFFIX)), key=lambda i: i.url.path)
        records = [i for i in listed if f"{SUFFIX}.rm-" in posixpath.basename(i.url.path)]
        loaded = list(map_fn(lambda info: _load_bundle(backend, info), bundles))
        by_path = {b.url.path: b for b in loaded}
        for path, names in map_fn(lambda info: (info.url.path, _read_record(backend, info.url)), records):
            owner = by_path.get(path.rsplit(".rm-", 1)[0])
            if owner is not None:
                owner.removed.update(names)
        return cls(directory, loaded)


def _load_bundle(backend: Backend, info: ObjectInfo) -> LoadedBundle:
    head = _get_range(backend, info.url, 0, min(info.size, HEAD_BYTES))
    needed = index_length(head)
    if needed > len(head):
        head += _get_range(backend, info.url, len(head), needed)
    return LoadedBundle(info.url, info.size, parse_index(head, info.size), head)


def _get_range(backend: Backend, url: Url, start: int, end: int) -> bytes:
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
        names = json.loads(sink.getvalue().decode())
    except ValueError:
        raise BundleFormatError("malformed removal record", url=str(url)) from None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def fetch_members(backend: Backend, bundle: LoadedBundle, wanted: Sequence[Member]) -> Tuple[bytes, int]:
    """Bytes covering ``wanted`` and the bundle offset they start at, in the fewest requests:
    nothing if the head holds them, the whole bundle if most of it is wanted, else coalesced ranges
    (returned as one buffer with gaps filled by zeros)."""
    if bundle.complete:
        return bundle.head, 0
    data_size = bundle.size - bundle.index.data_start
    wanted_bytes = sum(m.size for m in wanted)
    if data_size and wanted_bytes >= WHOLE_FRACTION * data_size:
        sink = io.BytesIO()
        backend.get(bundle.url, sink)
        return sink.getvalue(), 0
    ranges = coalesce(wanted, bundle.index.data_start)
    base = ranges[0][0]
    buffer = bytearray(ranges[-1][1] - base)
    for start, end in ranges:
        buffer[start - base:end - base] = _get_range(backend, bundle.url, start, end)
    return bytes(buffer), base


def removal_record_url(bundle: LoadedBundle) -> Url:
    return bundle.url.with_path(f"{bundle.url.path}.rm-{uuid.uuid4().hex}")
