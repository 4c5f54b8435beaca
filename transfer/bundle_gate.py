"""Whether a batch could use bundles at all, decided without importing them.

Bundles serve a batch only where it reads at least :data:`LIST_MIN_FILES` files of one
object-store directory (or the directory's index is loaded already: the caller's to know), or
writes at least ``bundle_min_files`` local files to one (:mod:`transfer.bundles.staging`). A
job step that stages one file, a producer's header from the node cache say, meets neither and
does not import the bundle machinery (about 5 ms of CPU per step); a read of a member that then
finds nothing still reaches its bundle through the per-file path.
"""

from __future__ import annotations

import posixpath

from transfer import schemes
from transfer.ops import Transfer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterable, Tuple

    from transfer.urls import Url

OBJECT_SCHEMES = schemes.OBJECT_STORES
# A batch reading fewer files than this from one directory reads them as plain objects: a
# LIST and the heads of the directory's bundles cost more than the 404 that sends a member to
# its bundle (at most one per thread, in parallel; the index then loads as it would have).
LIST_MIN_FILES = 4


def may_use_bundles(transfers: Iterable[Transfer], bundle_min_files: int) -> bool:
    """True when some object-store directory has enough of ``transfers`` -- downloads from it to
    local files, or uploads of single local files to it -- for bundles to be planned."""
    least = max(1, min(LIST_MIN_FILES, bundle_min_files))
    counts: Dict[Tuple[str, str, str], int] = {}
    for op in transfers:
        source = op.sources[0]
        if op.dest.is_local and source.scheme in OBJECT_SCHEMES:
            url = source
        elif len(op.sources) == 1 and source.scheme == "file" and op.dest.scheme in OBJECT_SCHEMES:
            url = op.dest
        else:
            continue
        key = (url.scheme, url.host, posixpath.dirname(url.bare_path))
        counts[key] = count = counts.get(key, 0) + 1
        if count >= least:
            return True
    return False


def may_read_bundles(urls: Iterable[Url]) -> bool:
    """True when some object-store directory holds at least :data:`LIST_MIN_FILES` of ``urls``
    (a read stack's batch): enough for its index to be listed and its members planned."""
    counts: Dict[Tuple[str, str, str], int] = {}
    for url in urls:
        if url.scheme in OBJECT_SCHEMES:
            key = (url.scheme, url.host, posixpath.dirname(url.bare_path))
            counts[key] = count = counts.get(key, 0) + 1
            if count >= LIST_MIN_FILES:
                return True
    return False
