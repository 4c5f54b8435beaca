"""What a namespace holds, as a reader sees it: files, directories, and bundle members as files.

Bundles (:mod:`transfer.bundles.directory`) live under ``D/.cloudio-bundles/``; here that
directory is never shown, and the live members of its bundles are listed as files of ``D``
(a plain object of the same name wins, as it does for reads). Object stores have no empty
directories: a directory is a prefix something is stored under.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Dict, Iterable, List, Set, Tuple

from transfer.backends.base import Backend, DirectoryListing, Namespace, ObjectInfo
from transfer.bundles.directory import BUNDLE_DIR, BundleDirectory
from transfer import schemes
from transfer.errors import NotFound
from transfer.urls import Url

__all__ = ["Entry", "Lister", "info", "one_level", "recursive"]

Lister = Backend  # every backend reads; listing needs Namespace too (checked with isinstance)


@dataclass(frozen=True)
class Entry:
    """A file (object, local file, bundle member) or a directory (prefix).

    ``url`` is the full URL (``s3://bucket/dir/f.a``, ``file:///data/f.a``), ``name`` the last
    component, ``size`` bytes (0 for a directory), ``version`` the ETag/generation when known,
    ``mtime`` epoch seconds when known."""

    url: str
    name: str
    size: int
    is_dir: bool
    version: "str | None" = None
    mtime: "float | None" = None


def _file(info: ObjectInfo) -> Entry:
    return Entry(info.url.full, posixpath.basename(info.url.path), info.size, False, info.version, info.mtime)


def _directory(url: Url) -> Entry:
    path = url.path.rstrip("/")
    return Entry(url.with_path(path).full, posixpath.basename(path), 0, True)


def one_level(backend: Lister, url: Url) -> List[Entry]:
    """Entries directly under ``url``, by name; ``[file]`` when ``url`` is a file; NotFound
    when it is neither."""
    objects, dirs = _level(backend, url)
    entries: Dict[str, Entry] = {}
    bundled = False
    for sub in dirs:
        entry = _directory(sub)
        if entry.name == BUNDLE_DIR:
            bundled = True
        elif entry.name:
            entries[entry.name] = entry
    for found in objects:
        entry = _file(found)
        if entry.name:
            entries[entry.name] = entry
    if bundled:
        for entry in _members(backend, url.with_path(url.path.rstrip("/"))):
            entries.setdefault(entry.name, entry)
    if not entries and not _is_local_dir(url):
        only = info(backend, url)
        if only.is_dir:
            return []
        return [only]
    return [entries[name] for name in sorted(entries)]


def recursive(backend: Lister, url: Url) -> List[Entry]:
    """Every file under ``url`` (bundle members included), sorted by URL."""
    if not isinstance(backend, Namespace):
        return [info(backend, url)]
    files: Dict[str, Entry] = {}
    bundle_dirs: Set[str] = set()
    marker = "/" + BUNDLE_DIR + "/"
    for found in backend.list(url):
        path = found.url.path
        if path.endswith("/"):  # a directory marker (S3 consoles' "folder"), never a file
            continue
        if marker in path:
            bundle_dirs.add(path.split(marker, 1)[0])
            continue
        entry = _file(found)
        files[entry.url] = entry
    for directory in sorted(bundle_dirs):
        for entry in _members(backend, url.with_path(directory)):
            files.setdefault(entry.url, entry)
    if not files:
        try:
            only = info(backend, url)
        except NotFound:
            return []
        return [] if only.is_dir else [only]
    return [files[key] for key in sorted(files)]


def info(backend: Lister, url: Url) -> Entry:
    """The file, bundle member or directory at ``url``; NotFound when none is there."""
    if _is_local_dir(url) or (_is_root(url) and isinstance(backend, Namespace)):
        return _directory(url)
    if not url.path.endswith("/"):
        try:
            return _file(backend.stat(url))
        except NotFound:
            pass
    if isinstance(backend, Namespace):
        objects, dirs = _level(backend, url)
        if objects or dirs:
            return _directory(url)
        directory, name = posixpath.split(url.path.rstrip("/"))
        for entry in _members(backend, url.with_path(directory)):
            if entry.name == name:
                return entry
    raise NotFound("no such file or directory", url=str(url), operation="stat")


def _members(backend: Lister, directory: Url) -> List[Entry]:
    """The live bundle members of ``directory`` not shadowed by a plain object, as files."""
    if not isinstance(backend, Namespace):
        return []
    loaded = BundleDirectory.load(backend, directory)
    seen: Dict[str, Entry] = {}
    for bundle in loaded.bundles:  # oldest first: later bundles win
        for member in bundle.live_members():
            if member.name in loaded.plain:
                continue
            path = posixpath.join(directory.path.rstrip("/") or "/", member.name)
            seen[member.name] = Entry(directory.with_path(path).full, member.name, member.size, False,
                                      member.sha256)
    return list(seen.values())


def _level(backend: Lister, url: Url) -> Tuple[List[ObjectInfo], List[Url]]:
    if isinstance(backend, DirectoryListing):
        try:
            return backend.list_dir(url)
        except NotFound:
            return [], []
    if url.is_local:
        return _local_level(url)
    if not isinstance(backend, Namespace):
        return [], []
    return _split_levels(backend.list(url), url)


def _split_levels(found: Iterable[ObjectInfo], url: Url) -> Tuple[List[ObjectInfo], List[Url]]:
    base = url.path.rstrip("/") + "/"
    objects: List[ObjectInfo] = []
    dirs: Dict[str, Url] = {}
    for item in found:
        rest = item.url.path[len(base):] if item.url.path.startswith(base) else ""
        if "/" in rest:
            first = rest.split("/", 1)[0]
            dirs.setdefault(first, url.with_path(base + first + "/"))
        elif rest:
            objects.append(item)
    return objects, list(dirs.values())


def _local_level(url: Url) -> Tuple[List[ObjectInfo], List[Url]]:
    objects: List[ObjectInfo] = []
    dirs: List[Url] = []
    try:
        with os.scandir(url.path) as scan:
            for item in scan:
                child = url.with_path(os.path.join(url.path, item.name))
                if item.is_dir():
                    dirs.append(child.with_path(child.path + "/"))
                else:
                    st = item.stat()
                    objects.append(ObjectInfo(child, st.st_size, None, st.st_mtime))
    except (FileNotFoundError, NotADirectoryError):
        pass
    return objects, dirs


def _is_local_dir(url: Url) -> bool:
    return url.is_local and os.path.isdir(url.path)


def _is_root(url: Url) -> bool:
    """A bucket (or store root): always a directory."""
    if url.scheme in schemes.S3:
        from transfer.backends._s3_wire import split_url

        return split_url(url).key.strip("/") == ""
    return url.path.strip("/") == ""
