"""The bottom of every read stack: the backend of one endpoint.

:class:`StoreReader` reads large objects in parallel ranged parts where the backend can
(:class:`~transfer.backends.base.RangedReads`, :mod:`transfer.ranged`) and with one plain GET
otherwise, into a temp file beside the destination that is renamed into place
(:class:`~transfer.atomic.AtomicFile`). It holds plain values only: the backend, the part pool
all ranged reads of an engine share, the part size, the pacer of request prefixes and the
connections a read-ahead may use.

Its :meth:`~StoreReader.prepare` is the pipelined first pass over a batch of small objects
(:class:`~transfer.backends.base.BatchReads`: S3's pipelined GETs from one thread,
:mod:`transfer.http.pipeline`): each body that arrives whole and passes the checks ``get``
makes is held here until the next read of its URL takes it (``get``, ``fetch_to`` or
:meth:`~StoreReader.take`), once, and its URL handed to the caller as the pass goes (the pass's
thread and the caller's take turns, never running at once). Whatever the pass does not hold (an
error answer, a failed check, a large object, no answer, a 404: maybe a bundle member, which a
layer above finds) is read as if there had been no pass, one request more. A 404 before any
body ends the pass (a directory written as bundles answers 404 to every name; its reads then
find the members with one listing); a 404 after bodies is one missing object, and the pass
goes on. The bodies are held in a :class:`HeldBodies`, bounded, which the bundle layer holds
its members' bodies in too.
"""

from __future__ import annotations

import time

from transfer import _threads, ranged
from transfer.atomic import AtomicFile, atomic_write_bytes
from transfer.backends.base import batch_reads, ranged_reads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from _thread import LockType
    from typing import BinaryIO, Dict, List, Optional, Sequence, Tuple

    from transfer._threads import Cancel
    from transfer.backends.base import Backend, BatchReads, ByteRange, ObjectInfo
    from transfer.layers import Prepared
    from transfer.pacing import Pacer
    from transfer.urls import Url

    Held = Tuple[bytes, ObjectInfo]
    Kept = Tuple[bytes, ObjectInfo, float]  # (body, its ObjectInfo, monotonic seconds it was held at)

__all__ = ["HELD_BYTES", "HELD_SECONDS", "HeldBodies", "StoreReader"]

_MIN_BATCH = 2  # one object gains nothing from a pass of its own
_RELAY = 32  # bodies held before the read-ahead hands them to the caller and waits: fewer than in flight
# (5 connections x 32); 8 cost 5% more client CPU per small GET in hand-overs (2,000 files, 2026-12-03)
_LINGER = 0.05  # seconds the caller waits for a full relay before it takes fewer: a stalled pass's files
# are on disk by then (a job evicted meanwhile keeps them; 32 arrive within ~16 ms on loopback)


# A body is found by (url.host, url.path), spelt out where it is used, not a function: a call per
# use costs a small GET 1% of CPU.


HELD_BYTES = 256 << 20  # bodies one holder holds at once; past it a body is left to its own read
HELD_SECONDS = 60.0  # a body no read took by then (its transfer cancelled) is dropped at a prepare


class HeldBodies:
    """One holder's bodies. Thread-safe under :attr:`lock`, which :meth:`put` expects its
    caller to hold (the store reader's relay does more under the same lock: one lock a body)."""

    __slots__ = ("lock", "bodies", "size")

    def __init__(self) -> None:
        self.lock = _threads.Lock()
        self.bodies: Dict[Tuple[str, str], Kept] = {}
        self.size = 0  # bytes of :attr:`bodies`

    def put(self, url: Url, body: bytes, info: ObjectInfo, at: float) -> bool:
        """Hold ``body`` of ``url`` from ``at`` (monotonic seconds), the caller holding
        :attr:`lock`; False, holding nothing, where it would pass :data:`HELD_BYTES`."""
        if self.size + len(body) > HELD_BYTES:
            return False
        self.bodies[url.host, url.path] = (body, info, at)
        self.size += len(body)
        return True

    def take(self, url: Url) -> Optional[Held]:
        """The body held for ``url`` and its ``ObjectInfo``, handed over once (None: none)."""
        if not self.bodies:  # the common case: nothing read ahead, no lock
            return None
        with self.lock:
            held = self.bodies.pop((url.host, url.path), None)
            if held is None:
                return None
            self.size -= len(held[0])
        return held[0], held[1]

    def drop_stale(self) -> None:
        """Forget the bodies held longer than :data:`HELD_SECONDS`."""
        if not self.bodies:
            return
        now = time.monotonic()
        with self.lock:
            for name, kept in list(self.bodies.items()):
                if now - kept[2] > HELD_SECONDS:
                    del self.bodies[name]
                    self.size -= len(kept[0])


def _unique(batch: Sequence[Url]) -> List[Url]:
    """``batch`` with each object once (two transfers of one source: one read ahead)."""
    seen: Dict[Tuple[str, str], Url] = {}
    for url in batch:
        seen.setdefault((url.host, url.path), url)
    return list(seen.values())


class StoreReader:
    """:class:`~transfer.layers.Reader` over one backend. Thread-safe as the backend is."""

    def __init__(self, backend: Backend, parts: ranged.PartPool, part_size: int, pacer: Pacer,
                 connections: int = 2) -> None:
        self.backend = backend
        self._parts = parts
        self._part_size = part_size
        self._pacer = pacer
        self._connections = connections
        self._held = HeldBodies()  # bounded; its lock is the relay's too

    def kept_under(self, url: Url) -> Optional[str]:
        """None: the store's objects are kept under their own keys."""
        return None

    def locate(self, batch: Sequence[Url]) -> bool:
        """False: the store's objects are kept under their own keys."""
        return False

    def stat(self, url: Url) -> ObjectInfo:
        return self.backend.stat(url)

    def get(self, url: Url, sink: BinaryIO, byte_range: Optional[ByteRange] = None) -> ObjectInfo:
        """The held body, else one GET (the backend verifies the bytes)."""
        held = self._held.take(url) if byte_range is None and self._held.bodies else None
        if held is not None:
            sink.write(held[0])
            return held[1]
        return self.backend.get(url, sink, byte_range)

    def fetch_to(self, url: Url, path: str, link: bool = False, mode: int = 0o666) -> int:
        """The held body; else ranged parts where the backend reads ranges, else one GET;
        ``link`` means nothing here (no entry to link to)."""
        held = self._held.take(url) if self._held.bodies else None  # (a call less: most reads)
        if held is not None:  # the lean write of a few bytes: no file object, four system calls
            return atomic_write_bytes(path, held[0], mode)
        with AtomicFile(path, mode=mode) as out:
            in_ranges = ranged_reads(self.backend)
            if in_ranges is not None:
                return ranged.download(in_ranges, url, out, self._parts, self._part_size, self._pacer.pace(url))
            self.backend.get(url, out.file)
            return out.commit()

    def take(self, url: Url) -> Optional[Held]:
        """The body :meth:`prepare` read of ``url`` and its ``ObjectInfo``, handed over once."""
        return self._held.take(url)

    def prepare(self, batch: Sequence[Url], cancel: Optional[Cancel] = None) -> Prepared:
        """Read the small objects of ``batch`` in one pipelined pass where the backend can,
        each request drawing its token from the pacer (:meth:`~transfer.pacing.Pace.draw`: a
        pass into a paced prefix is paced, not skipped), holding each body for its next read.
        Yields the URLs held, :data:`_RELAY` at a time, as the pass goes: the pass runs on a
        thread of its own that waits while the caller reads what it was handed, so the two
        never run at once (the requests in flight are answered into the sockets meanwhile, as
        in one thread that writes between reads); when fewer arrive within :data:`_LINGER`
        (a slow or stalled store), the caller takes those held so far while the pass goes on,
        so a file read ahead is written within that time. A throttle answer ends the pass and is told
        to the pacer. Returns the URLs answered 404 before any body was held (the pass ended
        at the first). Never raises; closing the generator early ends the pass (bodies not yet
        handed over are dropped at a later prepare, or taken by their reads)."""
        reads = batch_reads(self.backend)
        if reads is None or len(batch) < _MIN_BATCH:
            return []
        self._held.drop_stale()
        batch = _unique(batch)
        relay = _Relay(self._held.lock)
        absent: List[Url] = []
        thread = _threads.start(lambda: self._read_ahead(reads, batch, relay, absent, cancel), "read-ahead")
        parked = False  # the reader waits for the caller's turn to end
        try:
            while True:
                chunk, parked = relay.next()
                if chunk:
                    yield chunk
                if parked:
                    if relay.ended:
                        break
                    parked = False
                    relay.resume()
        finally:
            relay.stopped = True  # closed early: the reader takes nothing more and ends its pass
            if not (parked and relay.ended):
                if parked:
                    relay.resume()
                relay.drain()
            thread.join()
        return absent

    def _read_ahead(self, reads: BatchReads, batch: List[Url], relay: _Relay, absent: List[Url],
                    cancel: Optional[Cancel]) -> None:
        """:meth:`prepare`'s pass, on its own thread: each body held, its URL handed to ``relay``."""
        pace = self._pacer.pace(batch[0])
        held = [0]

        def take(k: int, body: bytes, info: ObjectInfo, sent: float) -> bool:
            url = batch[k]
            with self._held.lock:  # the relay's lock too: one lock a body
                if relay.stopped or not self._held.put(url, body, info, sent):
                    return False
                relay.pending.append(url)
                full = len(relay.pending) >= _RELAY
                if full:
                    relay.chunk, relay.pending = relay.pending, []
            held[0] += 1
            if full:
                relay.hand_over()
            return True

        def throttled(sent: float) -> None:
            pace.throttled(time.time() - (time.monotonic() - sent))  # the pace's clock is epoch time

        def missing(k: int) -> bool:
            # A 404 before any body: likely a directory written as bundles, whose names all
            # answer 404 (the reads find the members, one listing); after bodies, one missing
            # object, which fails alone: the pass goes on.
            if held[0]:
                return False
            absent.append(batch[k])
            return True

        try:
            reads.read_small(batch, take, connections=self._connections, cancel=cancel, missing=missing,
                             throttled=throttled, draw=lambda: pace.draw(cancel))
        finally:
            relay.end()


class _Relay:
    """URLs held by a read-ahead thread, handed to the caller's thread :data:`_RELAY` at a
    time; the two take turns (a baton of two locks), never running at once, but for a pass
    that holds fewer within :data:`_LINGER`: the caller then takes what it holds without the
    baton, and the reader goes on."""

    def __init__(self, lock: LockType) -> None:
        self.pending: List[Url] = []  # held since the last hand-over (under ``lock``)
        self.chunk: List[Url] = []  # handed over with the baton
        self.ended = False  # the pass is over: the last chunk was handed over
        self.stopped = False  # the caller stopped early: the reader takes nothing more
        self._lock = lock  # pending: the reader adds (as it holds a body), a caller that lingered takes
        self._caller = _threads.Lock()  # released: the caller's turn
        self._caller.acquire()
        self._reader = _threads.Lock()  # released: the reader's turn again
        self._reader.acquire()

    def hand_over(self) -> None:
        """The reader's, once it moved :data:`_RELAY` URLs from :attr:`pending` to :attr:`chunk`
        under the lock (as it held their bodies, in :meth:`StoreReader._read_ahead`): the
        caller's turn, and wait for the reader's."""
        self._caller.release()
        self._reader.acquire()

    def end(self) -> None:
        """The reader's, last: hand over the rest; the caller's turn for good."""
        with self._lock:
            self.chunk, self.pending = self.pending, []
        self.ended = True
        self._caller.release()

    def next(self) -> Tuple[List[Url], bool]:
        """The caller's: (the URLs handed over, True) once the reader's turn ends, the reader
        then waiting (for :meth:`resume`, unless :attr:`ended`); or, after :data:`_LINGER`
        without, (those held so far, False), the reader still reading."""
        if self._caller.acquire(True, _LINGER):
            chunk, self.chunk = self.chunk, []
            return chunk, True
        with self._lock:
            held, self.pending = self.pending, []
        return held, False

    def resume(self) -> None:
        """The caller's, after :meth:`next` handed over the baton and not ended: the reader's turn."""
        self._reader.release()

    def drain(self) -> None:
        """The caller's, having stopped (the reader holds nothing more) and not waited on:
        turn the baton until the pass ends."""
        while True:
            self._caller.acquire()
            if self.ended:
                return
            self._reader.release()
