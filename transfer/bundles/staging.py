"""Bundling as the engine uses it: which transfers go through bundles, and how.

* Downloads: for object-store sources on sites with bundling on, the source's directory index
  is read once per directory per process; transfers whose file is a bundle member are grouped
  per bundle and each bundle is fetched once (whole, or in coalesced ranges). A file that is
  not in any bundle is an ordinary GET, so plain objects and members mix freely. A plain GET
  that answers 404 also looks in the directory's bundles, whatever the settings.
* Uploads: small files going to one directory in one batch, at least ``bundle_min_files`` of
  them, are packed into bundles of at most ``bundle_max_size`` bytes and uploaded instead.
* Removes: removing a bundled file writes a removal record; a bundle whose last member is
  removed is deleted together with its records.
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
import threading
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Set, Tuple

from transfer.atomic import local_error
from transfer.backends.base import Backend
from transfer.bundles.directory import (
    BundleDirectory,
    LoadedBundle,
    MapFn,
    fetch_members,
    new_bundle_url,
    removal_record_url,
)
from transfer.bundles.format import Member, member_bytes, pack
from transfer.config import Settings
from transfer.errors import TransferError
from transfer.ops import Remove, Transfer
from transfer.session import Session
from transfer.urls import Url

OBJECT_SCHEMES = frozenset({"s3", "s3s", "gs"})
Indexed = List[Tuple[int, Transfer]]


@dataclass
class DownloadGroup:
    """Transfers served by one bundle: (position in batch, transfer, member)."""

    backend: Backend
    bundle: LoadedBundle
    items: List[Tuple[int, Transfer, Member]]


@dataclass
class UploadGroup:
    """Transfers packed into one new bundle in ``directory``: (position, transfer, size)."""

    directory: Url
    items: List[Tuple[int, Transfer, int]]


def _split(url: Url) -> Tuple[Url, str]:
    directory, name = posixpath.split(url.path)
    return url.with_path(directory), name


class BundleStager:
    """Bundle planning and execution for one engine; caches directory indexes per process."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._settings: Settings = session.settings
        self.enabled = bool(self._settings.bundle or self._settings.bundle_sites)
        self._site_answers: Dict[Optional[str], bool] = {}
        self._directories: Dict[Hashable, BundleDirectory] = {}
        self._lock = threading.Lock()

    def _bundles_for(self, site_label: Optional[str]) -> bool:
        answer = self._site_answers.get(site_label)
        if answer is None:
            answer = self._site_answers[site_label] = self._settings.bundles_for(site_label)
        return answer

    def _directory(self, backend: Backend, directory: Url, map_fn: MapFn = map) -> BundleDirectory:
        key = (id(backend), directory.path)
        with self._lock:
            found = self._directories.get(key)
            if found is None:
                found = self._directories[key] = BundleDirectory.load(backend, directory, map_fn)
            return found

    def _forget(self, backend: Backend, directory: Url) -> None:
        with self._lock:
            self._directories.pop((id(backend), directory.path), None)

    # -- downloads --------------------------------------------------------------------

    def plan_downloads(self, transfers: Indexed, map_fn: MapFn,
                       cached: Callable[[Url], bool] = lambda url: False) -> Tuple[List[DownloadGroup], Indexed]:
        """Group transfers by the bundle holding their source; files the node cache already has
        (``cached``) and files in no bundle are left to the per-file path."""
        groups: Dict[Tuple[int, str], DownloadGroup] = {}
        rest: Indexed = []
        indexes: Dict[Tuple[int, str], BundleDirectory] = {}
        for position, op in transfers:
            source = op.sources[0]
            try:
                found = self._bundled(source, op, indexes, map_fn, cached)
            except TransferError:
                found = None  # the per-file path meets the same error and reports it per file
            if found is None:
                rest.append((position, op))
                continue
            backend, bundle, member = found
            group = groups.setdefault((id(backend), bundle.url.path), DownloadGroup(backend, bundle, []))
            group.items.append((position, op, member))
        return list(groups.values()), rest

    def _bundled(self, source: Url, op: Transfer, indexes: Dict[Tuple[int, str], BundleDirectory],
                 map_fn: MapFn, cached: Callable[[Url], bool]) -> Optional[Tuple[Backend, LoadedBundle, Member]]:
        """The bundle member that serves ``op``, if bundling applies and one does."""
        if not (op.dest.is_local and source.scheme in OBJECT_SCHEMES and self._bundles_for(source.site_label)):
            return None
        if cached(source):
            return None
        backend = self._session.backend(source)
        directory_path, name = posixpath.split(source.path)
        index = indexes.get((id(backend), directory_path))
        if index is None:
            directory = source.with_path(directory_path)
            try:
                index = self._directory(backend, directory, map_fn)
            except TransferError:  # once per directory per batch; files then go the per-file way
                index = BundleDirectory(directory, [])
            indexes[(id(backend), directory_path)] = index
        found = index.lookup(name)
        return None if found is None else (backend, found[0], found[1])

    def fetch_group(self, group: DownloadGroup, write: Callable[[str, bytes], None],
                    keep: Optional[Callable[[Url, bytes], None]] = None) -> Dict[int, int]:
        """Fetch the group's bundle once and write every wanted member; returns bytes per
        position. ``keep(url, bytes)`` also receives every other live member the fetched
        bytes hold (to fill the node cache)."""
        data, offset = fetch_members(group.backend, group.bundle, [m for _, _, m in group.items])
        written: Dict[int, int] = {}
        for position, op, member in group.items:
            blob = member_bytes(group.bundle.index, member, data, offset)
            write(op.dest.path, blob)
            written[position] = len(blob)
            if keep is not None:
                keep(op.sources[0], blob)
        if keep is not None:
            self._keep_others(group, data, offset, {m.name for _, _, m in group.items}, keep)
        return written

    def _keep_others(self, group: DownloadGroup, data: bytes, offset: int, wanted: Set[str],
                     keep: Callable[[Url, bytes], None]) -> None:
        if offset != 0 or len(data) < group.bundle.size:
            return  # only ranges were fetched: the other members' bytes are not here
        directory = _split(_split(group.bundle.url)[0])[0]
        for member in group.bundle.live_members():
            if member.name not in wanted:
                blob = member_bytes(group.bundle.index, member, data, offset)
                keep(directory.with_path(posixpath.join(directory.path, member.name)), blob)

    def find_member(self, source: Url) -> Optional[Tuple[Backend, LoadedBundle, Member]]:
        """The bundle member standing in for a missing plain object, if any."""
        if source.scheme not in OBJECT_SCHEMES:
            return None
        backend = self._session.backend(source)
        directory, name = _split(source)
        found = self._directory(backend, directory).lookup(name)
        return None if found is None else (backend, found[0], found[1])

    # -- uploads ----------------------------------------------------------------------

    def plan_uploads(self, transfers: Indexed) -> Tuple[List[UploadGroup], Indexed]:
        settings = self._settings
        candidates: Dict[Tuple[Hashable, str], List[Tuple[int, Transfer, int]]] = {}
        rest: Indexed = []
        for position, op in transfers:
            try:
                size = self._bundleable_size(op)
                key = (id(self._session.backend(op.dest)), _split(op.dest)[0].path) if size is not None else None
            except TransferError:
                size = key = None  # reported per file by the ordinary path
            if size is None or key is None:
                rest.append((position, op))
                continue
            candidates.setdefault(key, []).append((position, op, size))
        groups: List[UploadGroup] = []
        for items in candidates.values():
            names = [_split(op.dest)[1] for _, op, _ in items]
            if len(items) < settings.bundle_min_files or len(set(names)) != len(names):
                rest.extend((position, op) for position, op, _ in items)
                continue
            groups.extend(self._chunk(items))
        return groups, rest

    def _bundleable_size(self, op: Transfer) -> Optional[int]:
        source = op.sources[0]
        if len(op.sources) != 1 or source.scheme != "file" or op.dest.scheme not in OBJECT_SCHEMES:
            return None
        if not self._bundles_for(op.dest.site_label):
            return None
        try:
            size = os.stat(source.path).st_size
        except OSError:
            return None  # the per-file path reports the error
        return size if size <= self._settings.bundle_max_member_size else None

    def _chunk(self, items: List[Tuple[int, Transfer, int]]) -> List[UploadGroup]:
        directory = _split(items[0][1].dest)[0]
        groups: List[UploadGroup] = []
        current: List[Tuple[int, Transfer, int]] = []
        total = 0
        for item in items:
            if current and total + item[2] > self._settings.bundle_max_size:
                groups.append(UploadGroup(directory, current))
                current, total = [], 0
            current.append(item)
            total += item[2]
        groups.append(UploadGroup(directory, current))
        return groups

    def upload_group(self, group: UploadGroup, upload: Callable[[str, Url], int]) -> Url:
        """Pack the group's files into one bundle and upload it with ``upload(path, url)``."""
        members = [(_split(op.dest)[1], _read(op.sources[0].path)) for _, op, _ in group.items]
        bundle_url = new_bundle_url(group.directory)
        fd, temp = tempfile.mkstemp(prefix="pegasus-cloudio-bundle-", suffix=".pcb")
        try:
            with os.fdopen(fd, "wb") as out:
                pack(members, out)
            upload(temp, bundle_url)
        finally:
            os.unlink(temp)
        self._forget(self._session.backend(bundle_url), group.directory)
        return bundle_url

    # -- removes ----------------------------------------------------------------------

    def remove_members(self, removes: Sequence[Tuple[int, Remove]]) -> Dict[int, TransferError]:
        """Record removal of bundled files; delete bundles left without live members."""
        failures: Dict[int, TransferError] = {}
        by_bundle: Dict[Tuple[int, str], Tuple[Backend, LoadedBundle, List[Tuple[int, str]]]] = {}
        for position, op in removes:
            target = op.target
            if op.recursive or target.scheme not in OBJECT_SCHEMES or not self._bundles_for(target.site_label):
                continue
            try:
                found = self.find_member(target)
            except TransferError as err:
                failures[position] = err
                continue
            if found is not None:
                backend, bundle, member = found
                by_bundle.setdefault((id(backend), bundle.url.path), (backend, bundle, []))[2].append(
                    (position, member.name))
        for backend, bundle, entries in by_bundle.values():
            try:
                self._record_removal(backend, bundle, [name for _, name in entries])
            except TransferError as err:
                failures.update({position: err for position, _ in entries})
        return failures

    def _record_removal(self, backend: Backend, bundle: LoadedBundle, names: List[str]) -> None:
        bundle.removed.update(names)
        directory = _split(_split(bundle.url)[0])[0]
        if not bundle.live_members():
            records = [i.url for i in backend.list(_split(bundle.url)[0])
                       if i.url.path.startswith(bundle.url.path + ".rm-")]
            failures = [e for e in backend.delete(records + [bundle.url]) if e is not None]
            if failures:
                raise failures[0]
        else:
            fd, temp = tempfile.mkstemp(prefix="pegasus-cloudio-rm-")
            try:
                with os.fdopen(fd, "w") as out:
                    json.dump(sorted(names), out)
                backend.put(temp, removal_record_url(bundle))
            finally:
                os.unlink(temp)
        self._forget(backend, directory)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as err:
        raise local_error(err, path, "bundle") from err

