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

Where bundles may serve a batch, :meth:`BundleLayer.locate` loads the indexes of its
directories and :meth:`BundleLayer.prepare` reads each bundle holding members of it once,
holding the members' verified bodies for their reads (``docs/architecture.md``, "Reads as
stacked layers"). The bundle code is imported only when the engine's stager exists (bundles
were used), when bundles are on and a batch reads enough of one directory, or at a store's
NotFound: a read that needs no bundle costs two attribute checks here.
"""

from __future__ import annotations

import os
import time

from transfer import _threads
from transfer.atomic import atomic_write_bytes
from transfer.backends.base import ObjectInfo, cache_keys
from transfer.errors import NotFound, Throttled, TransferError
from transfer.layers import nothing_prepared
from transfer.layers.store import HeldBodies

TYPE_CHECKING = False
if TYPE_CHECKING:
    from concurrent.futures import Executor
    from typing import BinaryIO, Dict, List, Optional, Sequence, Tuple

    from transfer._threads import Cancel
    from transfer.backends.base import Backend, ByteRange
    from transfer.bundles.directory import LoadedBundle
    from transfer.bundles.format import Member
    from transfer.layers import Prepared, Reader
    from transfer.pacing import Pacer
    from transfer.bundles.staging import BundleStager
    from transfer.session import Session
    from transfer.urls import Url

    Found = Tuple[Backend, LoadedBundle, Member]
    Group = Tuple[Backend, LoadedBundle, List[Tuple[Url, Member]]]

__all__ = ["ORIGIN", "BundleLayer", "StagerSlot"]

ORIGIN = "bundles"  # ObjectInfo.origin of a member's bytes
_THROTTLED_TRIES = 3  # requests a bundle's read makes at most while the store throttles them
_UNPLANNED = object()  # a URL the bundle layer did not locate before its prepare
_PLANNED_KEPT = 1 << 16  # located URLs kept for the prepares after, at most (a long-lived engine: the node stager)


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
    once per process) and pacer of request prefixes (a bundle's read takes its prefix's
    token; a throttle answer is told to it). ``threads``: the engine's (a batch's heads and
    bundle reads run on pools of about that many). Thread-safe."""

    def __init__(self, below: Reader, bundles: StagerSlot, pacer: Pacer, threads: int = 2,
                 executor: Optional[Executor] = None) -> None:
        self._below = below
        self._bundles = bundles
        self._pacer = pacer
        self._threads = threads
        self._executor = executor  # an engine's injected one (tests: runs the bundle reads), else None
        self._planned: Dict[Tuple[str, str], Optional[Found]] = {}  # located (None: no member), for prepare
        self._held = HeldBodies()  # members read ahead, until their reads take them (bounded)
        self._lock = _threads.Lock()  # of _planned

    def _in_use(self, batch: Sequence[Url]) -> bool:
        """Bundles may serve ``batch``: some were used in this process, or they are on in the
        settings and the batch reads enough of one directory (:mod:`transfer.bundle_gate`)."""
        if self._bundles.made is not None:
            return True
        if not self._bundles.enabled:
            return False
        from transfer.bundle_gate import may_read_bundles  # (not on a one-file job's import path)
        return may_read_bundles(batch)

    def locate(self, batch: Sequence[Url]) -> bool:
        """The members serving ``batch`` (the indexes of its directories loaded, their heads
        on a pool of ``threads`` + 2), kept for the :meth:`prepare` after; else below's."""
        if not self._in_use(batch):
            return self._below.locate(batch)
        planned = self._plan(batch)
        with self._lock:
            if len(self._planned) > _PLANNED_KEPT:  # located, then read by no prepare (cache hits, peers')
                self._planned.clear()
            self._planned.update(planned)
        return any(found is not None for found in planned.values()) or self._below.locate(batch)

    def _plan(self, batch: Sequence[Url]) -> Dict[Tuple[str, str], Optional[Found]]:
        """Each URL of ``batch`` and the member serving it (None: none)."""
        from transfer._workers import Workers
        heads = Workers(self._threads + 2, thread_name_prefix="heads")
        try:
            found = self._bundles.get().plan_reads(batch, heads.map)
        finally:
            heads.shutdown(wait=True)  # idle threads: none left to hold a lock when the drop-in forks
        planned: Dict[Tuple[str, str], Optional[Found]] = dict.fromkeys(((url.host, url.path) for url in batch), None)
        planned.update(((url.host, url.path), member) for url, member in found)
        return planned

    def kept_under(self, url: Url) -> Optional[str]:
        """A known member's key (its bundle's cache key, name and SHA-256), else below's."""
        found = self._known(url, False) if self._bundles.made is not None else None  # (a call less: most reads)
        return self._below.kept_under(url) if found is None else self._member_key(found)

    def stat(self, url: Url) -> ObjectInfo:
        try:
            return self._below.stat(url)
        except NotFound as err:
            found = self._resolve(url, err)
            return ObjectInfo(url, found[2].size, self._member_key(found), origin=ORIGIN)

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        """A member read ahead, a known member, else below, else (below found nothing) the
        member standing in."""
        held = self._held.take(url) if byte_range is None and self._held.bodies else None
        if held is not None:
            sink.write(held[0])
            return held[1]
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
        held = self._held.take(url) if self._held.bodies else None  # (a call less: most reads)
        if held is not None:
            return atomic_write_bytes(path, held[0], mode)
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
        """Where bundles may serve ``batch``, each bundle holding members of it read once (its
        members checked as they stream, :func:`~transfer.bundles.fetch.stream_members`), the
        bundles the listing brought whole first, the others on a pool of their own; the
        members' bodies held for their reads, and their URLs yielded a bundle at a time.
        Nothing goes below then: a read-ahead would GET names that are members (404s). A
        bundle that fails (a reset, a member that fails its check, a bundle gone) holds what
        it finished; its other members are read one by one by their reads, under the engine's
        retries. Else the store's read-ahead: a 404 before any body marks its directory as
        expected to hold members (its index is listed by the first read that asks for one of
        its names, not here); a 404 among bodies is one missing object."""
        if self._bundles.made is None:
            if not self._bundles.enabled:
                return self._ahead(batch, cancel)
            if not self._in_use(batch):
                return nothing_prepared()  # a read-ahead would GET names that may be members
        return self._groups(batch, cancel)

    def _ahead(self, batch: Sequence[Url], cancel: Optional[Cancel]) -> Prepared:
        """The store's read-ahead; the directories of the 404s it ended at marked expected."""
        absent = yield from self._below.prepare(batch, cancel)
        if absent:
            stager = self._bundles.get()
            for url in absent:
                stager.expect(url)
        return absent

    def _groups(self, batch: Sequence[Url], cancel: Optional[Cancel]) -> Prepared:
        """:meth:`prepare` where bundles may serve the batch."""
        groups = self._grouped(batch)
        fetched = [group for group in groups if not group[1].complete]
        for group in groups:
            if group[1].complete and not (cancel is not None and cancel.is_set()):
                yield self.read_bundle(group)  # no request: from this thread
        if not fetched:
            return []
        from transfer._workers import Workers
        # Unpacking a bundle is local CPU work: more threads than cores only fight over the interpreter lock.
        pool = self._executor or Workers(max(1, min(self._threads, os.cpu_count() or 1, len(fetched))),
                                         thread_name_prefix="bundle")
        try:
            for future in [pool.submit(self.read_bundle, group) for group in fetched]:
                if cancel is not None and cancel.is_set():
                    break
                yield future.result()
        finally:
            if pool is not self._executor:
                pool.shutdown(wait=True, cancel_futures=True)
        return []

    def _grouped(self, batch: Sequence[Url]) -> List[Group]:
        """The located (else now planned) members of ``batch``, by bundle."""
        self._held.drop_stale()
        with self._lock:
            planned = [(url, self._planned.pop((url.host, url.path), _UNPLANNED)) for url in batch]
        if any(found is _UNPLANNED for _, found in planned):  # not located first (no cache layer above)
            late = self._plan([url for url, found in planned if found is _UNPLANNED])
            planned = [(url, late.get((url.host, url.path)) if found is _UNPLANNED else found) for url, found in planned]
        groups: Dict[Tuple[int, str, str], Group] = {}
        for url, found in planned:
            if isinstance(found, tuple):
                backend, bundle, member = found
                key = (id(backend), bundle.url.host, bundle.url.path)
                groups.setdefault(key, (backend, bundle, []))[2].append((url, member))
        return list(groups.values())

    def read_bundle(self, group: Group) -> List[Url]:
        """One bundle read for its wanted members; the URLs whose bodies are now held."""
        backend, bundle, wanted = group
        members = {member.name: member for _, member in wanted}
        bodies: Dict[str, bytes] = {}
        try:
            self._stream(backend, bundle, list(members.values()), bodies)
        except NotFound:
            self._forget(wanted[0][0])  # the bundle is gone: its members' reads ask the store afresh
        except (TransferError, OSError):
            pass  # what finished is held; the rest are read one by one, under the engine's retries
        keys = cache_keys(backend)
        bundle_key = keys.cache_key(bundle.url) if keys is not None else None
        return self._hold(wanted, bodies, bundle_key)

    def _stream(self, backend: Backend, bundle: LoadedBundle, members: List[Member], bodies: Dict[str, bytes]) -> None:
        """``members``' bytes into ``bodies`` (each once it passed its check), each request
        with its prefix's token; a throttle answer is told to the pacer and the members not yet
        read are asked for again, with a new token (:data:`_THROTTLED_TRIES` requests in all:
        one bundle's members one by one would be as many requests as members)."""
        from transfer.bundles.fetch import stream_members
        pace = None if bundle.complete else self._pacer.pace(bundle.url)  # a bundle in memory costs no request
        for tries in range(1, _THROTTLED_TRIES + 1):
            if pace is not None:
                pace.acquire()
            started = time.time()
            try:
                stream_members(backend, bundle, [m for m in members if m.name not in bodies],
                               lambda member: _Body(bodies, member.name))
                return
            except Throttled:
                if pace is None:
                    raise
                pace.throttled(started)
                if tries == _THROTTLED_TRIES:
                    raise

    def _hold(self, wanted: List[Tuple[Url, Member]], bodies: Dict[str, bytes], bundle_key: Optional[str]) -> List[Url]:
        """Hold the members read (within the bound); their URLs. A member's ``ObjectInfo``
        names its own key as its version (``bundle_key`` None: the backend keys no cache)."""
        from transfer.bundles.reading import member_key
        held: List[Url] = []
        now = time.monotonic()
        with self._held.lock:
            for url, member in wanted:
                body = bodies.get(member.name)
                version = member_key(bundle_key, member) if bundle_key is not None else None
                if body is not None and self._held.put(url, body, ObjectInfo(url, len(body), version, origin=ORIGIN),
                                                       now):
                    held.append(url)
        return held

    def take(self, url: Url) -> Optional[Tuple[bytes, ObjectInfo]]:
        """A member's body read ahead, else below's."""
        held = self._held.take(url) if self._held.bodies else None  # (a call less: most reads)
        return held if held is not None else self._below.take(url)

    # -- members ------------------------------------------------------------------------

    def _known(self, url: Url, resident: bool = True) -> Optional[Found]:
        """The member serving ``url`` by an index loaded (or loading) in this process; None
        without bundles used, or for a URL whose backend cannot be made (below reports it)."""
        stager = self._bundles.made
        if stager is None or url.is_local:
            return None
        try:
            return stager.known_member(url, resident)
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
        """One member at ``path``, atomically: nothing is left there when it fails its check
        (an error naming ``url``) or the bundle is gone (NotFound)."""
        from transfer.atomic import AtomicFile
        from transfer.bundles.format import BundleFormatError
        from transfer.bundles.reading import read_member
        backend, bundle, member = found
        with AtomicFile(path) as out:
            try:
                read_member(backend, bundle, member, out.file)
            except BundleFormatError as err:
                raise err.relabelled(url=str(url), operation="get") from err
            return out.commit()


class _Body:
    """A :class:`~transfer.bundles.fetch.Writer` that keeps one member's bytes in ``bodies``
    once they passed their check."""

    def __init__(self, bodies: Dict[str, bytes], name: str) -> None:
        self._bodies = bodies
        self._name = name
        self._parts: List[bytes] = []

    def write(self, data: bytes) -> None:
        self._parts.append(data)

    def commit(self) -> None:
        self._bodies[self._name] = b"".join(self._parts)

    def abort(self) -> None:
        self._parts = []
