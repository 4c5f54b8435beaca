"""SHA-256, MD5 and HMAC-SHA256 for a job step's small inputs, without :mod:`hashlib`.

``import hashlib`` loads OpenSSL's ``_hashlib`` (about 3.5 ms of CPU) and ``hmac`` adds
``warnings``: together about 5 ms on every job step, to hash a few hundred bytes (a SigV4
string to sign, a small body, a small object's ETag check). The interpreter's own
implementations (``_sha256``/``_md5`` in Python 3.11, ``_sha2``/``_md5`` from 3.12) cost
nothing to import and give the same digests; for inputs over :data:`SMALL` bytes OpenSSL is
faster, so :func:`new` hands those (and any other algorithm) to :mod:`hashlib`.

* :func:`new(name, size)` - a hash object (``update``, ``digest``, ``hexdigest``) for
  ``name`` (``md5``, ``sha256``, or any :func:`hashlib.new` name) of about ``size`` bytes
  (None: unknown, treated as large).
* :func:`sha256_hex(data)` / :func:`md5(data)` - digests of one small buffer.
* :func:`hmac_sha256(key, message)` - ``hmac.digest(key, message, "sha256")`` (RFC 2104).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional

    from transfer._lean import Buffer

__all__ = ["SMALL", "hmac_sha256", "md5", "new", "sha256_hex"]

SMALL = 1 << 20
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


def new(name: str, size: "Optional[int]" = None) -> "Any":
    """A fresh hash object of algorithm ``name`` for about ``size`` bytes (see the module)."""
    make = _BUILTIN.get(name)
    if make is not None and size is not None and size <= SMALL:
        return make()
    import hashlib
    return hashlib.new(name)


def sha256_hex(data: "Buffer") -> str:
    digest = new("sha256", len(data))
    digest.update(data)
    return digest.hexdigest()  # type: ignore[no-any-return]


def md5(data: "Buffer") -> bytes:
    digest = new("md5", len(data))
    digest.update(data)
    return digest.digest()  # type: ignore[no-any-return]


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    if len(key) > _BLOCK:
        key = bytes.fromhex(sha256_hex(key))
    key = key.ljust(_BLOCK, b"\0")
    inner = new("sha256", _BLOCK + len(message))
    inner.update(key.translate(_IPAD))
    inner.update(message)
    outer = new("sha256", _BLOCK + 32)
    outer.update(key.translate(_OPAD))
    outer.update(inner.digest())
    return outer.digest()  # type: ignore[no-any-return]
