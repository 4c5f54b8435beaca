"""Azure Storage Shared Key signing (``Authorization: SharedKey ACCOUNT:SIGNATURE``).

The string to sign, for service versions from 2015-02-21 on, is the verb, eleven standard
header values (Content-Length empty when 0), the ``x-ms-*`` headers in the service's order
(lower-case names, ``name:value``), and the canonical resource: ``/ACCOUNT`` plus the request
path as sent (percent-encoded; for a path-style emulator the path starts with the account
again) and, per query parameter in order, ``\\nname:decoded value``. The HMAC-SHA256 of it
under the base64-decoded account key, base64-encoded, is the signature.

Two details are the reference client's (azure-storage-blob's ``SharedKeyCredentialPolicy``,
which ``tests/test_azure_sign.py`` proves this module against byte for byte): the ``x-ms-*``
names are ordered by the service's collation, in which ``-`` (and ``'``) weigh nothing at the
first level (``x-ms-meta-a-b`` sorts after ``x-ms-meta-ab``), and the query is ordered by the
parameters as written in the URL (encoded), values decoded. Requests here never send a plain
``Range`` (ranges go in ``x-ms-range``), whose slot the reference leaves empty.
"""

from __future__ import annotations

import binascii

from transfer._digests import hmac_sha256
from transfer.errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Sequence, Tuple

X_MS_VERSION = "2023-11-03"  # pinned: the REST behaviour this backend is written against

_STANDARD = ("content-encoding", "content-language", "content-length", "content-md5", "content-type", "date",
             "if-modified-since", "if-match", "if-none-match", "if-unmodified-since", "range")

# The service's collation of header names, first level: the weight of each ASCII character
# (0: ignored at this level). Letters fold case; digits sort before letters.
_PUNCT_WEIGHTS = {"!": 0x71C, "#": 0x71F, "$": 0x721, "%": 0x723, "&": 0x725, "*": 0x72D, "+": 0x803,
                  ".": 0x733, "^": 0x743, "_": 0x744, "`": 0x748, "|": 0x74C, "~": 0x750}
_LETTER_WEIGHTS = (0xE02, 0xE09, 0xE0A, 0xE1A, 0xE21, 0xE23, 0xE25, 0xE2C, 0xE32, 0xE35, 0xE36, 0xE48, 0xE51,
                   0xE70, 0xE7C, 0xE7E, 0xE89, 0xE8A, 0xE91, 0xE99, 0xE9F, 0xEA2, 0xEA4, 0xEA6, 0xEA7, 0xEA9)
_DIGIT_WEIGHTS = (0xD03, 0xD1A, 0xD1C, 0xD1E, 0xD20, 0xD22, 0xD24, 0xD26, 0xD28, 0xD2A)
# second level: only these weigh anything
_SECOND = {"'": 0x8012, "-": 0x8212}


def _first_weights() -> Tuple[int, ...]:
    table = [0] * 128
    for char, weight in _PUNCT_WEIGHTS.items():
        table[ord(char)] = weight
    for offset, weight in enumerate(_LETTER_WEIGHTS):
        table[ord("a") + offset] = table[ord("A") + offset] = weight
    for offset, weight in enumerate(_DIGIT_WEIGHTS):
        table[ord("0") + offset] = weight
    return tuple(table)


_FIRST = _first_weights()


def _compare(left: str, right: str) -> int:
    """-1, 0 or 1: ``left`` against ``right`` in the service's header-name collation."""
    first_left = [_FIRST[ord(c)] for c in left if _FIRST[ord(c)]]
    first_right = [_FIRST[ord(c)] for c in right if _FIRST[ord(c)]]
    if first_left != first_right:
        return -1 if first_left < first_right else 1
    i = j = 0  # second level: walked side by side; the side that skips a weightless character first is less
    while True:
        if i != j:
            return -1 if i > j else 1
        w1 = _SECOND.get(left[i], 0) if i < len(left) else 1
        w2 = _SECOND.get(right[j], 0) if j < len(right) else 1
        if w1 == 1 and w2 == 1:
            return 0
        if w1 == w2:
            i, j = i + 1, j + 1
        elif w1 == 0:
            i += 1
        elif w2 == 0:
            j += 1
        else:
            return -1 if w1 < w2 else 1


_ORDERS: Dict[Tuple[str, ...], Tuple[str, ...]] = {}  # a pure memo: the few name sets a backend sends


def ordered(names: Sequence[str]) -> Tuple[str, ...]:
    """``names`` (lower-case ``x-ms-*`` names) in the service's order."""
    key = tuple(names)
    found = _ORDERS.get(key)
    if found is None:
        from functools import cmp_to_key
        found = tuple(sorted(key, key=cmp_to_key(_compare)))
        if len(_ORDERS) < 256:
            _ORDERS[key] = found
    return found


def _decoded(value: str) -> str:
    if "%" not in value:
        return value
    from urllib.parse import unquote
    return unquote(value)


def string_to_sign(account: str, method: str, path: str, query: str, headers: Sequence[Tuple[str, str]],
                   content_length: int) -> str:
    """The string to sign for a request to ``path`` (encoded, as sent) with ``query`` (encoded,
    as sent, without ``?``), ``headers`` (as sent, Content-Length aside) and a body of
    ``content_length`` bytes."""
    standard: Dict[str, str] = {}
    x_ms: Dict[str, str] = {}
    for name, value in headers:
        lower = name.lower()
        if lower.startswith("x-ms-"):
            x_ms[lower] = value
        elif value:
            standard[lower] = value
    if content_length:
        standard["content-length"] = str(content_length)
    parts: List[str] = [method, *(standard.get(name, "") for name in _STANDARD)]
    parts += [f"{name}:{x_ms[name]}" for name in ordered(list(x_ms))]
    resource = f"/{account}{path}"
    if query:
        pairs = sorted(item.partition("=")[::2] for item in query.split("&"))
        resource += "".join(f"\n{name.lower()}:{_decoded(value)}" for name, value in pairs)
    parts.append(resource)
    return "\n".join(parts)


class SharedKey:
    """Signs requests for one storage account with its key (base64, as Azure prints keys)."""

    def __init__(self, account: str, key: str) -> None:
        try:
            self._key = binascii.a2b_base64(key.strip())
        except binascii.Error:
            raise ConfigError(f"the account key of storage account {account!r} is not base64", operation="credentials") \
                from None
        if not self._key:
            raise ConfigError(f"the account key of storage account {account!r} is empty", operation="credentials")
        self.account = account

    def __repr__(self) -> str:  # never the key
        return f"SharedKey(account={self.account!r})"

    def authorization(self, method: str, path: str, query: str, headers: Sequence[Tuple[str, str]],
                      content_length: int) -> str:
        """The ``Authorization`` value for the request (see :func:`string_to_sign`)."""
        text = string_to_sign(self.account, method, path, query, headers, content_length)
        signature = binascii.b2a_base64(hmac_sha256(self._key, text.encode("utf-8")), newline=False).decode()
        return f"SharedKey {self.account}:{signature}"
