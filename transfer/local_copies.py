"""A transfer between two local paths, as the engine runs it (``file://``, ``symlink://``,
``moveto://`` destinations; Pegasus ``--symlink`` and hard-link modes).

:func:`local_copy` moves, links or copies ``source`` to the transfer's destination and returns
the bytes it counts (0 for a link): a ``moveto://`` destination is a rename (or copy and
remove across filesystems); a ``symlink://`` destination whose source need not be checked may
dangle (its source may be seen elsewhere, in a container); every other case needs a readable
source, as stock pegasus-transfer does. A file is never linked or copied onto itself. A copy is
made by the caller's ``copy(dest_path, mode)`` (the engine's atomic download path) with the
source's permission bits, which the umask then reduces, as ``cp`` gives them.
"""

from __future__ import annotations

from transfer.atomic import atomic_hardlink, atomic_symlink
from transfer.ops import LinkMode, Transfer
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable


def local_copy(source: Url, op: Transfer, copy: Callable[[str, int], int]) -> int:
    """``source`` to ``op.dest`` (both local); see the module docstring."""
    from transfer.backends import local
    dest = op.dest.path
    if op.dest.scheme == "moveto":
        return local.move(source.path, dest)
    symlink = op.dest.scheme == "symlink" or op.link is LinkMode.SYMLINK
    if op.dest.scheme == "symlink" and not op.verify_source:
        if not local.same_file(source.path, dest):
            atomic_symlink(source.path, dest)
        return 0
    status = local.verify_readable(source.path)
    if local.same_file(source.path, dest):
        return status.st_size
    if symlink:
        atomic_symlink(source.path, dest)
        return 0
    if op.link is LinkMode.HARDLINK and atomic_hardlink(source.path, dest):
        return status.st_size
    return copy(dest, status.st_mode & 0o777)
