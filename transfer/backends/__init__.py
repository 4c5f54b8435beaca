"""Registry: URL scheme -> backend module, imported on first use.

Each backend module provides::

    def endpoint_key(url: Url, context: Context) -> Hashable
        # equal keys share one backend instance (and its connection pool)
    def open_backend(url: Url, context: Context) -> Backend

Importing this package imports no backend (and so no SDK).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Dict

from transfer.errors import InvalidInput

SCHEMES: Dict[str, str] = {
    "file": "transfer.backends.local",
    "symlink": "transfer.backends.local",
    "moveto": "transfer.backends.local",
    "s3": "transfer.backends.s3",
    "s3s": "transfer.backends.s3",
    "http": "transfer.backends.http",
    "https": "transfer.backends.http",
    "gs": "transfer.backends.gcs",
    "scp": "transfer.backends.sftp",
    "sftp": "transfer.backends.sftp",
}


def supports(scheme: str) -> bool:
    return scheme in SCHEMES


def backend_module(scheme: str) -> ModuleType:
    """The module serving ``scheme``; InvalidInput names the scheme when none does."""
    try:
        name = SCHEMES[scheme]
    except KeyError:
        known = ", ".join(sorted(SCHEMES))
        raise InvalidInput(f"unsupported URL scheme '{scheme}' (supported: {known})",
                           operation="resolve") from None
    return importlib.import_module(name)
