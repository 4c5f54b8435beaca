"""URLs as Pegasus writes them, parsed by the rules of ``pegasus-transfer`` 5.x.

* A string without ``:`` is a local path (``file://`` is implied).
* ``file:`` drops ``file:``, ``file://`` or ``file://localhost``; ``symlink:`` and ``moveto:``
  drop the scheme and an optional ``//``. The remaining path then has ``$VAR`` and ``${VAR}``
  expanded (names ``[a-zA-Z][a-zA-Z0-9_]+``; undefined variables expand to ``""``), because
  PegasusLite writes ``file://$PWD/f.a`` inside a quoted heredoc.
* Everything else must match ``scheme://authority/path`` with a non-empty authority (a host,
  ``user@site`` or an AWS-style bucket): ``s3://`` alone is malformed, refused before any
  request, credential lookup included. Repeated ``/`` in the path collapse, except in
  ``s3://`` and ``s3s://`` URLs, whose path holds an object key verbatim.

Which schemes can actually be transferred is decided by the backend registry, not here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Mapping, Optional

from transfer.errors import InvalidInput

LOCAL_SCHEMES = frozenset({"file", "symlink", "moveto"})

_VAR = re.compile(r"\$\{([a-zA-Z][a-zA-Z0-9_]+)\}|\$([a-zA-Z][a-zA-Z0-9_]+)")
_FILE_PREFIX = re.compile(r"^file:(//(localhost)?)?")
_REMOTE = re.compile(r"^(\w+)://([\w.\-:@#]*)(/[\S ]*)?$")
_SLASHES = re.compile(r"//+")
# pegasus-transfer hands S3 URLs to pegasus-s3 unparsed, so an object key keeps its "//".
_EXACT_PATH_SCHEMES = frozenset({"s3", "s3s"})


@dataclass(frozen=True)
class Url:
    """A parsed URL.

    ``scheme`` is lower case. For local schemes ``path`` is the expanded filesystem path
    and ``host`` is empty. For remote schemes ``host`` is the authority as written
    (``user@site``, ``host:port``, or an AWS-style bucket) and ``path`` starts with ``/``
    (or is empty). ``site_label`` is the Pegasus site the URL belongs to, if known; it
    selects per-site credentials.
    """

    scheme: str
    host: str
    path: str
    site_label: Optional[str] = None

    @property
    def is_local(self) -> bool:
        return self.scheme in LOCAL_SCHEMES

    def with_path(self, path: str) -> "Url":
        return replace(self, path=path)

    def __str__(self) -> str:
        """The URL for messages and logs: passwords and query strings (signatures) hidden."""
        if self.is_local:
            return f"{self.scheme}://{self.path}"
        if self.scheme in _EXACT_PATH_SCHEMES:  # an S3 key may hold "?": it is not a query
            return f"{self.scheme}://{_redact(self.host)}{self.path}"
        path, query_mark, _ = self.path.partition("?")
        return f"{self.scheme}://{_redact(self.host)}{path}{'?<query hidden>' if query_mark else ''}"

    @property
    def full(self) -> str:
        """The complete URL, secrets included: for requests, never for messages."""
        if self.is_local:
            return f"{self.scheme}://{self.path}"
        return f"{self.scheme}://{self.host}{self.path}"


def _redact(authority: str) -> str:
    """Hide a password in ``user:password@host`` so URLs can be logged."""
    if "@" not in authority:
        return authority
    userinfo, _, hostport = authority.rpartition("@")
    if ":" in userinfo:
        return userinfo.split(":", 1)[0] + ":***@" + hostport
    return authority


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Expand ``$VAR``/``${VAR}`` the way pegasus-transfer does (undefined -> "")."""
    if "$" not in text:
        return text
    return _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), ""), text)


def parse_url(
    text: str, site_label: Optional[str] = None, env: Optional[Mapping[str, str]] = None
) -> Url:
    """Parse ``text``; raise :class:`InvalidInput` naming the URL when it cannot be parsed."""
    if env is None:
        env = os.environ
    text = text.strip()
    if not text:
        raise InvalidInput("empty URL", operation="parse")
    if ":" not in text:
        return Url("file", "", expand_vars(text, env), site_label)
    lowered = text[:8].lower()
    if lowered.startswith("file:"):
        path = _FILE_PREFIX.sub("", text, count=1) if text.startswith("file:") else text[5:]
        return Url("file", "", expand_vars(path, env), site_label)
    for scheme in ("symlink", "moveto"):
        if lowered.startswith(scheme + ":"):
            rest = text[len(scheme) + 1 :]
            if rest.startswith("//"):
                rest = rest[2:]
            return Url(scheme, "", expand_vars(rest, env), site_label)
    match = _REMOTE.match(text)
    if not match:
        raise InvalidInput("unable to parse URL", url=text, operation="parse")
    scheme, host, path = match.group(1).lower(), match.group(2), match.group(3) or ""
    if not host.strip("@:"):
        raise InvalidInput("malformed URL: no host, site or bucket after '://'", url=text, operation="parse")
    if scheme in _EXACT_PATH_SCHEMES:
        return Url(scheme, host, path, site_label)
    if "?" in path:
        path, query_mark, query = path.partition("?")
        return Url(scheme, host, _SLASHES.sub("/", path) + query_mark + query, site_label)
    return Url(scheme, host, _SLASHES.sub("/", path) if "//" in path else path, site_label)
