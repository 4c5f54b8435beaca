"""Reads as a stack of layers (``docs/architecture.md``, "Reads as stacked layers").

Every read the engine makes goes one call down a stack built once per endpoint::

    CacheLayer (transfer.layers.cache)  ->  PeerLayer (transfer.layers.peers)
        ->  BundleLayer (transfer.layers.bundles)  ->  StoreReader (transfer.layers.store)

Each layer implements :class:`Reader` and holds only the layer below it (given at construction,
plain values besides); none imports the engine, the session or a layer above, and nothing is
passed down as a callback: what an upper layer must learn comes back in return values (the
key a read fills when not the object's own: :meth:`Reader.kept_under`; which layer served it
and the version read:
``ObjectInfo.origin`` and ``version``). An absent feature (no node cache, no peers) is simply
an absent layer.

This module is on a one-file job's import path: it holds the protocol only (no ``typing``,
``threading`` or feature modules; see :mod:`transfer.lean`). :mod:`transfer.layers.stack`
builds the stacks.
"""

from __future__ import annotations

from transfer.lean import Protocol, runtime_checkable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Generator, List, Optional, Sequence, Tuple

    from transfer._threads import Cancel
    from transfer.backends.base import ByteRange, ObjectInfo
    from transfer.urls import Url

    Prepared = Generator[List[Url], None, List[Url]]  # what Reader.prepare returns

__all__ = ["Announces", "Reader", "nothing_prepared"]


def nothing_prepared() -> Prepared:
    """The :meth:`Reader.prepare` of a layer that reads nothing ahead: no URL held, none absent."""
    return []
    yield []  # a generator, as every prepare is


@runtime_checkable
class Reader(Protocol):
    """The read contract every layer and the bottom :class:`~transfer.layers.store.StoreReader`
    share. All methods are safe to call from many threads."""

    def kept_under(self, url: Url) -> Optional[str]:
        """The node-cache key a read of ``url`` through this layer fills when that is not the
        object's own cache key: a bundle member's own key, where a loaded index shows one
        (:mod:`transfer.layers.bundles`); None: the object's own. No request, though it may
        wait for a directory's listing under way. A read's ``ObjectInfo`` says whether it
        filled what was asked (``origin`` "bundles" and ``version`` the member's key)."""

    def stat(self, url: Url) -> ObjectInfo:
        """Size and version of one object, as the backend's ``stat``; NotFound if absent."""

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        """The object's bytes (or ``byte_range`` of them) into ``sink``, verified; the
        returned ``ObjectInfo.origin`` names the layer that served them (None: the store)."""

    def fetch_to(self, url: Url, path: str, link: bool = False, mode: int = 0o666) -> int:
        """The object at ``path``, a new name the engine then owns; returns its size.
        ``link``: a layer holding entries may symlink ``path`` to its entry (Pegasus
        ``--symlink``); ``mode``: the new file's permission bits before the umask. Nothing is
        left at ``path`` on error."""

    def locate(self, batch: Sequence[Url]) -> bool:
        """Learn what :meth:`kept_under` needs to answer for ``batch`` at once, before any
        :meth:`prepare` (the bundle layer in use loads the indexes of the batch's directories:
        a head each, no member read); True when some URL of ``batch`` may now be kept under a
        key of its own (a layer above then asks :meth:`kept_under` for each), False when none
        may. Never raises."""

    def prepare(self, batch: Sequence[Url], cancel: Optional[Cancel] = None) -> Prepared:
        """Plan a batch of reads before any is made, and read ahead what can be: a layer
        passes down the part of ``batch`` it leaves to the layers below (the cache its misses;
        the peers what no peer holds, and only members; the bundles in use, nothing: they read
        their members' bundles ahead, and the store reads ahead for a stack where only it reads). A generator: it yields lists of URLs of ``batch`` whose bodies a layer now
        holds, each taken by its next read (the engine reads those as they come, from its own
        thread, before the generator goes on), and returns the URLs the store answered 404 to
        before any body (the pass ended there: the bundle layer looks for members of their
        directories). Never raises; ``cancel`` set, or the generator closed, ends a read-ahead."""

    def take(self, url: Url) -> Optional[Tuple[bytes, ObjectInfo]]:
        """The body a :meth:`prepare` read ahead of ``url``, and its ``ObjectInfo``, handed
        over once (None: none held). No request. The cache layer fills its entry from it."""


@runtime_checkable
class Announces(Protocol):
    """A layer that tells others what the layer above it now holds (the peers)."""

    def announce(self, url: Url, info: ObjectInfo, sha256: str) -> None:
        """The layer above has published its entry for ``url``: the bytes ``info`` (a ``get``
        of this layer's) describes, whose SHA-256 (hex) the entry recorded."""
