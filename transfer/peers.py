"""The seam between the engine's read path and peer-to-peer sharing of node caches.

The engine reads a remote object from the first of these that has it:

1. the node cache (``transfer.cache``), keyed by the backend's cache key;
2. peers: other nodes' caches, found through a replica index (a :class:`PeerSource`);
3. bundles: a member of a bundle in the object's directory (``transfer.bundles``);
4. the store itself.

Whatever step 2-4 delivers fills the node cache once. A :class:`PeerSource` is optional
(``Engine(..., peers=None)`` runs without peers, exactly as on a single node); an
implementation lives outside the core (``transfer.p2p``) because it needs an index client.

Contract for implementations: no method raises for an index, network or peer failure (such
failures mean "no peer has it" and are reported once through the implementation's own
warning channel); bytes are verified against the size and SHA-256 the producer registered
before ``fetch`` returns them as good.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Optional, Protocol, Sequence, runtime_checkable

__all__ = ["PeerSource", "Replica"]


@dataclass(frozen=True)
class Replica:
    """What a node registers for one cached object: its cache key, size and SHA-256 (hex)."""

    key: str
    size: int
    sha256: str


@runtime_checkable
class PeerSource(Protocol):
    """Where the engine asks for objects other nodes already hold. Thread-safe."""

    def lookup(self, keys: Sequence[str]) -> None:
        """Learn which peers hold which of a batch's cache keys, in one index round trip.

        Called once per batch before any :meth:`fetch`; keys not looked up are fetched
        from no peer."""

    def fetch(self, key: str, sink: BinaryIO) -> Optional[int]:
        """Write ``key``'s bytes from a peer into ``sink`` and return their size, or None.

        ``sink`` is a seekable, truncatable temp file positioned at 0. On success the bytes
        have matched the registered size and SHA-256. On None (no peer holds it, every peer
        failed, was too slow or sent wrong bytes) ``sink`` is left empty at position 0 and
        the caller goes on to the next source."""

    def publish(self, replicas: Sequence[Replica]) -> None:
        """Register that this node's cache now holds ``replicas``, in one index round trip."""
