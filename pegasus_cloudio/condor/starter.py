"""What the plugin knows of the starter that runs it: its HTCondor version.

The starter names its machine ad in ``$_CONDOR_MACHINE_AD`` (every version since 8.x); the ad's
``CondorVersion`` reads ``"$CondorVersion: 23.9.6 2026-07-12 ... $"``. :func:`starter_version`
returns ``(23, 9, 6)``, or None when there is no ad, it cannot be read, or the line is not there.
The ad sits in the job's sandbox, so it is read as :mod:`transfer.named_files` reads files
someone else names (no link, no FIFO, at most 4 MiB: a machine ad is a few KiB); nothing read
is logged.

:func:`reads_one_message_after_failure`: a starter older than 24.4.0 (23.x and the 24.0 LTS
series) reads exactly one message from its transfer process's pipe once that process has exited
with a failure. Every result ad the plugin wrote is one message ahead of the final status, so
with two or more ads the starter may lose the failure's text and hold code: it requeues the job
("reason unknown") instead of holding it, and a job whose input is gone for good runs again and
again. 24.4.0 reads until the final status; 25.0.3 / 24.12.x (HTCONDOR-3327) close the last race.
"""

from __future__ import annotations

from typing import Mapping, Optional, Tuple

from transfer.named_files import NO_LINKS, read_file

MACHINE_AD_VAR = "_CONDOR_MACHINE_AD"
_READ_LIMIT = 4 << 20
_MARK = "$CondorVersion:"

Version = Tuple[int, int, int]


def starter_version(environ: Mapping[str, str]) -> Optional[Version]:
    """The starter's HTCondor version from the machine ad ``$_CONDOR_MACHINE_AD`` names; None if unknown."""
    path = environ.get(MACHINE_AD_VAR)
    if not path:
        return None
    try:  # the job may replace the file in its sandbox: read the safe way, bounded
        text = read_file(path, _READ_LIMIT, NO_LINKS)[0].decode("utf-8", "replace")
    except OSError:
        return None
    at = text.find(_MARK)
    if at < 0:
        return None
    words = text[at + len(_MARK):at + len(_MARK) + 40].split()
    parts = words[0].split(".") if words else []
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def reads_one_message_after_failure(version: Optional[Version]) -> bool:
    """True for a starter older than 24.4.0, and for one whose version is unknown (the safe side)."""
    return version is None or version < (24, 4, 0)
