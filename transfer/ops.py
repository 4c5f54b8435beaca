"""What a batch is made of (transfers, mkdirs, removes) and what comes back (results).

Every operation in a batch yields exactly one :class:`Result`, in input order.
"""

from __future__ import annotations

import posixpath

from transfer.lean import field, record
from transfer.urls import Url, parse_url

TYPE_CHECKING = False
if TYPE_CHECKING:
    import enum
    from typing import Optional, Tuple, Union

    from transfer.errors import TransferError

    class LinkMode(enum.Enum):
        """How a local source reaches a local destination."""

        COPY = "copy"
        HARDLINK = "hardlink"  # falls back to COPY across filesystems
        SYMLINK = "symlink"
else:
    class LinkMode:
        """How a local source reaches a local destination: ``COPY``, ``HARDLINK`` (falls back
        to a copy across filesystems) or ``SYMLINK``. Type checkers see the ``enum.Enum`` above;
        at run time the members are plain singletons (``enum`` costs a job step ~2 ms)."""

        __slots__ = ("name", "value")

        def __init__(self, name, value):
            self.name, self.value = name, value

        def __repr__(self):
            return f"<LinkMode.{self.name}: {self.value!r}>"

        def __reduce__(self):
            return getattr, (LinkMode, self.name)

    LinkMode.COPY = LinkMode("COPY", "copy")
    LinkMode.HARDLINK = LinkMode("HARDLINK", "hardlink")
    LinkMode.SYMLINK = LinkMode("SYMLINK", "symlink")


@record(frozen=True)
class Transfer:
    """Copy the first reachable of ``sources`` (highest priority first) to ``dest``.

    ``dest`` with scheme ``symlink`` asks for a symbolic link to a local source (a copy
    when the source is remote). ``verify_source`` reads a little of a local source before
    linking it (CVMFS-style lazy filesystems fail there rather than in the job).

    ``sources`` may also be given as one :class:`Url` or ``str`` and ``dest`` as a ``str``
    (parsed with :func:`~transfer.urls.parse_url`, no variable expansion); anything else is a
    TypeError here, at construction. A remote ``dest`` whose path ends in ``/`` is a
    directory: the first source's base name is appended (``s3://b/dir/`` -> ``s3://b/dir/f.a``).
    """

    sources: Tuple[Url, ...]
    dest: Url
    lfn: Optional[str] = None
    link: LinkMode = LinkMode.COPY
    verify_source: bool = True

    def __post_init__(self) -> None:
        sources = self.sources
        if isinstance(sources, (Url, str)):
            sources = (sources,)
        if not isinstance(sources, (tuple, list)):
            raise TypeError(f"Transfer sources must be a tuple of Url, not {type(sources).__name__}")
        sources = tuple([_url(source, "Transfer source") for source in sources])
        if not sources:
            raise ValueError("a transfer needs at least one source")
        dest = _url(self.dest, "Transfer dest")
        if not dest.is_local and dest.path.endswith("/") and sources[0].path.rstrip("/"):
            dest = dest.with_path(dest.path + posixpath.basename(sources[0].path.rstrip("/")))
        object.__setattr__(self, "sources", sources)
        object.__setattr__(self, "dest", dest)


def _url(value: object, role: str) -> Url:
    """``value`` as a Url; ``role`` (``"Transfer dest"``) names the argument in the TypeError."""
    if isinstance(value, Url):
        return value
    if isinstance(value, str):
        return parse_url(value)
    raise TypeError(f"{role} must be a Url or str, not {type(value).__name__}")


@record(frozen=True)
class Mkdir:
    """Create a directory (local, scp) or the bucket of an object-store URL."""

    target: Url

    def __post_init__(self) -> None:
        object.__setattr__(self, "target", _url(self.target, f"{type(self).__name__} target"))


@record(frozen=True)
class Remove:
    """Remove a file or object; ``recursive`` removes everything under a directory/prefix.

    A non-recursive remove of a target ending in ``/`` fails (InvalidInput) instead of
    succeeding without deleting anything."""

    target: Url
    recursive: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "target", _url(self.target, f"{type(self).__name__} target"))


if TYPE_CHECKING:
    Operation = Union[Transfer, Mkdir, Remove]
else:
    Operation = object  # for type checkers, the Union above (typing is not imported at run time)


@record(frozen=True)
class Attempt:
    """One try of one source->destination pair (what Pegasus records as a transfer attempt)."""

    source: Optional[Url]
    dest: Url
    ok: bool
    start: float  # epoch seconds
    seconds: float
    bytes: int = 0
    error: Optional[TransferError] = None


@record(frozen=True)
class Result:
    """Outcome of one operation. ``bytes`` and ``source`` describe the successful attempt."""

    op: Operation
    ok: bool
    bytes: int = 0
    seconds: float = 0.0
    attempts: int = 0
    error: Optional[TransferError] = None
    source: Optional[Url] = None
    history: Tuple[Attempt, ...] = field(default=(), repr=False)


if TYPE_CHECKING:
    from typing import Callable, List

    # One try of an operation, as the engine's retry loop runs it: given the attempts so far,
    # it returns the bytes moved and the source used (None where nothing was read).
    Action = Callable[[List[Attempt]], Tuple[int, Optional[Url]]]
