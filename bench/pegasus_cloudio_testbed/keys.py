"""A reproducible corpus of awkward S3 object keys.

Every key is a legal S3 key (1-1,024 bytes of UTF-8, no control characters, which S3
allows but XML 1.0 bodies cannot carry) and the corpus deliberately includes: spaces,
``+ ~ % = & ? # ! ' ( ) * , ; : @ $ [ ]``, percent signs that look like escapes (``%2F``,
``%25``), ``//`` runs, leading and trailing ``/``, dot segments, non-ASCII letters in several
scripts, combining marks, emoji (4-byte UTF-8) and keys of exactly 1,024 bytes.
"""

from __future__ import annotations

import random
from typing import List

__all__ = ["key_corpus", "MAX_KEY_BYTES"]

MAX_KEY_BYTES = 1024

_FIXED = [
    "plain.txt", "with space.txt", "plus+sign", "tilde~name", "percent%name", "looks%2Fescaped",
    "double%25", "eq=amp&q?hash#x", "a//b", "a///b//", "trailing/", "/leading", "//two-leading",
    "dir/./dot", "dir/../up", "..", ".", "ümlaut/ñ/ß", "日本語/ファイル", "emoji/🚀🌍", "e\u0301-combining",
    "quote'\"", "bang!star*(paren)", "semi;colon:at@dollar$", "brackets[]{}", "comma,caret^", "back\\slash",
    "pipe|lt<gt>", "`tick`", " leading-space", "trailing-space ", "tab-free but  two  spaces",
]
_ALPHABET = (
    "abcxyzABCXYZ0189" "-_.!*'()" " +~%=&?#;:@$,/" "äöüßéñçøåØ" "日本語中文한국어" "ΑΒΓαβγ" "🚀🌍😀"
)


def key_corpus(count: int = 1400, seed: int = 11) -> List[str]:
    """``count`` distinct keys: the fixed hard cases, four 1,024-byte keys, then random ones."""
    rng = random.Random(seed)
    keys = list(_FIXED)
    keys += [_exactly(MAX_KEY_BYTES, filler) for filler in ("k", "é", "日", "🚀")]
    seen = set(keys)
    while len(keys) < count:
        length = rng.choice((1, 2, 5, 12, 40, 120, 300))
        key = "".join(rng.choice(_ALPHABET) for _ in range(length))
        if rng.random() < 0.15:
            key = key.replace("/", "//")
        if len(key.encode()) <= MAX_KEY_BYTES and key not in seen:
            seen.add(key)
            keys.append(key)
    return keys[:count]


def _exactly(size: int, filler: str) -> str:
    """A key of exactly ``size`` UTF-8 bytes made of ``filler`` padded with ASCII."""
    unit = len(filler.encode())
    body = filler * (size // unit)
    return body + "x" * (size - len(body.encode()))


def minio_accepts(key: str) -> bool:
    """Whether a single-drive MinIO can store ``key``: it maps keys to file paths, so it refuses
    ``//``, ``.``/``..`` segments and segments over 255 bytes, and a key ending in ``/`` names
    a directory. (Amazon and moto take them all; the conformance suite covers them.)"""
    segments = key.split("/")
    return (not key.startswith("/") and not key.endswith("/") and "//" not in key
            and all(s not in (".", "..") and len(s.encode()) <= 255 for s in segments))


def minio_subset(keys: List[str]) -> List[str]:
    """The keys MinIO stores faithfully together: those it accepts, minus any key below
    another key (``a`` and ``a/b``: MinIO answers 200 to the second PUT and drops it)."""
    accepted = [k for k in keys if minio_accepts(k)]
    names = set(accepted)
    return [k for k in accepted
            if not any("/".join(k.split("/")[:i]) in names for i in range(1, k.count("/") + 1))]
