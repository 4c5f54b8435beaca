"""SHA-256, MD5 and HMAC-SHA256 for a job step's small inputs, without :mod:`hashlib`.

``import hashlib`` loads OpenSSL's ``_hashlib`` (about 3.5 ms of CPU) and ``hmac`` adds
``warnings``: together about 5 ms on every job step, to hash a few hundred bytes (a SigV4
string to sign, a small body, a small object's ETag check, a cache key). The interpreter's
own implementations (``_sha256``/``_md5`` in Python 3.11, ``_sha2``/``_md5`` from 3.12) cost
nothing to import and give the same digests, but hash SHA-256 about 7x slower than OpenSSL
(6 ms per MiB against 0.9 on the 2-core VM). So the built-in ones serve inputs of up to
:data:`SMALL` bytes while :mod:`hashlib` is not loaded yet; anything larger, of unknown size,
of another algorithm, or once something has loaded :mod:`hashlib`, goes to OpenSSL.

A process that hashes many small inputs (a batch of small GETs: a SigV4 signature each)
repays the load: after :data:`BUILTIN_SHA256` small SHA-256 hashes, the next loads OpenSSL,
which then serves SHA-256 (1.4 us against 3.2 for 300 bytes, 1.0 against 3.8 for a
signature's HMAC copy and update: a SigV4 signature 9.2 us against 12.6). MD5 of up to
:data:`SMALL_MD5` bytes stays built-in even then (1.2 us against 1.8 for 300 bytes: OpenSSL's
per-call cost). :data:`sha256_openssl` says which serves SHA-256 now: a cache of keyed HMAC
states (the SigV4 signer's) makes them again when it turns true.

* :func:`new(name, size)` - a hash object (``update``, ``digest``, ``hexdigest``) for
  ``name`` (``md5``, ``sha256``, or any :func:`hashlib.new` name) of about ``size`` bytes
  (None: unknown).
* :class:`Stream` - a hash of a stream of unknown length: its first :data:`SMALL` bytes are
  held, then handed to OpenSSL if more come (the choice above, made when the size is known).
* :func:`sha256_hex(data)` / :func:`md5(data)` - digests of one buffer.
* :func:`digest_of(key)` - the name of a node-cache key (its entry's files, the peers' paths).
* :func:`hmac_sha256(key, message)` - ``hmac.digest(key, message, "sha256")`` (RFC 2104);
  :func:`hmac_sha256_states(key)` - the keyed states, to sign many messages with one key.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

    from transfer.lean import Buffer

    class Hash(Protocol):
        def update(self, data: Buffer, /) -> None: ...

        def digest(self) -> bytes: ...

        def hexdigest(self) -> str: ...

        def copy(self) -> "Hash": ...

__all__ = ["BUILTIN_SHA256", "SMALL", "SMALL_MD5", "Stream", "digest_of", "hmac_sha256", "hmac_sha256_states", "md5",
           "new", "sha256_hex", "sha256_openssl"]

SMALL = 256 << 10
SMALL_MD5 = 2 << 10  # up to here the built-in MD5 is the faster one, OpenSSL loaded or not
BUILTIN_SHA256 = 1024  # small SHA-256 hashes the built-in serves, then OpenSSL: by then the built-in
# has cost 3-4 ms more than OpenSSL would have (3.4 us a signature), of the order of loading OpenSSL
# (6 ms on the 2-core VM), so a process pays at most about twice the better of the two choices
sha256_openssl = False  # OpenSSL serves SHA-256 from now on (module doc)
_builtin_sha256_left = BUILTIN_SHA256
_BLOCK = 64  # SHA-256's block size, the HMAC key's padded length
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


def _builtins() -> "Dict[str, Callable[..., Any]]":
    found: "Dict[str, Callable[..., Any]]" = {}
    sha2 = "_sha2" if sys.version_info >= (3, 12) else "_sha256"
    for module, name in ((sha2, "sha256"), ("_md5", "md5")):
        try:
            found[name] = getattr(__import__(module), name)
        except (ImportError, AttributeError):  # an interpreter built without it: hashlib serves
            pass
    return found


_BUILTIN = _builtins()


def new(name: str, size: "Optional[int]" = None) -> "Hash":
    """A fresh hash object of algorithm ``name`` for about ``size`` bytes (see the module)."""
    global sha256_openssl, _builtin_sha256_left
    make = _BUILTIN.get(name)
    if make is not None and size is not None and size <= SMALL:
        if name == "md5":
            if size <= SMALL_MD5 or "hashlib" not in sys.modules:
                return make()  # type: ignore[no-any-return]
        elif not sha256_openssl:
            if _builtin_sha256_left > 0 and "hashlib" not in sys.modules:
                _builtin_sha256_left -= 1  # a lost count between threads only moves the switch by one
                return make()  # type: ignore[no-any-return]
            sha256_openssl = True
    import hashlib
    if name == "sha256":
        return hashlib.sha256()  # hashlib.new's look-up by name costs a small input half as much again
    return hashlib.new(name)


class Stream:
    """The ``name`` hash of bytes given in pieces (see the module docstring)."""

    __slots__ = ("_name", "_held", "_size", "_hash")

    def __init__(self, name: str = "sha256") -> None:
        self._name = name
        self._held: "List[bytes]" = []
        self._size = 0
        self._hash: "Optional[Hash]" = None

    def update(self, data: "Buffer") -> None:
        if self._hash is None:
            self._size += len(data)
            if self._size <= SMALL:
                self._held.append(bytes(data))  # a copy: callers reuse their buffers
                return
            self._settle(None)
        assert self._hash is not None
        self._hash.update(data)

    def _settle(self, size: "Optional[int]") -> "Hash":
        if self._hash is None:
            self._hash = new(self._name, size)
            for piece in self._held:
                self._hash.update(piece)
            self._held = []
        return self._hash

    def digest(self) -> bytes:
        return self._settle(self._size).digest()

    def hexdigest(self) -> str:
        return self._settle(self._size).hexdigest()


def sha256_hex(data: "Buffer") -> str:
    digest = new("sha256", len(data))
    digest.update(data)
    return digest.hexdigest()


def digest_of(key: str) -> str:
    """The name of a node-cache key on disk and on the peer wire: the SHA-256 (hex) of the key.
    The cache's entry files (:mod:`transfer.cache.layout`), the peer client's request path and
    the daemon's check all use it, so it lives here, below all of them."""
    return sha256_hex(key.encode("utf-8", "surrogatepass"))


def md5(data: "Buffer") -> bytes:
    digest = new("md5", len(data))
    digest.update(data)
    return digest.digest()


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    inner, outer = hmac_sha256_states(key)
    inner.update(message)
    outer.update(inner.digest())
    return outer.digest()


def hmac_sha256_states(key: bytes) -> "Tuple[Hash, Hash]":
    """HMAC-SHA256 keyed with ``key`` as its (inner, outer) hash states (RFC 2104:
    H(K^opad, H(K^ipad, m))): copy both, feed ``m`` to the inner copy and its digest to the
    outer copy, and the outer digest is the HMAC. Many messages under one key then cost two
    hash copies each instead of re-keying."""
    if len(key) > _BLOCK:
        key = bytes.fromhex(sha256_hex(key))
    key = key.ljust(_BLOCK, b"\0")
    inner = new("sha256", _BLOCK)
    inner.update(key.translate(_IPAD))
    outer = new("sha256", _BLOCK)
    outer.update(key.translate(_OPAD))
    return inner, outer
