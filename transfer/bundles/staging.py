"""Bundling as the engine uses it: which transfers go through bundles, and how.

* Downloads: for object-store sources on sites with bundling on, the source's directory index
  is read once per directory per process (one listing shows plain objects and bundles) when a
  batch reads at least :data:`LIST_MIN_FILES` files of that directory or the index is loaded
  already; transfers whose file is a bundle member, and not also a plain object, are grouped
  per bundle and each bundle is fetched once (whole, or in coalesced ranges). A file that is not
  in any bundle is an ordinary GET, so plain objects and members mix freely. A plain GET that
  answers 404 also looks in the directory's bundles, whatever the settings; once a
  directory's index is loaded, later reads of its members skip the 404. Indexes load once
  per directory, concurrently across directories, with no lock held over the network.
* Uploads: small files going to one directory in one batch, at least ``bundle_min_files`` of
  them, are packed into bundles of at most ``bundle_max_size`` bytes and uploaded instead.
* Removes: removing a bundled file writes a removal record; a bundle whose last member is
  removed is deleted together with its records.
"""

from __future__ import annotations

import os
import posixpath

from transfer import _threads
from transfer._workers import Task
from transfer.lean import record
from transfer.lean_json import dumps

from transfer.atomic import local_error, scratch_file
from transfer.backends.base import Backend, store
from transfer.bundle_gate import LIST_MIN_FILES
from transfer.schemes import OBJECT_STORES as OBJECT_SCHEMES
from transfer.bundles.directory import BundleDirectory, LoadedBundle, MapFn, new_bundle_url, removal_record_url
from transfer.bundles.format import Member, pack
from transfer.config import Settings
from transfer.errors import TransferError
from transfer.ops import Remove, Transfer
from transfer.session import Session
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    Indexed = List[Tuple[int, Transfer]]
    Found = Tuple[Backend, LoadedBundle, Member]
else:
    Indexed = Found = object  # the alias above is for type checkers; typing is not imported at run time


@record
class UploadGroup:
    """Transfers packed into one new bundle in ``directory``: (position, transfer, size)."""

    directory: Url
    items: List[Tuple[int, Transfer, int]]


def _directory_key(url: Url) -> Tuple[str, str, str]:
    return url.scheme, url.host, _split(url)[0].path


def _at(backend: Backend, host: str, path: str) -> Tuple[int, str, str]:
    """The key of a directory or bundle in the stager's tables: its backend, the URL's host and
    path. The host counts: one backend may serve every bucket of an endpoint (plain
    ``s3://BUCKET/KEY`` and ``gs://BUCKET/KEY`` URLs, whose bucket is the host), where the same
    path in two buckets is two directories."""
    return id(backend), host, path


def _split(url: Url) -> Tuple[Url, str]:
    """(directory, name) of ``url``: the name without the URL's query, which the directory's URL
    keeps (an Azure SAS reaches the directory's listing and bundles, and is no part of a name)."""
    directory, name = posixpath.split(url.bare_path)
    return url.with_bare_path(directory), name


class BundleStager:
    """Bundle planning and execution for one engine; caches directory indexes per process."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._settings: Settings = session.settings
        self.enabled = bool(self._settings.bundle or self._settings.bundle_sites)
        self._site_answers: Dict[Optional[str], bool] = {}
        self._directories: Dict[Hashable, Task] = {}
        self._deferred: Dict[Hashable, Callable[[], None]] = {}  # index loads the first asker runs
        self._lock = _threads.Lock()

    def _bundles_for(self, site_label: Optional[str]) -> bool:
        answer = self._site_answers.get(site_label)
        if answer is None:
            answer = self._site_answers[site_label] = self._settings.bundles_for(site_label)
        return answer

    def _directory(self, backend: Backend, directory: Url, map_fn: MapFn = map, wanted: int = 0) -> BundleDirectory:
        """The directory's index, loaded once: concurrent callers wait for the one loader (the
        first says how many of its files it wants: :meth:`BundleDirectory.load`)."""
        future, load = self._index_load(backend, directory, map_fn, wanted)
        if load is not None:
            load()
        result: BundleDirectory = future.result()
        return result

    def _index_load(self, backend: Backend, directory: Url, map_fn: MapFn, wanted: int = 0,
                    defer: bool = False) -> Tuple[Task, Optional[Callable[[], None]]]:
        """The directory's index load, and the call that runs it when this caller is the first
        (None: another caller runs it; ``defer``: the first caller to ask after this one, see
        :meth:`expect`). A failed load is forgotten: its waiters get its error, later callers
        try again."""
        key = _at(backend, directory.host, directory.path)
        with self._lock:
            future = self._directories.get(key)
            if future is not None:
                return future, self._deferred.pop(key, None)
            created = self._directories[key] = Task(BundleDirectory.load, (backend, directory, map_fn),
                                                       {"connections": self._settings.threads + 2,
                                                        "wanted": wanted})
            load = self._loader(key, created)
            if defer:
                self._deferred[key] = load
                return created, None
        return created, load

    def _loader(self, key: Tuple[int, str, str], created: Task) -> Callable[[], None]:
        def load() -> None:
            created.run()
            if created.exception() is not None:
                with self._lock:
                    if self._directories.get(key) is created:
                        self._directories.pop(key, None)

        return load

    def expect(self, source: Url) -> None:
        """A read ahead found no ``source``: a member of its directory may stand in. The
        directory's index is to be listed by the first read that asks about the directory
        (:meth:`known_member`, :meth:`resolve`), on that reader's thread, once; the other
        reads of the directory wait for it, no other directory's do. No I/O here."""
        located = self._locate_quietly(source)
        if located is not None:
            self._index_load(located[0], located[1], map, defer=True)

    def _forget(self, backend: Backend, directory: Url) -> None:
        with self._lock:
            self._directories.pop(_at(backend, directory.host, directory.path), None)
            self._deferred.pop(_at(backend, directory.host, directory.path), None)

    def forget(self, source: Url) -> None:
        """Drop the cached index of ``source``'s directory (a bundle vanished)."""
        located = self._locate(source)
        if located is not None:
            self._forget(located[0], located[1])

    # -- downloads --------------------------------------------------------------------

    def plan_reads(self, urls: Sequence[Url], map_fn: MapFn) -> List[Tuple[Url, Found]]:
        """The members serving ``urls``, loading the indexes of their directories (once per
        directory per process, their heads through ``map_fn``): of an object store with bundles
        on for its site, of a directory the batch reads at least :data:`LIST_MIN_FILES` names of
        or whose index is loaded already. A URL in no bundle, or whose directory cannot be
        listed, is left out (the per-file path reads it, and reports any error)."""
        eligible = [url for url in urls if url.scheme in OBJECT_SCHEMES and self._bundles_for(url.site_label)]
        wanted: Dict[Tuple[str, str, str], int] = {}
        for url in eligible:
            key = _directory_key(url)
            wanted[key] = wanted.get(key, 0) + 1
        indexes: Dict[Tuple[int, str, str], BundleDirectory] = {}
        found: List[Tuple[Url, Found]] = []
        for url in eligible:
            count = wanted[_directory_key(url)]
            if count < LIST_MIN_FILES and not self._loaded(url):
                continue
            try:
                member = self._bundled(url, indexes, map_fn, count)
            except TransferError:
                continue  # the per-file path meets the same error and reports it per file
            if member is not None:
                found.append((url, member))
        return found

    def _loaded(self, source: Url) -> bool:
        """The index of ``source``'s directory is loaded in this process (no I/O)."""
        located = self._locate_quietly(source)
        if located is None:
            return False
        with self._lock:
            future = self._directories.get(_at(located[0], located[1].host, located[1].path))
        return future is not None and future.done() and future.exception() is None

    def _bundled(self, source: Url, indexes: Dict[Tuple[int, str, str], BundleDirectory],
                 map_fn: MapFn, wanted: int = 0) -> Optional[Tuple[Backend, LoadedBundle, Member]]:
        """The bundle member that serves ``source``, if one does (its directory's index loaded
        once, for ``wanted`` files of it)."""
        backend = self._session.backend(source)
        directory, name = _split(source)
        key = _at(backend, source.host, directory.path)
        index = indexes.get(key)
        if index is None:
            try:
                index = self._directory(backend, directory, map_fn, wanted)
            except TransferError:  # once per directory per batch; files then go the per-file way
                index = BundleDirectory(directory, [])
            indexes[key] = index
        found = index.lookup(name)
        return None if found is None else (backend, found[0], found[1])

    def _locate(self, source: Url) -> Optional[Tuple[Backend, Url, str]]:
        """(backend, directory, name) of an object-store URL that may be a bundle member."""
        if source.scheme not in OBJECT_SCHEMES:
            return None
        directory, name = _split(source)
        return self._session.backend(source), directory, name

    def _locate_quietly(self, source: Url) -> Optional[Tuple[Backend, Url, str]]:
        """:meth:`_locate`, None also for a URL without a usable backend (the per-file path
        meets the same error and reports it per file)."""
        try:
            return self._locate(source)
        except TransferError:
            return None

    def known_member(self, source: Url, resident: bool = True) -> Optional[Tuple[Backend, LoadedBundle, Member]]:
        """The member serving ``source`` if its directory's index is loaded or being loaded
        (then this waits for that one listing, as :meth:`resolve` would) or expected (then
        this lists it, :meth:`expect`); else no I/O but, with ``resident``, the one whole-bundle
        fetch :meth:`BundleDirectory.resident` makes for a directory."""
        located = self._locate(source)
        if located is None:
            return None
        backend, directory, name = located
        key = _at(backend, directory.host, directory.path)
        with self._lock:
            future = self._directories.get(key)
            load = self._deferred.pop(key, None)
        if load is not None:
            load()
        if future is None or future.exception() is not None:
            return None
        index = future.result()
        found = index.lookup(name)
        if found is None:
            return None
        return backend, index.resident(backend, found[0]) if resident else found[0], found[1]

    def resolve(self, source: Url) -> Tuple[Optional[Tuple[Backend, LoadedBundle, Member]], str]:
        """For a plain read that found nothing: the member standing in for it, if any, else a
        note for the NotFound error (bundles of the directory that could not be read)."""
        located = self._locate(source)
        if located is None:
            return None, ""
        backend, directory, name = located
        try:
            index = self._directory(backend, directory)
        except TransferError as err:
            return None, f" (the bundles of its directory could not be listed: {err})"
        found = index.lookup(name)
        if found is None:
            return None, index.why_missing()
        return (backend, index.resident(backend, found[0]), found[1]), ""

    def find_member(self, source: Url) -> Optional[Tuple[Backend, LoadedBundle, Member]]:
        """The bundle member holding ``source`` (removes); raises when the index cannot load."""
        located = self._locate(source)
        if located is None:
            return None
        backend, directory, name = located
        found = self._directory(backend, directory).lookup(name)
        return None if found is None else (backend, found[0], found[1])

    # -- uploads ----------------------------------------------------------------------

    def plan_uploads(self, transfers: Indexed) -> Tuple[List[UploadGroup], Indexed]:
        settings = self._settings
        candidates: Dict[Tuple[int, str, str], List[Tuple[int, Transfer, int]]] = {}
        rest: Indexed = []
        for position, op in transfers:
            try:
                size = self._bundleable_size(op)
                key = _at(self._session.backend(op.dest), op.dest.host,
                          _split(op.dest)[0].path) if size is not None else None
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
        fd, temp = scratch_file("pegasus-cloudio-bundle-", ".pcb")
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
        by_bundle: Dict[Tuple[int, str, str], Tuple[Backend, LoadedBundle, List[Tuple[int, str]]]] = {}
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
                by_bundle.setdefault(_at(backend, bundle.url.host, bundle.url.path), (backend, bundle, []))[2].append(
                    (position, member.name))
        for backend, bundle, entries in by_bundle.values():
            try:
                self._record_removal(backend, bundle, [name for _, name in entries])
            except TransferError as err:
                failures.update({position: err for position, _ in entries})
        return failures

    def _record_removal(self, found: Backend, bundle: LoadedBundle, names: List[str]) -> None:
        backend = store(found, bundle.url, "remove")  # bundles are only found in listed stores
        bundle.removed.update(names)
        directory = _split(_split(bundle.url)[0])[0]
        if not bundle.live_members():
            records = [i.url for i in backend.list(_split(bundle.url)[0])
                       if i.url.bare_path.startswith(bundle.url.bare_path + ".rm-")]
            failures = [e for e in backend.delete(records + [bundle.url]) if e is not None]
            if failures:
                raise failures[0]
        else:
            fd, temp = scratch_file("pegasus-cloudio-rm-")
            try:
                with os.fdopen(fd, "w") as out:
                    out.write(dumps(sorted(names)))
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

