"""Transfer-attempt records read back from a Pegasus submit directory or multipart files.

Both the drop-in and stock ``pegasus-transfer`` write every attempt as a ``- transfer_attempts:``
YAML document (see `pegasus_cloudio.dropin.monitoring`); PegasusLite appends it to the job's
``.out`` file in the submit directory. `read_usage` finds those documents in every file under
the given paths and adds up, per (site, job type), the requests and bytes they stand for: a
download from a store is one GET (class B), an upload one PUT (class A); failed attempts
count too, because they were billed.

Limits: the records are per logical file, so they cannot see requests a client saves or adds
underneath (bundles: one PUT for many files; multipart uploads: several). Counting at the
store or at a proxy sees those; the benchmark report does both.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from transfer.lean import record

__all__ = ["Attempt", "Usage", "parse_attempts", "job_type", "read_usage"]

_HEADER = "- transfer_attempts:"
_FIELD = re.compile(r"^ {2}(?:- | {2})(\w+): (.*)$")
_JOB_SUFFIX = re.compile(r"(\.out(\.\d+)?|\.err(\.\d+)?)$")
_ID_SUFFIX = re.compile(r"(_ID\d+|(_\d+)+)$")
_ESCAPE = re.compile(r'\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|.)')


@record(frozen=True)
class Attempt:
    src_url: str
    src_label: str
    dst_url: str
    dst_label: str
    success: bool
    bytes: int


@record
class Usage:
    """Requests and bytes of one (site, job type)."""

    class_a: int = 0
    class_b: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    attempts: int = 0
    failed: int = 0

    def add(self, other: "Usage") -> None:
        self.class_a += other.class_a
        self.class_b += other.class_b
        self.bytes_up += other.bytes_up
        self.bytes_down += other.bytes_down
        self.attempts += other.attempts
        self.failed += other.failed


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        return text

    def one(match: "re.Match[str]") -> str:
        code = match.group(1)
        return chr(int(code[1:], 16)) if code[0] in "xu" and len(code) > 1 else code

    return _ESCAPE.sub(one, text[1:-1])


def parse_attempts(text: str) -> Iterator[Attempt]:
    """Every attempt of every ``transfer_attempts`` document in ``text``."""
    inside = False
    current: Optional[Dict[str, str]] = None
    for line in text.splitlines():
        if line.rstrip() == _HEADER:
            inside, current = True, None
            continue
        match = _FIELD.match(line) if inside else None
        if match is None:
            if current is not None:
                yield _attempt(current)
            inside, current = False, None
            continue
        if line.startswith("  - "):
            if current is not None:
                yield _attempt(current)
            current = {}
        if current is not None:
            current[match.group(1)] = _unquote(match.group(2))
    if current is not None:
        yield _attempt(current)


def _attempt(fields: Dict[str, str]) -> Attempt:
    return Attempt(fields.get("src_url", ""), fields.get("src_label", ""), fields.get("dst_url", ""),
                   fields.get("dst_label", ""), fields.get("success") == "True", int(fields.get("bytes", "0") or 0))


def job_type(path: str) -> str:
    """The job type a submit-dir file belongs to: ``project_ID0000001.out.000`` -> ``project``."""
    name = _JOB_SUFFIX.sub("", os.path.basename(path))
    if re.fullmatch(r"\d+-transfer.*", name):
        return "(multipart file)"
    return _ID_SUFFIX.sub("", name) or name


def _remote(url: str) -> bool:
    return not url.startswith(("file:", "symlink:", "moveto:"))


def usage_of(attempts: Iterable[Attempt]) -> Dict[str, Usage]:
    """Per site label: the requests and bytes ``attempts`` stand for."""
    sites: Dict[str, Usage] = {}
    for a in attempts:
        for url, label, upload in ((a.src_url, a.src_label, False), (a.dst_url, a.dst_label, True)):
            if not _remote(url):
                continue
            usage = sites.setdefault(label or "(no label)", Usage())
            usage.attempts += 1
            usage.failed += 0 if a.success else 1
            if upload:
                usage.class_a += 1
                usage.bytes_up += a.bytes
            else:
                usage.class_b += 1
                usage.bytes_down += a.bytes
    return sites


def _files(paths: Iterable[str]) -> Iterator[str]:
    for path in paths:
        if os.path.isdir(path):
            for folder, _, names in os.walk(path):
                for name in sorted(names):
                    yield os.path.join(folder, name)
        else:
            yield path


def read_usage(paths: Iterable[str]) -> Tuple[Dict[Tuple[str, str], Usage], int]:
    """((site, job type) -> usage, number of files with records) over every file under ``paths``.

    Files that are not text or hold no records are skipped. Raises OSError when a named path
    does not exist.
    """
    totals: Dict[Tuple[str, str], Usage] = {}
    with_records = 0
    for path in _files(paths):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file or directory")
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        if _HEADER not in text:
            continue
        with_records += 1
        kind = job_type(path)
        for site, usage in usage_of(parse_attempts(text)).items():
            totals.setdefault((site, kind), Usage()).add(usage)
    return totals, with_records


def as_rows(totals: Dict[Tuple[str, str], Usage]) -> List[Dict[str, Any]]:
    return [{"site": site, "job_type": kind, "class_a": u.class_a, "class_b": u.class_b, "bytes_up": u.bytes_up,
             "bytes_down": u.bytes_down, "attempts": u.attempts, "failed": u.failed}
            for (site, kind), u in sorted(totals.items())]
