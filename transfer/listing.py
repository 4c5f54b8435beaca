"""What a namespace holds, as a reader sees it: files, directories, and bundle members as files.

Bundles (:mod:`transfer.bundles.directory`) live under ``D/.cloudio-bundles/``; here that
directory is never shown, and the live members of its bundles are listed as files of ``D``
(a plain object of the same name wins, as it does for reads). Object stores have no empty
directories: a directory is a prefix something is stored under.
"""

from __future__ import annotations

import os
import posixpath

from transfer.backends.base import Backend, Buckets, DirectoryListing, Namespace, ObjectInfo, PagedListing
from transfer.bundles.directory import BUNDLE_DIR, BundleDirectory
from transfer.errors import NotFound
from transfer.lean import field, record
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

__all__ = ["Entry", "Lister", "info", "iter_one_level", "iter_recursive", "kinds", "one_level", "recursive"]

PAGE = 1000  # files per page of iter_recursive (S3's page of keys)

Lister = Backend  # every backend reads; listing needs Namespace too (checked with isinstance)


@record(frozen=True)
class Entry:
    """A file (object, local file, bundle member) or a directory (prefix).

    ``url`` is the full URL (``s3://bucket/dir/f.a``, ``file:///data/f.a``), ``name`` the last
    component, ``size`` bytes (0 for a directory), ``version`` the ETag/generation when known,
    ``mtime`` epoch seconds when known; ``content_type``, ``cache_control`` and ``metadata``
    (user metadata, names lower-case) as the store keeps them, and ``checksum`` the store's
    full-object checksum of the bytes (``crc32:BASE64``, S3's names), where :func:`info` asked
    (S3; listings do not carry them)."""

    url: str
    name: str
    size: int
    is_dir: bool
    version: "str | None" = None
    mtime: "float | None" = None
    content_type: "str | None" = None
    cache_control: "str | None" = None
    metadata: "Dict[str, str] | None" = field(default=None, hash=False)
    checksum: "str | None" = None


def _file(info: ObjectInfo) -> Entry:
    kept = info.attributes
    name = posixpath.basename(info.url.bare_path)  # the URL keeps its query (a SAS), the name never has it
    if kept is None:
        return Entry(info.url.full, name, info.size, False, info.version, info.mtime)
    return Entry(info.url.full, name, info.size, False, info.version, info.mtime,
                 kept.content_type, kept.cache_control, dict(kept.metadata), kept.checksum)


def _directory(url: Url) -> Entry:
    path = url.bare_path.rstrip("/")
    return Entry(url.with_bare_path(path).full, posixpath.basename(path), 0, True)


def _without_slash(url: Url) -> Url:
    return url.with_bare_path(url.bare_path.rstrip("/"))


def one_level(backend: Lister, url: Url) -> List[Entry]:
    """Entries directly under ``url``, by name; ``[file]`` when ``url`` is a file; NotFound
    when it is neither. :func:`iter_one_level`'s pages, a plain entry over a bundle member."""
    entries: Dict[str, Entry] = {}
    for page in iter_one_level(backend, url):
        for entry in page:
            entries.setdefault(entry.name, entry)
    return [entries[name] for name in sorted(entries)]


def _whole_level(backend: Lister, url: Url) -> List[Entry]:
    """:func:`one_level` from one listing of the whole level (stores without pages)."""
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
        for entry in _members(backend, _without_slash(url)):
            entries.setdefault(entry.name, entry)
    if not entries and not _is_local_dir(url):
        only = info(backend, url)
        if only.is_dir:
            return []
        return [only]
    return [entries[name] for name in sorted(entries)]


def recursive(backend: Lister, url: Url) -> List[Entry]:
    """Every file under ``url`` (bundle members included), sorted by URL: :func:`iter_recursive`'s
    pages, a plain object over a bundle member of the same URL."""
    files: Dict[str, Entry] = {}
    for page in iter_recursive(backend, url):
        for entry in page:
            files.setdefault(entry.url, entry)
    return [files[key] for key in sorted(files)]


def iter_recursive(backend: Lister, url: Url, page_size: int = PAGE) -> Iterator[List[Entry]]:
    """Every file under ``url``, lazily, in pages of up to ``page_size`` files in the store's
    order: the store's next page is asked for when the one before it has been taken (S3: one
    ListObjectsV2 per 1,000 keys), so the first page costs one request and memory does not grow
    with the listing. The live members of each bundle directory met come in pages of their own
    after the plain files (which they never shadow); ``[file]`` when ``url`` is a file.
    NotFound (when the first page is taken) for a bucket that does not exist."""
    if not isinstance(backend, Namespace):
        yield [info(backend, url)]
        return
    bundle_dirs: Set[str] = set()
    some = False
    for chunk in _chunks(backend.list(url), page_size):
        page = _plain_files(chunk, bundle_dirs)
        del chunk
        if page:
            some = True
            yield page
        del page  # a page taken and dropped is freed before the store's next one is asked for
    for directory in sorted(bundle_dirs):
        members = _members(backend, url.with_bare_path(directory))
        for at in range(0, len(members), page_size):
            some = True
            yield members[at:at + page_size]
    if not some:
        try:
            only = info(backend, url)
        except NotFound:
            return
        if not only.is_dir:
            yield [only]


def _plain_files(chunk: List[ObjectInfo], bundle_dirs: Set[str]) -> List[Entry]:
    """The files of ``chunk``, without directory markers (S3 consoles' "folders") and bundle
    objects, whose bundle directories are added to ``bundle_dirs``."""
    marker = "/" + BUNDLE_DIR + "/"
    page = []
    for found in chunk:
        path = found.url.bare_path
        if path.endswith("/"):
            continue
        if marker in path:
            bundle_dirs.add(path.split(marker, 1)[0])
            continue
        page.append(_file(found))
    return page


def iter_one_level(backend: Lister, url: Url) -> Iterator[List[Entry]]:
    """:func:`one_level` lazily, a page (by name) per listing request where the store lists in
    pages (:class:`PagedListing`), else one page; live bundle members in a page of their own
    after the plain entries. ``[file]`` when ``url`` is a file; NotFound when it is neither."""
    if not isinstance(backend, PagedListing) or url.is_local:
        entries = _whole_level(backend, url)
        if entries:
            yield entries
        return
    some, bundled = False, False
    try:
        for objects, subs in backend.list_dir_pages(url):
            page = {}
            for sub in subs:
                entry = _directory(sub)
                bundled = bundled or entry.name == BUNDLE_DIR
                if entry.name and entry.name != BUNDLE_DIR:
                    page[entry.name] = entry
            page.update((entry.name, entry) for entry in map(_file, objects) if entry.name)
            if page:
                some = True
                yield [page[name] for name in sorted(page)]
            del objects, subs, page  # none held while the store's next page is asked for
    except NotFound:  # no such bucket: info() below says so
        pass
    members = _members(backend, _without_slash(url)) if bundled else []
    if members:
        yield sorted(members, key=lambda entry: entry.name)
    elif not some:
        only = info(backend, url)
        if not only.is_dir:
            yield [only]


def _chunks(items: Iterable[ObjectInfo], size: int) -> Iterator[List[ObjectInfo]]:
    chunk: List[ObjectInfo] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def info(backend: Lister, url: Url) -> Entry:
    """The file, bundle member or directory at ``url``; NotFound when none is there (a
    bucket that does not exist too: no empty directory, which would make a misspelt bucket
    "no inputs")."""
    if _is_local_dir(url):
        return _directory(url)
    if _is_root(backend, url) and isinstance(backend, Namespace):
        if isinstance(backend, Buckets) and not backend.bucket_exists(url):
            raise NotFound("no such bucket", url=str(url), operation="stat")
        return _directory(url)
    if not url.bare_path.endswith("/"):
        try:
            return _file(backend.stat(url))
        except NotFound:
            pass
    if isinstance(backend, Namespace):
        objects, dirs = _level(backend, url)
        if objects or dirs:
            return _directory(url)
        directory, name = posixpath.split(url.bare_path.rstrip("/"))
        for entry in _members(backend, url.with_bare_path(directory)):
            if entry.name == name:
                return entry
    raise NotFound("no such file or directory", url=str(url), operation="stat")


def kinds(backend: Lister, urls: Sequence[Url]) -> List[Optional[bool]]:
    """What :func:`info` says of each URL: False a file, True a directory, None nothing there.
    Where the store lists in pages (:class:`PagedListing`), URLs of one directory are looked up
    in its listing, from the first one's name to the last one's (1,000 names a request), not
    one request each; a name the listing does not show (a bundle member, or absent) is then
    asked on its own, as is a directory's listing that runs past twice the pages the names need."""
    known: Dict[int, Optional[bool]] = {}
    if isinstance(backend, PagedListing):
        groups: Dict[str, List[int]] = {}
        for i, url in enumerate(urls):
            if not url.bare_path.endswith("/") and not _is_root(backend, url):
                groups.setdefault(url.with_bare_path(posixpath.dirname(url.bare_path) + "/").path, []).append(i)
        for parent, indexes in groups.items():
            if len(indexes) > 1:
                names: Dict[str, List[int]] = {}
                for i in indexes:
                    names.setdefault(posixpath.basename(urls[i].bare_path), []).append(i)
                known.update(_listed_kinds(backend, urls[indexes[0]].with_path(parent), names))
    answers: List[Optional[bool]] = []
    for i, url in enumerate(urls):
        if i not in known:
            try:
                known[i] = info(backend, url).is_dir
            except NotFound:
                known[i] = None
        answers.append(known[i])
    return answers


def _listed_kinds(backend: PagedListing, directory: Url, names: Dict[str, List[int]]) -> Dict[int, Optional[bool]]:
    """Of the URLs whose ``names`` (name -> indexes) are in ``directory``: the kinds its listing
    shows (a file over a directory of the same name, as :func:`info`); all None if the
    bucket does not exist."""
    found: Dict[int, Optional[bool]] = {}
    last, pages = max(names), len(names) // 1000 + 2
    try:
        listed = backend.list_dir_pages(directory, min(names)[:-1])
        for count, (objects, subs) in enumerate(listed, 1):
            seen = [(posixpath.basename(o.url.bare_path), False) for o in objects]
            seen += [(posixpath.basename(d.bare_path.rstrip("/")), True) for d in subs]
            for name, is_dir in seen:
                for i in names.get(name, ()):
                    found.setdefault(i, is_dir)
            if count >= pages or any(name >= last for name, _ in seen):
                break
    except NotFound:  # no such bucket: nothing is there
        return {i: None for indexes in names.values() for i in indexes}
    return found


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
            path = posixpath.join(directory.bare_path.rstrip("/") or "/", member.name)
            seen[member.name] = Entry(directory.with_bare_path(path).full, member.name, member.size, False,
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
    base = url.bare_path.rstrip("/") + "/"
    objects: List[ObjectInfo] = []
    dirs: Dict[str, Url] = {}
    for item in found:
        path = item.url.bare_path
        rest = path[len(base):] if path.startswith(base) else ""
        if "/" in rest:
            first = rest.split("/", 1)[0]
            dirs.setdefault(first, url.with_bare_path(base + first + "/"))
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


def _is_root(backend: Lister, url: Url) -> bool:
    """Whether ``url`` names a bucket (:meth:`Buckets.names_bucket`: its shape is the backend's
    to know) or a store's root rather than something in it."""
    if isinstance(backend, Buckets):
        return backend.names_bucket(url)
    return url.bare_path.strip("/") == ""
