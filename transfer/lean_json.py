"""JSON for the job step's hot path, without importing :mod:`json`.

``import json`` imports ``json.decoder`` and ``json.encoder``, and both import ``re`` and compile
their patterns: several milliseconds of every job step that reads a cache entry's metadata or
a bundle index. The parsing and string quoting are done by the same C functions :mod:`json`
uses (``_json.make_scanner``, ``_json.encode_basestring_ascii``), so the results are exactly
``json.loads``'s and ``json.dumps``'s for the values these functions take
(``tests/test_lean_replacements.py`` compares them on random documents):

* :func:`loads` and :func:`raw_decode`: ``json.loads`` / ``JSONDecoder().raw_decode`` with the
  default options. Text that does not parse raises :class:`ValueError` (``loads`` then asks
  ``json`` itself, so the message is ``json``'s).
* :func:`dumps`: ``json.dumps`` with the default ``ensure_ascii`` and ``allow_nan``, for
  ``dict`` (``str`` keys), ``list``, ``tuple``, ``str``, ``int``, ``float``, ``bool`` and
  ``None``; anything else is a :class:`TypeError`.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, Tuple, Union

    # How _emit writes: (quote a str, sort object keys, item separator, key separator).
    _Style = Tuple[Callable[[str], str], bool, str, str]

__all__ = ["dumps", "loads", "raw_decode"]


class _Decoding:
    """What the C scanner reads from its decoder object: ``json.loads``'s defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:
        return float(name.replace("Infinity", "inf"))  # NaN, Infinity, -Infinity


_scanner: "Optional[Callable[[str, int], Tuple[Any, int]]]" = None
_WHITESPACE = " \t\n\r"


def _scan() -> "Callable[[str, int], Tuple[Any, int]]":
    global _scanner
    if _scanner is None:
        import _json
        _scanner = _json.make_scanner(_Decoding())  # type: ignore[arg-type]  # a duck-typed decoder
    return _scanner


def raw_decode(text: str, pos: int = 0) -> "Tuple[Any, int]":
    """The JSON value starting at ``text[pos]`` (no whitespace skipped) and the index after it."""
    try:
        return _scan()(text, pos)
    except (StopIteration, SystemError, RecursionError):
        # the scanner raises JSONDecodeError only once json.decoder is imported; before that,
        # CPython 3.11's fails with SystemError
        raise ValueError(f"not a JSON value at character {pos}") from None


def loads(data: "Union[str, bytes]") -> "Any":
    """``json.loads(data)``; bytes are read as UTF-8 (with or without a BOM: ``json`` then asks)."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        start = len(text) - len(text.lstrip(_WHITESPACE))
        value, end = raw_decode(text, start)
        if not text[end:].strip(_WHITESPACE) and not text.startswith("\ufeff"):
            return value
    except ValueError:
        pass
    import json  # not JSON (or an encoding json detects): its own answer and exact error
    return json.loads(data)


def dumps(value: "Any", *, sort_keys: bool = False, separators: "Tuple[str, str]" = (", ", ": ")) -> str:
    """``json.dumps(value, sort_keys=sort_keys, separators=separators)`` for plain values."""
    import _json
    parts: "list[str]" = []
    _emit(value, 0, parts, (_json.encode_basestring_ascii, sort_keys, separators[0], separators[1]))
    return "".join(parts)


def _emit(obj: "Any", depth: int, parts: "list[str]", style: "_Style") -> None:
    """Append the JSON text of ``obj``, ``depth`` levels deep, to ``parts`` (as :func:`dumps`;
    ValueError past 200 levels)."""
    if depth > 200:
        raise ValueError("JSON value nested too deeply")
    if isinstance(obj, str):
        parts.append(style[0](obj))
    elif obj is None:
        parts.append("null")
    elif obj is True:
        parts.append("true")
    elif obj is False:
        parts.append("false")
    elif isinstance(obj, int):
        parts.append(int.__repr__(obj))
    elif isinstance(obj, float):
        parts.append(_float(obj))
    elif isinstance(obj, (list, tuple)):
        _emit_array(obj, depth + 1, parts, style)
    elif isinstance(obj, dict):
        _emit_object(obj, depth + 1, parts, style)
    else:
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def _emit_array(items: "Any", depth: int, parts: "list[str]", style: "_Style") -> None:
    """:func:`_emit` for a list or tuple."""
    parts.append("[")
    for n, item in enumerate(items):
        if n:
            parts.append(style[2])
        _emit(item, depth, parts, style)
    parts.append("]")


def _emit_object(obj: "dict[Any, Any]", depth: int, parts: "list[str]", style: "_Style") -> None:
    """:func:`_emit` for a dict (``str`` keys only)."""
    if not all(isinstance(k, str) for k in obj):
        raise TypeError("JSON object keys must be str here")
    quote, sort_keys, item_separator, key_separator = style
    parts.append("{")
    for n, key in enumerate(sorted(obj) if sort_keys else obj):
        if n:
            parts.append(item_separator)
        parts.append(quote(key))
        parts.append(key_separator)
        _emit(obj[key], depth, parts, style)
    parts.append("}")


def _float(number: float) -> str:
    if number != number:
        return "NaN"
    if number in (float("inf"), float("-inf")):
        return "Infinity" if number > 0 else "-Infinity"
    return float.__repr__(number)
