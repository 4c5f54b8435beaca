"""The cache summary as a file: written by root, published by the startd cron as ``condor``.

HTCondor runs startd cron jobs as its own user (``condor``), which cannot enter users'
private (0700) caches. So the summary is made in two steps:

1. ``pegasus-cloudio cache-summary --write FILE`` runs as root (a systemd timer, see
   ``docs/p2p.md``), reads the served caches without following a link, and replaces FILE
   atomically with the ad (mode 0644: it holds only 6-hex-digit ids, which the machine ad
   publishes to the whole pool anyway).
2. ``pegasus-cloudio cache-summary --read FILE`` is the startd cron: it reads nothing but
   FILE, at most `MAX_BYTES`, refuses a file that root does not own or that others may
   write (whoever could write it could steer other users' jobs), checks that it holds
   only the summary's attributes, and prints it. A missing file, or one older than
   ``--max-age`` seconds (the writer has stopped), prints an empty summary, so a node's
   ad never claims files long after the writer died.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tempfile
import time
from typing import Optional

from transfer.named_files import NO_LINKS, UnsafeFile, is_missing, open_regular, read_fd

__all__ = ["MAX_BYTES", "DEFAULT_MAX_AGE_S", "SummaryFileError", "publish", "published", "warn"]

MAX_BYTES = 4 * 1024 * 1024          # 50,000 ids are ~350 KB
DEFAULT_MAX_AGE_S = 600.0
_LINE = re.compile(r'^(PegasusCloudioCache = "[0-9a-f,]*"|PegasusCloudioCacheFiles = \d+|'
                   r'PegasusCloudioNode = "[A-Za-z0-9_.@:-]*")$')


class SummaryFileError(ValueError):
    """The summary file is unsafe or not a summary; the message names the file."""


def publish(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, mode 0644."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".cache-summary.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def published(path: str, max_age: float = DEFAULT_MAX_AGE_S, now: Optional[float] = None) -> Optional[str]:
    """The ad in ``path``, or None when it is missing or older than ``max_age`` seconds (the
    caller then publishes an empty summary). Raises SummaryFileError when the
    file is unsafe (a link, not root's or ours, writable by others) or not a summary."""
    try:
        fd, st = open_regular(path, NO_LINKS)
    except UnsafeFile as err:
        if is_missing(err):
            return None
        raise SummaryFileError(str(err)) from None
    try:
        if st.st_uid not in (0, os.getuid()) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise SummaryFileError(f"{path}: must be owned by root and writable by its owner only")
        if (now if now is not None else time.time()) - st.st_mtime > max_age:
            return None
        data = read_fd(fd, MAX_BYTES, path)
    except UnsafeFile as err:
        raise SummaryFileError(str(err)) from None
    finally:
        os.close(fd)
    text = data.decode("ascii", errors="replace")
    lines = text.splitlines()
    if not lines or not all(_LINE.match(line) for line in lines):
        raise SummaryFileError(f"{path}: not a cache summary (written by cache-summary --write?)")
    return text if text.endswith("\n") else text + "\n"


def warn(message: str) -> None:
    print(f"pegasus-cloudio cache-summary: {message}", file=sys.stderr)
