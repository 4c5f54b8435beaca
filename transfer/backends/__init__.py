"""URL scheme -> backend module (the rows of :mod:`transfer.schemes`), imported on first use.

Each backend module provides::

    def endpoint_key(url: Url, context: Opening) -> Hashable
        # equal keys share one backend instance (and its connection pool)
    def open_backend(url: Url, context: Opening) -> Backend

Importing this package imports no backend (and so no SDK). A backend whose SDK is not
installed fails with one ConfigError naming the extra that installs it.
"""

from __future__ import annotations

import sys


from transfer.errors import ConfigError, InvalidInput
from transfer.schemes import SCHEMES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Dict

def missing_extra(scheme: str, module: str) -> ConfigError:
    """The one-line error for a ``scheme://`` URL whose SDK ``module`` cannot be imported."""
    row = SCHEMES.get(scheme)
    extra = row.extra if row is not None and row.extra else "all"
    return ConfigError(f"{scheme}:// URLs need the Python module {module!r}, which is not installed: "
                       f"pip install 'pegasus-cloudio[{extra}]'", operation="resolve")


def supports(scheme: str) -> bool:
    return scheme in SCHEMES


def backend_module(scheme: str) -> ModuleType:
    """The module serving ``scheme``; InvalidInput names the scheme when none does."""
    try:
        name = SCHEMES[scheme].module
    except KeyError:
        known = ", ".join(sorted(SCHEMES))
        raise InvalidInput(f"unsupported URL scheme '{scheme}' (supported: {known})",
                           operation="resolve") from None
    try:
        __import__(name)  # not importlib.import_module: importlib is one more import per job step
        return sys.modules[name]
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        if top in ("", "transfer"):
            raise
        raise missing_extra(scheme, top) from err
