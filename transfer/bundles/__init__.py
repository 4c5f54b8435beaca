"""Bundles: many small files staged as one object (format: :mod:`transfer.bundles.format`).

The engine bundles and unbundles transparently when ``PEGASUS_CLOUDIO_BUNDLE=1`` (or the
destination site is in ``PEGASUS_CLOUDIO_BUNDLE_SITES``). A custom workflow engine can also
use bundles directly::

    from transfer.bundles import pack_files, unbundle
    pack_files([("a.dat", "/job/a.dat"), ("b.dat", "/job/b.dat")], "/tmp/out.pcb")
    unbundle("/tmp/out.pcb", "/next-job", names=["a.dat"])

:func:`unbundle` writes only the names asked for, only inside the target directory (no
absolute names, no ``..``, no writing through symlinked directories), each verified by its
SHA-256 and written atomically.
"""

from __future__ import annotations

import os

from transfer.atomic import AtomicFile, local_error
from transfer.bundles.directory import BUNDLE_DIR
from transfer.bundles.format import (
    BundleFormatError,
    BundleIndex,
    Member,
    check_name,
    index_length,
    member_bytes,
    pack,
    parse_index,
)
from transfer.errors import InvalidInput, NotFound

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, List, Optional, Sequence, Tuple

__all__ = ["BUNDLE_DIR", "BundleFormatError", "BundleIndex", "Member", "pack_files", "read_index", "unbundle"]


def pack_files(files: Sequence[Tuple[str, str]], out_path: str) -> BundleIndex:
    """Write a bundle of ``(member name, local path)`` pairs to ``out_path`` (atomically)."""
    members = []
    for name, path in files:
        try:
            with open(path, "rb") as fh:
                members.append((name, fh.read()))
        except OSError as err:
            raise local_error(err, path, "bundle") from err
    with AtomicFile(out_path) as out:
        index = pack(members, out.file)
        out.commit()
    return index


def read_index(path: str) -> BundleIndex:
    """The validated index of a bundle file."""
    with open(path, "rb") as fh:
        head = fh.read(16)
        head += fh.read(index_length(head) - len(head))
        return parse_index(head, os.fstat(fh.fileno()).st_size)


def unbundle(bundle_path: str, target_dir: str, names: Optional[Iterable[str]] = None) -> List[str]:
    """Extract ``names`` (default: every member) into ``target_dir``; returns the paths written."""
    with open(bundle_path, "rb") as fh:
        data = fh.read()
    index = parse_index(data, len(data))
    members = index.by_name()
    wanted = list(members) if names is None else [check_name(n) for n in names]
    missing = [n for n in wanted if n not in members]
    if missing:
        raise NotFound(f"not in bundle: {', '.join(missing[:5])}", url=bundle_path, operation="unbundle")
    os.makedirs(target_dir, exist_ok=True)
    root = os.path.realpath(target_dir)
    written = []
    for name in wanted:
        dest = _safe_destination(root, name)
        with AtomicFile(dest) as out:
            blob = member_bytes(index, members[name], data)
            out.file.write(blob)
            out.commit(len(blob))
        written.append(dest)
    return written


def _safe_destination(root: str, name: str) -> str:
    """``root/name``, creating real directories on the way and never following a symlink."""
    current = root
    parts = check_name(name).split("/")
    for part in parts[:-1]:
        current = os.path.join(current, part)
        if os.path.islink(current):
            raise InvalidInput(f"member {name!r} would be written through a symbolic link", url=current,
                               operation="unbundle")
        if not os.path.isdir(current):
            try:
                os.mkdir(current)
            except OSError as err:
                raise local_error(err, current, "unbundle") from err
    dest = os.path.join(current, parts[-1])
    if os.path.islink(dest):
        raise InvalidInput(f"member {name!r} would replace a symbolic link", url=dest, operation="unbundle")
    return dest
