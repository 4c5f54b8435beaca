"""The bundle layer: members of bundles in an object's directory, read in place of the object.

A read of a name the directory's index (loaded earlier in this process) shows as a member of
a bundle is served from that bundle; any other read goes below, and a store's NotFound loads
the directory's index (once per directory) and serves the member standing in for the name,
if any; else the NotFound goes up, noting bundles of the directory that could not be listed.
A plain object of the same name wins (the index says so: ``docs/bundles.md``, "Precedence").

A member's entry in the node cache is kept under a key of its own, its bundle's identity plus
its name and SHA-256 (:func:`~transfer.bundles.reading.member_key`), never the plain object's
key: :meth:`BundleLayer.kept_under` tells the cache layer above which key a read will fill
before it starts, and a member read returns that key as its ``ObjectInfo.version`` (a member is
content-addressed: the key names its bytes), with ``origin`` "bundles". So the layer above can
check that what it filled is what it asked for (a 404 met during the fill, or an index loaded
meanwhile, changes the answer: the cache layer then fills again under the returned key).

The bundle code is imported only when the engine's stager exists (bundles were used) or at a
store's NotFound: a read that needs no bundle costs one attribute check here.
"""

from __future__ import annotations

from transfer import _threads
from transfer.backends.base import ObjectInfo, cache_keys
from transfer.errors import NotFound, TransferError
from transfer.layers import nothing_prepared

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, List, Optional, Sequence, Tuple

    from transfer._threads import Cancel
    from transfer.backends.base import Backend, ByteRange
    from transfer.bundles.directory import LoadedBundle
    from transfer.bundles.format import Member
    from transfer.layers import Prepared, Reader
    from transfer.bundles.staging import BundleStager
    from transfer.session import Session
    from transfer.urls import Url

    Found = Tuple[Backend, LoadedBundle, Member]

__all__ = ["ORIGIN", "BundleLayer", "StagerSlot"]

ORIGIN = "bundles"  # ObjectInfo.origin of a member's bytes


class StagerSlot:
    """The one bundle stager of an engine (its directory indexes load once per process), made
    on first use: the bundle code is imported only when bundles are used or a read found
    nothing. Shared by the engine's bundle groups and removes and the stacks' bundle layers."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._lock = _threads.Lock()
        self.made: Optional[BundleStager] = None
        settings = session.settings
        self.enabled = bool(settings.bundle or settings.bundle_sites)  # on for some site in the settings

    def get(self) -> BundleStager:
        if self.made is None:
            from transfer.bundles.staging import BundleStager
            with self._lock:
                if self.made is None:
                    self.made = BundleStager(self._session)
        return self.made


class BundleLayer:
    """:class:`~transfer.layers.Reader` that serves bundle members over ``below``, with the
    engine's one bundle stager (``bundles``, made on first use; its directory indexes load
    once per process). Thread-safe."""

    def __init__(self, below: Reader, bundles: StagerSlot) -> None:
        self._below = below
        self._bundles = bundles

    def kept_under(self, url: Url) -> Optional[str]:
        """A known member's key (its bundle's cache key, name and SHA-256), else below's."""
        found = self._known(url) if self._bundles.made is not None else None  # (a call less: most reads)
        return self._below.kept_under(url) if found is None else self._member_key(found)

    def stat(self, url: Url) -> ObjectInfo:
        try:
            return self._below.stat(url)
        except NotFound as err:
            found = self._resolve(url, err)
            return ObjectInfo(url, found[2].size, self._member_key(found), origin=ORIGIN)

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        """A known member, else below, else (below found nothing) the member standing in."""
        found = self._known(url) if self._bundles.made is not None else None
        if found is not None:
            try:
                return self._member_get(found, url, sink, byte_range)
            except NotFound:  # the bundle vanished (before any byte): ask the store afresh
                self._forget(url)
        try:
            return self._below.get(url, sink, byte_range)
        except NotFound as err:
            found = self._resolve(url, err)
        return self._member_get(found, url, sink, byte_range)

    def fetch_to(self, url: Url, path: str, link: bool = False, mode: int = 0o666) -> int:
        """As :meth:`get`, at ``path``: a member is written there atomically (``link`` and
        ``mode`` mean nothing for a member: no entry here to link to, and members are written
        with the default mode, as before the layers)."""
        found = self._known(url) if self._bundles.made is not None else None
        if found is not None:
            try:
                return self._member_to(found, url, path)
            except NotFound:
                self._forget(url)
        try:
            return self._below.fetch_to(url, path, link, mode)
        except NotFound as err:
            found = self._resolve(url, err)
        return self._member_to(found, url, path)

    def prepare(self, batch: Sequence[Url], cancel: Optional[Cancel] = None) -> Prepared:
        """The store's read-ahead where bundles are not in use (none on in the settings, none
        used yet); else nothing: a read-ahead would GET names that are members (404s), and the
        engine plans the batch's bundle groups (one read per bundle, :mod:`transfer.bundles.groups`).
        A 404 before any body (the store's read-ahead ended there) marks its directory as
        expected to hold members: its index is listed by the first read that asks for one of
        its names (the others of that directory wait for that one listing, no other directory
        does), not here. A 404 among bodies is one missing object: its read lists the index."""
        if self._bundles.made is not None or self._bundles.enabled:
            return nothing_prepared()
        return self._ahead(batch, cancel)

    def _ahead(self, batch: Sequence[Url], cancel: Optional[Cancel]) -> Prepared:
        """The store's read-ahead; the directories of the 404s it ended at marked expected."""
        absent = yield from self._below.prepare(batch, cancel)
        if absent:
            stager = self._bundles.get()
            for url in absent:
                stager.expect(url)
        return absent

    def take(self, url: Url) -> Optional[Tuple[bytes, ObjectInfo]]:
        return self._below.take(url)

    # -- members ------------------------------------------------------------------------

    def _known(self, url: Url) -> Optional[Found]:
        """The member serving ``url`` by an index loaded (or loading) in this process; None
        without bundles used, or for a URL whose backend cannot be made (below reports it)."""
        stager = self._bundles.made
        if stager is None or url.is_local:
            return None
        try:
            return stager.known_member(url)
        except TransferError:
            return None

    def _resolve(self, url: Url, err: NotFound) -> Found:
        """The member standing in for ``url``, which the store does not have; else ``err``,
        noting bundles of the directory that could not be listed."""
        found, note = self._bundles.get().resolve(url)
        if found is None:
            if note:
                err.message += note
            raise err
        return found

    def _forget(self, url: Url) -> None:
        stager = self._bundles.made
        if stager is not None:
            stager.forget(url)

    def _member_key(self, found: Found) -> Optional[str]:
        from transfer.bundles.reading import member_key
        keys = cache_keys(found[0])  # the bundle object's own cache key starts the member's
        return member_key(keys.cache_key(found[1].url), found[2]) if keys is not None else None

    def _member_get(self, found: Found, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange]) -> ObjectInfo:
        from transfer.bundles.reading import read_member
        backend, bundle, member = found
        if byte_range is None:
            read_member(backend, bundle, member, sink)
        else:  # members are small (bundle_max_member_size): read whole, hand on the range
            from io import BytesIO
            whole = BytesIO()
            read_member(backend, bundle, member, whole)
            start, end = byte_range
            sink.write(whole.getbuffer()[start:min(end, member.size)])
        return ObjectInfo(url, member.size, self._member_key(found), origin=ORIGIN)

    def _member_to(self, found: Found, url: Url, path: str) -> int:
        from transfer.bundles.reading import GroupState, MemberRead, read_group
        backend, bundle, member = found
        state = GroupState.empty()
        read_group(backend, bundle, [MemberRead(0, url, path, member)], state)
        if 0 in state.failed:
            raise state.failed[0]
        return state.done[0]
