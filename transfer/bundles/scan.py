"""Reading a bundle index row by row from chunks of bytes, without holding the whole text.

The index is ``{"format": 1, "members": [row, ...]}`` (other keys are skipped). A million-row
index is ~100 MB of JSON; :func:`index_rows` decodes it through a sliding window of a few
KiB of text, one row at a time, so peak memory does not grow with the text.
"""

from __future__ import annotations

import codecs

from transfer.lean import Buffer
from transfer.lean_json import raw_decode
from transfer.errors import ChecksumMismatch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, Iterator

FORMAT = 1
WINDOW = 64 << 10  # text kept ahead of the cursor: far more than any valid row (names <= 1 KiB)
_SPACE = " \t\n\r"


class IndexSyntaxError(ChecksumMismatch):
    """The index text is not the JSON of format 1 (subclassed by BundleFormatError's users)."""


def index_rows(chunks: Iterable[Buffer], max_rows: int) -> Iterator[object]:
    """The decoded rows, in order; raises IndexSyntaxError for anything but format 1."""
    scanner = _Scanner(chunks)
    scanner.expect("{")
    seen_format = seen_members = False
    first = True
    while not scanner.peek("}"):
        if not first:
            scanner.expect(",")
        first = False
        key = scanner.value()
        scanner.expect(":")
        if key == "members":
            yield from _members(scanner, max_rows)
            seen_members = True
        elif key == "format":
            if scanner.value() != FORMAT:
                raise IndexSyntaxError("bundle index is not of format 1")
            seen_format = True
        else:
            scanner.value()
    scanner.end()
    if not (seen_format and seen_members):
        raise IndexSyntaxError("bundle index is not valid JSON of format 1 (no format or member list)")


def _members(scanner: "_Scanner", max_rows: int) -> Iterator[object]:
    scanner.expect("[")
    count = 0
    while not scanner.peek("]"):
        if count:
            scanner.expect(",")
        count += 1
        if count > max_rows:
            raise IndexSyntaxError(f"bundle index has more than {max_rows} members (the limit)")
        yield scanner.value()


class _Scanner:
    """Just enough of a JSON tokenizer to walk one object, over a sliding window of text."""

    def __init__(self, chunks: Iterable[Buffer]) -> None:
        self._chunks = iter(chunks)
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._text, self._pos, self._done = "", 0, False

    def _fill(self) -> None:
        while not self._done and len(self._text) - self._pos < WINDOW:
            chunk = next(self._chunks, None)
            try:
                more = self._decoder.decode(bytes(chunk) if chunk is not None else b"", final=chunk is None)
            except UnicodeDecodeError:
                raise IndexSyntaxError("bundle index is not UTF-8") from None
            self._done = chunk is None
            self._text, self._pos = self._text[self._pos:] + more, 0

    def _skip(self) -> None:
        self._fill()
        text, pos = self._text, self._pos
        end = len(text)
        while pos < end and text[pos] in _SPACE:
            pos += 1
        self._pos = pos
        self._fill()

    def peek(self, char: str) -> bool:
        self._skip()
        if self._pos >= len(self._text):
            raise IndexSyntaxError("bundle index is not valid JSON of format 1 (truncated)")
        if self._text[self._pos] == char:
            self._pos += 1
            return True
        return False

    def expect(self, char: str) -> None:
        if not self.peek(char):
            raise IndexSyntaxError(f"bundle index is not valid JSON of format 1 (expected {char!r})")

    def value(self) -> object:
        self._skip()
        try:
            found, self._pos = raw_decode(self._text, self._pos)
        except (ValueError, RecursionError):
            raise IndexSyntaxError("bundle index is not valid JSON of format 1") from None
        return found

    def end(self) -> None:
        self._skip()
        if self._pos != len(self._text):
            raise IndexSyntaxError("bundle index has trailing bytes")
