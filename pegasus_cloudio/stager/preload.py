"""What the node stager imports before its first fork, so a job's copy imports nothing itself.

:data:`PRELOAD` at start (and what each loaded module of ours names in its ``DEFERRED``),
:data:`ON_DEMAND` once a finished job has used it; then the ``__init__`` of every record class
(:func:`transfer.lean.prepare`), generated once rather than in every job.
"""

from __future__ import annotations

import importlib
import sys
from typing import List, Set

from transfer.lean import prepare

# Imported once, before the first fork: the drop-in, its backends and features, and what its
# main() imports lazily on the way to a transfer, so a job's process imports nothing itself
# (tests/test_stager_preload.py pins this). Public names only: what a module of ours imports
# inside its functions it names in its own DEFERRED, which preload() follows.
PRELOAD = ("pegasus_cloudio.dropin.main", "pegasus_cloudio.dropin.integrity", "pegasus_cloudio.dropin.monitoring",
           "pegasus_cloudio.dropin.reporting", "pegasus_cloudio.dropin.signals", "pegasus_cloudio.dropin.spec",
           "pegasus_cloudio.dropin.stats", "pegasus_cloudio.ending",  # flush_standard_streams, before inserts
           "transfer.backends.s3", "transfer.backends.http", "transfer.backends.local",
           "transfer.http.pipeline",  # heads of a directory's small bundles
           "transfer.batched", "transfer.cached_reads", "transfer.bundle_gate", "transfer.local_copies",
           "transfer.bundles", "transfer.bundles.staging", "transfer.bundles.fetch", "transfer.bundles.reading",
           "transfer.bundles.groups", "transfer.cache", "transfer.cache.store", "transfer.cache.members",
           "transfer.p2p", "transfer.layers.cache", "transfer.layers.peers", "transfer.layers.bundles",  # read layers (issue 36)
           "transfer.writes",  # uploads and their write-through
           "transfer.mkdirs", "transfer.copies",  # a create-dir job's mkdirs; what an attempt copies
           "transfer.engine", "transfer.node", "transfer.session", "transfer.ranged", "transfer.retry",
           "transfer.pacing", "transfer.pacing_node",  # a job's node rate file (issue 37)
           "transfer.ops", "transfer.context",
           "transfer.http.warm", "_queue", "encodings.ascii", "ssl", "hashlib", "zlib", "tarfile",
           "awscrt.checksums")
# Imported once a job has used them (its copy reports it), not before: google-cloud-storage and
# paramiko are 26 MB of the stager's 40 MB, and every fork copies the page tables of what the
# stager holds, and every copy's exit tears them down (2.7 ms more CPU per job step with them).
ON_DEMAND = ("transfer.backends.gcs", "transfer.backends.sftp")
_OURS = ("transfer.", "pegasus_cloudio.")  # modules whose record classes preload() prepares


def preload() -> List[str]:
    """Import what jobs use, and generate the ``__init__`` of every record class they may
    create (:func:`transfer.lean.prepare`); the names that could not be imported (an extra not
    installed: its import error then reaches the job that needs it, as without the stager)."""
    missing = [name for name in PRELOAD if not import_quietly(name)]
    _import_deferred()
    prepare_records()
    return missing


def _import_deferred() -> None:
    """Import what each loaded module of ours names in its ``DEFERRED`` (what it imports inside
    functions), and theirs in turn."""
    done: Set[str] = set()
    while True:
        wanted = [name for module in list(sys.modules.values()) if getattr(module, "__name__", "").startswith(_OURS)
                  for name in getattr(module, "DEFERRED", ()) if name not in done]
        if not wanted:
            return
        for name in wanted:
            done.add(name)
            import_quietly(name)


def import_quietly(name: str) -> bool:
    """Import ``name``; False when that fails (an extra not installed)."""
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - e.g. MissingExtra for gcs without [gcs]
        return False
    return True


def prepare_records() -> None:
    """Generate the ``__init__`` of every record class in the loaded modules of ours."""
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith(_OURS):
            for value in list(vars(module).values()):
                if isinstance(value, type):
                    prepare(value)
