"""Hand the entries we do not serve natively (gsiftp, webdav, osdf, docker...) to the stock tool.

All such entries go to one stock ``pegasus-transfer`` run, fed the original JSON objects.
The stock tool is ``$PEGASUS_CLOUDIO_STOCK_TRANSFER`` if set, else the first
``pegasus-transfer`` in ``$PEGASUS_HOME/bin`` or on ``PATH`` that is not this drop-in (our
own shim of that name carries a marker line and is skipped).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from typing import List, Mapping, Optional, Sequence

from pegasus_cloudio.dropin.spec import Entry, urls_of
from transfer import backends

log = logging.getLogger("pegasus-transfer")
MARKER = b"pegasus-cloudio drop-in"


def find_stock_transfer(env: Mapping[str, str]) -> Optional[str]:
    explicit = env.get("PEGASUS_CLOUDIO_STOCK_TRANSFER")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    candidates: List[str] = []
    if env.get("PEGASUS_HOME"):
        candidates.append(os.path.join(env["PEGASUS_HOME"], "bin", "pegasus-transfer"))
    candidates += [os.path.join(d, "pegasus-transfer") for d in env.get("PATH", "").split(os.pathsep) if d]
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    for path in candidates:
        if os.access(path, os.X_OK) and os.path.realpath(path) != me and not _is_ours(path):
            return path
    return None


def _is_ours(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return MARKER in fh.read(4096)
    except OSError:
        return True


def run_stock(entries: Sequence[Entry], argv: Sequence[str], env: Mapping[str, str],
              knobs: Optional[Mapping[str, str]] = None) -> int:
    """Run the stock tool on ``entries`` with the caller's options and environment ``env``;
    ``knobs`` (default ``env``) is where ``PEGASUS_CLOUDIO_STOCK_TRANSFER`` is read, the
    settings layer's mapping (so the config file can name the tool); returns its exit code."""
    tool = find_stock_transfer(env if knobs is None else knobs)
    schemes = sorted({u.scheme for e in entries for u in urls_of(e.op) if not backends.supports(u.scheme)})
    if tool is None:
        log.error("URL scheme(s) %s are not served natively and no stock pegasus-transfer was found "
                  "(set PEGASUS_CLOUDIO_STOCK_TRANSFER to its path)", ", ".join(schemes))
        return 1
    log.info("Handing %d transfer(s) with scheme(s) %s to %s", len(entries), ", ".join(schemes), tool)
    with tempfile.NamedTemporaryFile("w", prefix="pegasus-cloudio-", suffix=".json", delete=False) as fh:
        json.dump([e.raw for e in entries], fh)
    try:
        return subprocess.call([tool, "-f", fh.name, *argv], env=dict(env))
    finally:
        os.unlink(fh.name)

