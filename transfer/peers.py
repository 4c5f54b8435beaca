"""The seam between the engine's read path and peer-to-peer sharing of node caches.

The engine reads a remote object from the first of these that has it:

1. the node cache (``transfer.cache``), keyed by the backend's cache key;
2. peers: other nodes' caches, found through a replica index (a :class:`PeerSource`);
3. bundles: a member of a bundle in the object's directory (``transfer.bundles``);
4. the store itself.

Whatever step 2-4 delivers fills the node cache once, so peers need the node cache: an
engine without one never asks a peer. A :class:`PeerSource` is optional
(``Engine(..., peers=None)`` runs exactly as on a single node); an implementation lives
outside the core (``transfer.p2p``) because it needs an index client.

Per batch the engine calls :meth:`PeerSource.lookup` once with the cache keys of every remote
source it may read, :meth:`PeerSource.holds` (no I/O) to keep peer-held files out of bundle
fetches, :meth:`PeerSource.fetch` while filling the node cache, and
:meth:`PeerSource.publish` once with what the batch stored in the node cache, each with the
SHA-256 the cache computed while writing it (no second read), after the node cache has let this
node's daemon serve it (the capability line beside the entry).

Trust (``docs/security.md``): every key handed to a source carries the :class:`Scope` of the
store identity that reads it (a secret derived from that identity's store secret key and
the bucket; :func:`derive_scope`). A source may only accept bytes whose size and SHA-256
were registered under the same scope (authenticated with it), and may only ask a peer for
an object with a proof derived from the scope. Keys without a scope (anonymous sources, a
backend that cannot name its identity) are never looked up, fetched or published.

Contract for implementations: no method raises for an index, network or peer failure (such
failures mean "no peer has it" and are reported once through the implementation's own
warning channel); bytes are verified against the size and SHA-256 the producer registered
before ``fetch`` returns them as good. :class:`PeerRound` shields the engine from an
implementation that breaks the contract anyway: an exception disables peers for the rest of
the batch, with one warning.
"""

from __future__ import annotations

import logging
import threading
from transfer.lean import Protocol, runtime_checkable
from transfer.lean import field, record
from transfer.peer_scope import Scope, derive_scope, proof

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

__all__ = ["PeerRound", "PeerSink", "PeerSource", "Replica", "Scope", "derive_scope", "proof"]

_log = logging.getLogger(__name__)
if TYPE_CHECKING:
    Buffer = Union[bytes, bytearray, memoryview]
else:
    Buffer = object  # the alias above is for type checkers; typing is not imported at run time
if TYPE_CHECKING:
    _T = TypeVar("_T")
else:
    _T = object  # the alias above is for type checkers; typing is not imported at run time


@record(frozen=True)
class Replica:
    """What a node registers for one cached object: its cache key, size and SHA-256 (hex),
    and the scope it was read under (None: not shareable)."""

    key: str
    size: int
    sha256: str
    scope: Optional[Scope] = field(default=None, compare=False, repr=False)


@runtime_checkable
class PeerSink(Protocol):
    """Where a peer's bytes go: the node cache's temp file for the entry being filled.

    Nothing written here is visible to a job until the engine publishes it, so a source may
    stream unverified bytes and :meth:`reset` them when verification fails."""

    def write(self, data: Buffer) -> int:
        """Append ``data``; returns its length."""

    def reset(self) -> None:
        """Discard everything written so far (the sink is then empty, as when handed over)."""


@runtime_checkable
class PeerSource(Protocol):
    """Where the engine asks for objects other nodes already hold. Thread-safe."""

    def lookup(self, keys: Mapping[str, Scope]) -> None:
        """Learn which peers hold which of a batch's cache keys (each with the scope of the
        identity that reads it), in one index round trip.

        Called once per batch before any :meth:`holds` or :meth:`fetch`; keys not looked up
        are held by no peer."""

    def holds(self, key: str) -> bool:
        """True if the last lookup found a live peer for ``key``. No I/O."""

    def fetch(self, key: str, sink: PeerSink) -> Optional[int]:
        """Write ``key``'s bytes from a peer into ``sink`` and return their size, or None.

        On success the bytes have matched the registered size and SHA-256. On None (no peer
        holds it, every peer failed, was too slow or sent wrong bytes) ``sink`` is empty
        (reset) and the caller goes on to the next source."""

    def publish(self, replicas: Sequence[Replica]) -> None:
        """Register that this node's cache now holds ``replicas`` (each with its scope), in
        one index round trip. The caller has already left each one's capability beside its
        cache entry (:meth:`~transfer.cache.NodeCache.grant`), so this node's daemon serves it."""


class PeerRound:
    """An engine's use of a :class:`PeerSource`, batch by batch: per batch one lookup (of the
    keys given to :meth:`lookup` or queued by :meth:`expect`), fetches, one publish.

    At a batch's end the layer above (:func:`transfer.layers.sharing.publish_batch`) takes the
    batch's entries (:meth:`closing`), lets this node's daemon serve them, and hands back those
    it may register (:meth:`publish`): the round never calls up into the node cache. Thread-safe."""

    def __init__(self, source: PeerSource) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._stored: List[str] = []
        self._scopes: Dict[str, Scope] = {}
        self._replicas: Dict[str, Replica] = {}  # stored keys whose record came with them
        self._expected: Dict[str, Scope] = {}
        self._settling = threading.Lock()  # held over the lookup of the expected keys
        self._unsettled = False  # keys were expected and not yet looked up
        self._broken = False

    def lookup(self, keys: Mapping[str, Scope]) -> None:
        """Look up the keys that have a scope (the others are never shared)."""
        with self._lock:
            self._scopes.update(keys)
        if keys:
            self._guard("lookup", lambda: self._source.lookup(dict(keys)))

    def expect(self, keys: Mapping[str, Scope]) -> None:
        """Queue ``keys`` for the batch's one lookup, made by the first :meth:`holds` or
        :meth:`fetch` after (each endpoint's read stack queues its own keys)."""
        with self._lock:
            self._expected.update(keys)
            self._unsettled = True

    def _settle(self) -> None:
        """Look up the expected keys; a caller that arrives meanwhile waits for the answer."""
        if not self._unsettled:
            return
        with self._settling:
            with self._lock:
                keys, self._expected = self._expected, {}
            if keys:
                self.lookup(keys)
            with self._lock:
                self._unsettled = bool(self._expected)

    def holds(self, key: str) -> bool:
        self._settle()
        return (not self._broken and key in self._scopes
                and bool(self._guard("holds", lambda: self._source.holds(key))))

    def fetch(self, key: str, sink: PeerSink) -> Optional[int]:
        """The peer's verified size, or None with ``sink`` empty."""
        if not self.holds(key):
            return None
        size = self._guard("fetch", lambda: self._source.fetch(key, sink))
        if size is None:
            sink.reset()  # whatever a failed or broken source left behind
        return size

    def stored(self, key: str, scope: Optional[Scope] = None, replica: Optional[Replica] = None) -> None:
        """The node cache now holds ``key`` because of this batch, read or written under
        ``scope`` (default: the scope it was looked up with): publish it, as ``replica`` when
        given (else as the node cache describes its entry at the batch's end)."""
        with self._lock:
            if scope is not None:
                self._scopes[key] = scope
            if replica is not None:
                self._replicas[key] = replica
            self._stored.append(key)

    def closing(self) -> List[Tuple[str, Scope, Optional[Replica]]]:
        """The batch's stored keys that have a scope, once each: (key, scope, its replica when
        :meth:`stored` was given one, else None). Forgets them: call :meth:`publish` next."""
        with self._lock:
            keys, self._stored = list(dict.fromkeys(self._stored)), []
            known, self._replicas = self._replicas, {}
            scopes = dict(self._scopes)
        return [(key, scopes[key], known.get(key)) for key in keys if key in scopes]

    def publish(self, replicas: Sequence[Replica]) -> None:
        """Register ``replicas`` (each with its scope; this node's daemon serves them already);
        the batch is over (a source that broke in it is tried again in the next)."""
        if replicas:
            self._guard("publish", lambda: self._source.publish(replicas))
        with self._lock:
            self._broken = False

    def _guard(self, what: str, call: Callable[[], Optional[_T]]) -> Optional[_T]:
        if self._broken:
            return None
        try:
            return call()
        except Exception as err:  # noqa: BLE001 - a broken source must not fail transfers
            with self._lock:
                first, self._broken = not self._broken, True
            if first:
                _log.warning("peer sharing off for this batch: %s failed: %s: %s", what,
                             type(err).__name__, err)
            return None
