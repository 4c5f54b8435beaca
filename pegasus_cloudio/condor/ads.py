"""ClassAds in and out, the way ``condor_starter`` writes and reads them.

* Input (``-infile``): new-format ads back to back, parsed with a full ClassAd parser
  (``classad2``); attribute names in any case, values may be expressions. The whole request
  must be read: ``classad2`` stops silently at text it cannot parse, so the input is first
  cut at its top-level brackets and every piece must be exactly one ad; an empty input, a
  truncated last ad or stray text is a :class:`ValueError` (the plugin then exits non-zero
  and the job is held, never run without its inputs). An ad with
  neither ``Url`` nor ``LocalFileName`` is a protocol-v4 non-file ad (``PluginData``...) and
  gets no result ad; an ad with only one of them, or non-string values, is a malformed file
  ad that gets a failed result ad.
* Query (``-classad``): old one-line ``Name = expr`` format on stdout.
* Output (``-outfile``): one new-format ad per line. The starter pre-fills the file with
  spaces (23.4+) so a plugin that fills the disk can still report; :class:`ResultWriter`
  therefore opens it without truncating, writes each ad as soon as it is known, flushes,
  and truncates the leftover only at the end.

``classad2`` is imported on first use; :class:`BindingsMissing` says how to install it.
"""

from __future__ import annotations

import errno
import os
from types import ModuleType
from typing import IO, Any, Dict, List, Optional

from transfer.lean import record

_STALE_CHECK_LIMIT = 1 << 20


class BindingsMissing(RuntimeError):
    """The HTCondor Python bindings (``classad2``) cannot be imported."""


def classad() -> ModuleType:
    """The ``classad2`` module, or BindingsMissing with a one-line fix."""
    try:
        import classad2  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError as err:
        raise BindingsMissing(f"the HTCondor Python bindings are missing ({err}); install them on the "
                              "execute node with: pip install 'pegasus-cloudio[condor]' "
                              "(the htcondor package, module classad2)") from None
    module: ModuleType = classad2
    return module


@record(frozen=True)
class FileAd:
    """One file of the batch: ``url`` and ``local`` verbatim, or ``problem`` if unusable."""

    url: str
    local: str
    problem: Optional[str] = None


def query_ad_text(fields: Dict[str, Any]) -> str:
    """The ``-classad`` answer: one ``Name = value`` line per attribute."""
    text: str = classad().ClassAd(fields).printOld()
    return text if text.endswith("\n") else text + "\n"


def split_ads(text: str) -> List[str]:
    """The top-level ``[ ... ]`` pieces of ``text``; ValueError unless they cover all of it.

    Brackets inside string literals and quoted attribute names (``"..."``, ``'...'``, with
    backslash escapes) do not count. Only whitespace may lie between and around the pieces.
    """
    pieces: List[str] = []
    depth, start, quote, i = 0, -1, "", 0
    while i < len(text):
        char = text[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "\"'" and depth:
            quote = char
        elif char == "[":
            start = i if depth == 0 else start
            depth += 1
        elif char == "]" and depth:
            depth -= 1
            if depth == 0:
                pieces.append(text[start:i + 1])
        elif depth == 0 and not char.isspace():
            raise ValueError(f"unexpected text at character {i + 1}, outside any ad")
        i += 1
    if depth or quote:
        raise ValueError(f"the input ends inside ad {len(pieces) + 1} (truncated)")
    if not pieces:
        raise ValueError("the input holds no ads (empty)")
    return pieces


def read_file_ads(text: str) -> List[FileAd]:
    """Every file ad of a concatenated input, in order; ValueError unless all of it parses
    and at least one file ad is there (the starter never asks for nothing).

    ``text`` is the input decoded with ``errors="surrogateescape"``: the starter writes a
    name's bytes as they are, and a ``Url`` or ``LocalFileName`` that is not UTF-8 makes that
    file ad a malformed one naming the value (its bytes as ``\\xNN``), not the whole input."""
    module = classad()
    files = []
    for number, piece in enumerate(split_ads(text), 1):
        marked = piece.translate(_MARK_BYTES)
        parsed = list(module.parseAds(marked, module.ParserType.New))
        if len(parsed) != 1:
            raise ValueError(f"ad {number} does not parse")
        ad = parsed[0]
        has_url, has_local = "Url" in ad, "LocalFileName" in ad
        if not has_url and not has_local:
            continue  # a v4 non-file ad (PluginData, <scheme>_PluginData)
        url = ad.eval("Url") if has_url else None
        local = ad.eval("LocalFileName") if has_local else None
        problem = None
        if not isinstance(url, str) or not url:
            problem = "the input ad has no string Url"
        elif not isinstance(local, str) or not local:
            problem = "the input ad has no string LocalFileName"
        if marked != piece:  # (only then: a name may hold the private-use characters themselves)
            shown_url, shown_local = _escaped(url), _escaped(local)
            if problem is None and shown_url != url:
                problem = f"the input ad's Url {shown_url} is not UTF-8"
            elif problem is None and shown_local != local:
                problem = f"the input ad's LocalFileName {shown_local} is not UTF-8 (name the file in UTF-8)"
            url, local = shown_url, shown_local
        files.append(FileAd(url if isinstance(url, str) else "", local if isinstance(local, str) else "",
                            problem))
    if not files:
        raise ValueError("the input holds no file ads (no Url/LocalFileName)")
    return files


# A byte that is not UTF-8 reaches us as a lone surrogate (U+DC80..U+DCFF), which the ClassAd
# parser cannot take: it goes through as a private-use character and comes back as \xNN.
_MARK = 0xF700
_MARK_BYTES = {0xDC00 + b: _MARK + b for b in range(0x80, 0x100)}
_ESCAPES = {_MARK + b: f"\\x{b:02x}" for b in range(0x80, 0x100)}


def _escaped(value: Any) -> str:
    """A string value with the bytes that were not UTF-8 as ``\\xNN``; "" for a non-string."""
    return value.translate(_ESCAPES) if isinstance(value, str) else ""


def format_result(fields: Dict[str, Any]) -> str:
    """One result ad on one line (``[ a = 1; ... ]``)."""
    return repr(classad().ClassAd(fields))


def _open_result_file(path: str) -> int:
    """A read-write descriptor of the regular file ``path``, created if missing, never
    truncated. The file lies in the job's sandbox, which the job may leave a FIFO or a link
    in: those are :class:`~transfer.named_files.UnsafeFile` naming ``path`` (an ``OSError``),
    as every file someone else names is refused, and no write goes through a link."""
    from transfer.named_files import FLAGS, UnsafeFile, check_regular
    flags = FLAGS | os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW  # FLAGS' O_RDONLY is 0
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        reason = "a symbolic link (not followed)" if err.errno == errno.ELOOP else err.strerror or str(err)
        raise UnsafeFile(path, reason, err.errno or 0) from None
    problem = check_regular(os.fstat(fd))
    if problem:
        os.close(fd)
        raise UnsafeFile(path, problem)
    return fd


class ResultWriter:
    """Writes result ads to the starter's ``-outfile`` (:attr:`path`) as they become known.

    Keeps the starter's pre-allocation (opened ``r+``, created if missing); stale ads left by
    an EP older than 23.4 (which reused the file) are cleared first. ``write`` and ``rewrite``
    raise OSError when the file cannot be written. ``close`` truncates what is left of the
    padding; it raises OSError only for an error not raised before (one that closing the file
    reveals), so the owner reports each failure once.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        # errors="replace": stale text another plugin left need not be UTF-8; our ads always are
        self._file: IO[str] = open(_open_result_file(path), "r+", encoding="utf-8", errors="replace")
        self.count = 0
        self._failed = False  # a write raised: its ad is still in the buffer, and fails again on close
        self._clear_stale()

    def _clear_stale(self) -> None:
        size = os.fstat(self._file.fileno()).st_size
        if size == 0:
            return
        if size > _STALE_CHECK_LIMIT or self._file.read(size).strip():
            self._file.seek(0)
            self._file.truncate()
        self._file.seek(0)

    def write(self, fields: Dict[str, Any]) -> None:
        try:
            self._file.write(format_result(fields) + "\n")
            self._file.flush()
        except OSError:
            self._failed = True
            raise
        self.count += 1

    def rewrite(self, fields: Dict[str, Any]) -> None:
        """Replace every ad written so far with this one (the file then holds exactly one ad)."""
        try:
            self._file.seek(0)
            self._file.write(format_result(fields) + "\n")
            self._file.truncate()
            self._file.flush()
        except OSError:
            self._failed = True
            raise
        self.count = 1

    def close(self) -> None:
        try:
            self._file.truncate()
        except OSError:
            pass  # leftover spaces are whitespace to the starter's parser
        try:
            self._file.close()  # closes the descriptor even when the flush before it fails
        except OSError:
            if not self._failed:
                raise
