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
SHA-256 the cache computed while writing it (no second read).

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

import hashlib
import hmac
import logging
import threading
from transfer._lean import Protocol, runtime_checkable
from transfer._lean import field, record, replace

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


_CONTEXT = b"pegasus-cloudio p2p v1\0"
_LOW_256 = (1 << 256) - 1
# each MAC's purpose (its BLAKE2b personalisation) and digest size in bytes
_PURPOSES = {b"pcio-index": 16, b"pcio-entry": 16, b"pcio-seal": 40, b"pcio-serve": 32, b"pcio-rate-name": 16,
             b"pcio-rate": 16}


class Scope:
    """The peer-sharing scope of one store identity for one bucket: a 32-byte secret that
    only processes holding that identity's store secret key can compute (see
    :func:`derive_scope`). Everything peers exchange about an object is bound to it:

    Each is a keyed BLAKE2b of the scope (a MAC and pseudo-random function):

    * :meth:`index_name`: the name of the object's replica-index entry (other scopes cannot
      find it, and two scopes never share an entry);
    * :meth:`entry_mac`: the tag on each registered (node, size, SHA-256), which a reader
      checks before trusting the SHA-256 (a forged entry is ignored);
    * :meth:`seal`: the registration as the index holds it, size and SHA-256 enciphered
      (anyone can read the index: a SHA-256 in clear would tell whether a user holds a known
      file) and tagged;
    * :meth:`capability`: what the producer leaves beside its cache entry; its daemon serves
      the entry only to a request bearing a :func:`proof` made from it.

    The secret is never written anywhere, logged or shown by ``repr``."""

    __slots__ = ("_secret", "_keyed")

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("a peer scope needs at least 16 secret bytes")
        self._secret = bytes(secret)
        # each purpose's keyed state, made once: copying it skips the key's compression per MAC
        # (a lookup makes three MACs per key; the values are those of a fresh keyed hash)
        self._keyed = {purpose: hashlib.blake2b(key=self._secret, digest_size=size, person=purpose)
                       for purpose, size in _PURPOSES.items()}

    def __repr__(self) -> str:
        return "Scope(<secret>)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scope) and hmac.compare_digest(self._secret, other._secret)

    def __hash__(self) -> int:
        return hash(self._secret)

    def _digest(self, purpose: bytes, *parts: str) -> bytes:
        # keyed BLAKE2b is a MAC and a PRF in one pass (a third of an HMAC-SHA256's CPU here),
        # with the purpose as its personalisation so no value serves for another purpose
        mac = self._keyed[purpose].copy()
        mac.update("\0".join(parts).encode("utf-8", "surrogatepass"))
        return mac.digest()

    def index_name(self, key: str) -> str:
        """The replica index's name for ``key`` in this scope: 128 bits, hex."""
        return self._digest(b"pcio-index", key).hex()

    def index_names(self, keys: Iterable[str]) -> List[str]:
        """:meth:`index_name` of each of ``keys`` (a lookup's batch), in order."""
        base, out = self._keyed[b"pcio-index"], []
        for key in keys:
            mac = base.copy()
            mac.update(key.encode("utf-8", "surrogatepass"))
            out.append(mac.hexdigest())
        return out

    def entry_mac(self, node: str, key: str, size: int, sha256: str) -> str:
        """The tag of one registration (128 bits, hex)."""
        return self._digest(b"pcio-entry", node, key, str(size), sha256).hex()

    def seal(self, node: str, key: str, size: int, sha256: str) -> str:
        """``"<size> <sha256> <tag>"`` (16, 64 and 32 hex digits): size and SHA-256 XORed
        with a keystream of this scope, node and key (only the scope's holders can read them),
        and :meth:`entry_mac` of the clear values. ``size`` < 2**64; ``sha256`` 64 hex digits."""
        clear = (size << 256) | int(sha256, 16)
        sealed = "%080x" % (clear ^ self._pad(node, key))
        return f"{sealed[:16]} {sealed[16:]} {self.entry_mac(node, key, size, sha256)}"

    def unseal(self, node: str, key: str, value: str) -> Optional[Tuple[int, str]]:
        """(size, sha256) of a well-formed :meth:`seal` value; None unless this scope sealed
        it for this node and key. (One lookup unseals a value per key: the XOR is one integer
        operation, not a loop over bytes.)"""
        clear = int(value[:16] + value[17:81], 16) ^ self._pad(node, key)
        size, sha256 = clear >> 256, "%064x" % (clear & _LOW_256)
        if not hmac.compare_digest(value[82:], self.entry_mac(node, key, size, sha256)):
            return None
        return size, sha256

    def open_sealed(self, node: str, key: str, value: str) -> Optional[Tuple[int, str]]:
        """:meth:`unseal` of any text: (size, sha256) when ``value`` is exactly a :meth:`seal`
        value this scope made for this node and key (16, 64 and 32 lowercase hex digits, two
        spaces), else None, malformed or not."""
        return self.open_batch(node, ((key, value),))[0]

    def open_batch(self, node: str, items: Sequence[Tuple[str, str]]) -> List[Optional[Tuple[int, str]]]:
        """:meth:`open_sealed` of each (key, value) that ``node`` registered, in order: one
        lookup opens a value per key, mostly of one node, so the node's part of both MACs is
        hashed once per batch and the loop makes no method call per key. (The hex is checked
        by formatting it back, and the tag by equality with the one computed, so no regular
        expression runs; the values are those of :meth:`_pad` and :meth:`entry_mac`.)"""
        head = (node + "\0").encode("utf-8", "surrogatepass")
        pads, tags = self._keyed[b"pcio-seal"].copy(), self._keyed[b"pcio-entry"].copy()
        pads.update(head)
        tags.update(head)
        equal, from_bytes, low = hmac.compare_digest, int.from_bytes, _LOW_256
        out: List[Optional[Tuple[int, str]]] = []
        for key, value in items:
            if len(value) != 114 or value[16] != " " or value[81] != " " or not value.isascii():
                out.append(None)
                continue
            text = value[:16] + value[17:81]
            try:
                number = int(text, 16)
            except ValueError:
                number = -1
            if "%080x" % number != text:  # int() also takes "0x", "_", "+", upper case and blanks
                out.append(None)
                continue
            name = key.encode("utf-8", "surrogatepass")
            pad, tag = pads.copy(), tags.copy()
            pad.update(name)
            clear = number ^ from_bytes(pad.digest(), "big")
            size, sha256 = clear >> 256, "%064x" % (clear & low)
            tag.update(b"%s\0%d\0%s" % (name, size, sha256.encode("ascii")))
            out.append((size, sha256) if equal(value[82:], tag.hexdigest()) else None)
        return out

    def _pad(self, node: str, key: str) -> int:
        """The 320-bit keystream that enciphers (size, sha256) for ``node`` and ``key``."""
        return int.from_bytes(self._digest(b"pcio-seal", node, key), "big")

    def capability(self, key: str) -> str:
        """The secret a producer's daemon checks readers' proofs against (256 bits, hex)."""
        return self._digest(b"pcio-serve", key).hex()

    def rate_name(self, prefix: str) -> str:
        """The pool rate limiter's name for ``prefix`` in this scope (:mod:`transfer.pacing_pool`)."""
        return self._digest(b"pcio-rate-name", prefix).hex()

    def rate_tag(self, name: str, value: str) -> str:
        """The tag of a pool rate state ``value`` stored under ``name`` (128 bits, hex): a
        state no holder of this scope wrote is ignored."""
        return self._digest(b"pcio-rate", name, value).hex()


def derive_scope(secret: str, *context: str) -> Scope:
    """The scope of the identity whose store secret key is ``secret``, narrowed by
    ``context`` (backend kind, endpoint, access key id, bucket): an HMAC of the context
    keyed by the secret, so it reveals nothing about the secret key."""
    message = _CONTEXT + "\0".join(context).encode("utf-8", "surrogatepass")
    return Scope(hmac.digest(secret.encode("utf-8", "surrogatepass"), message, "sha256"))


def proof(capability: str, binding: str, digest: str) -> str:
    """What a reader sends a daemon for the entry ``digest``, bound to ``binding`` (the
    daemon's certificate as the reader verified it), so a proof a hostile daemon collects
    cannot be replayed to another one."""
    data = f"{binding}\0{digest}".encode()
    return hashlib.blake2b(data, key=bytes.fromhex(capability), digest_size=32, person=b"pcio-proof").hexdigest()


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
        one index round trip."""


class PeerRound:
    """One batch's use of a :class:`PeerSource`: one lookup, fetches, one publish.

    ``describe(key)`` gives the node cache's record of a stored entry (None when the cache
    did not keep it), read at publish time. Thread-safe."""

    def __init__(self, source: PeerSource, describe: Callable[[str], Optional[Replica]]) -> None:
        self._source = source
        self._describe = describe
        self._lock = threading.Lock()
        self._stored: List[str] = []
        self._scopes: Dict[str, Scope] = {}
        self._broken = False

    def lookup(self, keys: Mapping[str, Scope]) -> None:
        """Look up the keys that have a scope (the others are never shared)."""
        with self._lock:
            self._scopes.update(keys)
        if keys:
            self._guard("lookup", lambda: self._source.lookup(dict(keys)))

    def holds(self, key: str) -> bool:
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

    def stored(self, key: str, scope: Optional[Scope] = None) -> None:
        """The node cache now holds ``key`` because of this batch, read or written under
        ``scope`` (default: the scope it was looked up with): publish it."""
        with self._lock:
            if scope is not None:
                self._scopes[key] = scope
            self._stored.append(key)

    def publish(self) -> None:
        with self._lock:
            keys, self._stored = list(dict.fromkeys(self._stored)), []
            scopes = dict(self._scopes)
        replicas = [replace(r, scope=scopes[r.key]) for r in map(self._describe, keys)
                    if r is not None and r.key in scopes]
        if replicas:
            self._guard("publish", lambda: self._source.publish(replicas))

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
