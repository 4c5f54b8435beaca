"""Machine-read monitoring output of pegasus-transfer 5.1.3 (spec section 1.8).

Two artefacts are read back by Pegasus and must stay byte-compatible with the stock tool:

* the ``- transfer_attempts:`` multipart YAML written into ``$PEGASUS_MULTIPART_DIR``
  (PegasusLite cats it onto the job's stdout, ``Pegasus.tools.kickstart_parser`` parses
  it, pegasus-monitord stores it), and
* the ``@@@MONITORING_PAYLOAD`` ``int.metric`` line logged per linkage after remote
  checksum verification (pegasus-monitord turns it into integrity metrics).

The stock writer (``Stats.add_stats`` / ``Stats.stats_summary`` in ``Pegasus/transfer.py``)
formats YAML by hand. This module reproduces that text exactly, with two deliberate
differences, both limited to inputs on which the stock output is broken:

* quoted strings are YAML-escaped (``\\`` ``"`` and control characters); the stock tool
  pastes them raw, so a URL containing ``"`` or ``\\`` made the whole record unparseable;
* the output file never overwrites an existing one (the stock tool reuses
  ``<epoch>-transfer`` and loses the first run's record when two runs share a second).

Nothing here prints or logs; callers log the payload line themselves.
"""

from __future__ import annotations

import itertools
import os
import time
from transfer.lean import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, Iterator, Optional

__all__ = [
    "AttemptRecord",
    "integrity_payload_line",
    "stock_label",
    "transfer_attempts_yaml",
    "write_transfer_attempts",
    "yaml_quote",
]

PAYLOAD_START = "@@@MONITORING_PAYLOAD - START@@@"
PAYLOAD_END = "@@@MONITORING_PAYLOAD - END@@@"

_temp_counter = itertools.count()  # unique temp names within this process; no other state
_EXCL_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


@record(frozen=True)
class AttemptRecord:
    """One transfer attempt, failed or not, as the stock tool records it.

    Fields:
        src_url, dst_url: the URLs in the stock ``PegasusURL.get_url()`` form (for file
            URLs ``file://`` + the env-expanded path; ``file://localhost/x`` -> ``file:///x``).
        src_label, dst_label: site labels. Written with ``-`` turned into ``_`` as the stock
            tool does (it normalises labels when parsing); ``None`` is written as ``""``.
        success: outcome of this attempt.
        start: epoch seconds when the attempt started.
        duration: seconds the attempt took.
        lfn: logical file name; omitted from the YAML when ``None`` or empty.
        bytes: size of the local end (source if it is ``file``, else destination) as
            ``os.stat`` saw it after the attempt, 0 if unknown. Failed attempts count too.
        local_file: True when the source or destination scheme is exactly ``file``
            (not ``symlink``/``moveto``); False marks a third-party transfer, which
            suppresses the stats summary (see ``stats.format_stats``).
    """

    src_url: str
    src_label: Optional[str]
    dst_url: str
    dst_label: Optional[str]
    success: bool
    start: float
    duration: float
    lfn: Optional[str]
    bytes: int
    local_file: bool


def stock_label(label: Optional[str]) -> str:
    """Return ``label`` as the stock tool stores it: ``-`` -> ``_``, ``None`` -> ``""``."""
    return "" if label is None else label.replace("-", "_")


def yaml_quote(text: str) -> str:
    """Return ``text`` as a YAML double-quoted scalar.

    Identical to the stock ``'"%s"' % text`` for every string that needs no escaping;
    ``\\``, ``"`` and the characters YAML forbids in a stream (C0/C1 controls, DEL, lone
    surrogates from undecodable path bytes, U+FFFE/U+FFFF) are escaped so that the value
    round-trips instead of breaking the parser.
    """
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'  # the common case, without looking at each character
    return '"' + "".join(map(_escape_char, text)) + '"'


def _escape_char(char: str) -> str:
    if char == "\\" or char == '"':
        return "\\" + char
    code = ord(char)
    if code == 0x09:  # a raw tab is valid inside double quotes; keep the stock bytes
        return char
    if code < 0x20 or 0x7F <= code <= 0x9F:
        return "\\x%02x" % code
    if 0xD800 <= code <= 0xDFFF or code in (0xFFFE, 0xFFFF):
        return "\\u%04x" % code
    return char


def _attempt_entry(record: AttemptRecord) -> str:
    """One list item of ``transfer_attempts``, formatted like ``Stats.add_stats``."""
    text = (
        "  - src_url: %s\n"
        "    src_label: %s\n"
        "    dst_url: %s\n"
        "    dst_label: %s\n"
        "    success: %s\n"
        "    start: %.0f\n"
        "    duration: %.1f\n"
    ) % (
        yaml_quote(record.src_url),
        yaml_quote(stock_label(record.src_label)),
        yaml_quote(record.dst_url),
        yaml_quote(stock_label(record.dst_label)),
        str(bool(record.success)),
        record.start,
        record.duration,
    )
    if record.lfn:
        text += "    lfn: %s\n" % yaml_quote(record.lfn)
    if record.local_file and record.bytes > 0:
        text += "    bytes: %d\n" % record.bytes
    return text


def transfer_attempts_yaml(records: Iterable[AttemptRecord]) -> str:
    """Return the multipart ``- transfer_attempts:`` document for ``records``, in order.

    With no records this is just the header line, which is what the stock tool writes
    for a run without transfers.
    """
    return "- transfer_attempts:\n" + "".join(_attempt_entry(r) for r in records)


def write_transfer_attempts(directory: str, records: Iterable[AttemptRecord]) -> str:
    """Write ``transfer_attempts_yaml(records)`` to a new file in ``directory``; return its path.

    The name is ``<int(time.time())>-transfer`` when free, else
    ``<epoch>-transfer-<pid>-<n>`` for the first free ``n >= 1`` (PegasusLite includes
    the files sorted by name, so the plain name still sorts first). The text goes to a
    hidden temp file first (``ls`` in PegasusLite skips dot files) and is hard-linked
    into place, which fails instead of overwriting; the temp file is always removed.
    Raises OSError when the directory is not writable.
    """
    from transfer.atomic import write_all
    data = transfer_attempts_yaml(records).encode("utf-8", "backslashreplace")
    base = "%d-transfer" % int(time.time())
    temp = os.path.join(directory, ".%s.%d.%d.part" % (base, os.getpid(), next(_temp_counter)))
    fd = os.open(temp, _EXCL_FLAGS, 0o666)  # 0o666 & ~umask, like the stock open(..., "w")
    try:
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        return _publish(temp, directory, _candidate_names(base))
    finally:
        _unlink_quietly(temp)


def _candidate_names(base: str) -> Iterator[str]:
    yield base
    for n in itertools.count(1):
        yield "%s-%d-%d" % (base, os.getpid(), n)


def _publish(temp: str, directory: str, names: Iterator[str]) -> str:
    """Give ``temp`` the first free name; never replaces an existing file."""
    for name in names:
        target = os.path.join(directory, name)
        try:
            os.link(temp, target)
            return target
        except FileExistsError:
            continue
        except OSError:
            # Filesystems without hard links: check-then-rename is the best available.
            if os.path.lexists(target):
                continue
            os.replace(temp, target)
            return target
    raise AssertionError("unreachable: the name generator is infinite")



def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def integrity_payload_line(
    file_type: Optional[str],
    succeeded: int,
    failed: int,
    duration: float,
    ts: Optional[int] = None,
    *,
    event: str = "check",
) -> str:
    """Return the ``int.metric`` line the stock tool logs (at INFO) for one linkage.

    ``file_type`` is the transfer's linkage; empty or ``None`` becomes ``"unknown"`` as in
    ``Stats.add_integrity_verify``. ``duration`` is the summed verification time in
    seconds and is emitted as a string with 3 decimals, exactly like the stock tool.
    ``ts`` defaults to ``int(time.time())``. ``event="compute"`` is the variant the stock
    code defines but never emits in 5.1.3. Key order and ``json.dumps`` separators match.
    """
    data = {
        "ts": int(time.time()) if ts is None else int(ts),
        "monitoring_event": "int.metric",
        "payload": [
            {
                "event": event,
                "file_type": file_type or "unknown",
                "succeeded": int(succeeded),
                "failed": int(failed),
                "duration": "%.3f" % duration,
            }
        ],
    }
    import json
    return PAYLOAD_START + json.dumps(data) + PAYLOAD_END
