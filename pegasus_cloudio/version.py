"""The distribution's one version number (``setup.cfg`` reads it; every ``--version`` prints it)."""

from __future__ import annotations

import platform
import re

__version__ = "0.1.0"


def version_line(prog: str) -> str:
    """``PROG VERSION (Python X.Y.Z)``: what every console script's ``--version`` prints."""
    return f"{prog} {__version__} (Python {platform.python_version()})"


def plain(doc: str) -> str:
    """A docstring as help text: reST roles and ````literal```` markup removed."""
    text = re.sub(r":[a-z]+:`~?([^`]*)`", lambda m: m.group(1).rsplit(".", 1)[-1], doc)
    return text.replace("``", "").replace("`", "")
