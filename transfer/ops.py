"""What a batch is made of (transfers, mkdirs, removes) and what comes back (results).

Every operation in a batch yields exactly one :class:`Result`, in input order.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional, Tuple, Union

from transfer.errors import TransferError
from transfer.urls import Url


class LinkMode(enum.Enum):
    """How a local source reaches a local destination."""

    COPY = "copy"
    HARDLINK = "hardlink"  # falls back to COPY across filesystems
    SYMLINK = "symlink"


@dataclass(frozen=True)
class Transfer:
    """Copy the first reachable of ``sources`` (highest priority first) to ``dest``.

    ``dest`` with scheme ``symlink`` asks for a symbolic link to a local source (a copy
    when the source is remote). ``verify_source`` reads a little of a local source before
    linking it (CVMFS-style lazy filesystems fail there rather than in the job).
    """

    sources: Tuple[Url, ...]
    dest: Url
    lfn: Optional[str] = None
    link: LinkMode = LinkMode.COPY
    verify_source: bool = True

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("a transfer needs at least one source")


@dataclass(frozen=True)
class Mkdir:
    """Create a directory (local, scp) or the bucket of an object-store URL."""

    target: Url


@dataclass(frozen=True)
class Remove:
    """Remove a file or object; ``recursive`` removes everything under a directory/prefix."""

    target: Url
    recursive: bool = False


Operation = Union[Transfer, Mkdir, Remove]


@dataclass(frozen=True)
class Attempt:
    """One try of one source->destination pair (what Pegasus records as a transfer attempt)."""

    source: Optional[Url]
    dest: Url
    ok: bool
    start: float  # epoch seconds
    seconds: float
    bytes: int = 0
    error: Optional[TransferError] = None


@dataclass(frozen=True)
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
