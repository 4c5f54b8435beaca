"""Peer-sharing scopes: the secret of one store identity for one bucket, and the MACs made with it.

A value the backends make (:class:`~transfer.backends.base.PeerScopes`: a backend names the
scope of the identity it reads with) and the peer layer, the index and the daemon use, so it
lives below all of them (:mod:`transfer.peers` re-exports it). Trust: ``docs/security.md``.
"""

from __future__ import annotations

import hashlib
import hmac

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, List, Optional, Sequence, Tuple

__all__ = ["Scope", "derive_scope", "proof"]


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
