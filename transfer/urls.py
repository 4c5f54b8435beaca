"""URLs as Pegasus writes them, parsed by the rules of ``pegasus-transfer`` 5.x.

* A string without ``:``, or an absolute path (``/data/a:b``), is a local path (``file://`` is
  implied).
* ``file:`` drops ``file:``, ``file://`` or ``file://localhost``; ``symlink:`` and ``moveto:``
  drop the scheme and an optional ``//``. When the caller passes ``env`` (the Pegasus front
  ends do), the remaining path then has ``$VAR``, ``${VAR}`` (and ``${VAR``, ``$VAR}``)
  expanded from it (names ``[a-zA-Z][a-zA-Z0-9_]+``; undefined variables expand to ``""``),
  because PegasusLite writes ``file://$PWD/f.a`` inside a quoted heredoc. Without ``env`` a
  path is taken literally: the library never reads ``os.environ`` here.
* Everything else must match ``scheme://authority/path`` with a non-empty authority (a host,
  ``user@site`` or an AWS-style bucket): ``s3://`` alone is malformed, refused before any
  request, credential lookup included. Repeated ``/`` in the path collapse, except in
  ``s3://`` and ``s3s://`` URLs, whose path holds an object key verbatim.

Which schemes can actually be transferred is decided by the backend registry, not here.
"""

from __future__ import annotations

from transfer import schemes
from transfer.errors import InvalidInput
from transfer.lean import record, replace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Mapping, Optional, Tuple

LOCAL_SCHEMES = schemes.LOCAL

# The grammar as regular expressions, parsed by hand below: ``re`` costs every job step ~5 ms.
#   variable:  \${?([a-zA-Z][a-zA-Z0-9_]+)}?   (pegasus-transfer's, braces each optional)
#   remote:    ^(\w+)://([\w.\-:@#]*)(/[\S ]*)?$
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_NAME_CHARS = _LETTERS | frozenset("0123456789_")
_WORD_PUNCT = str.maketrans("", "", "_")  # \w is isalnum() or "_"
_HOST_PUNCT = str.maketrans("", "", "_.-:@#")
_ASCII_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_ASCII_HOST = _ASCII_WORD | frozenset(".-:@#")
# pegasus-transfer hands S3 URLs to pegasus-s3 unparsed, so an object key keeps its "//".
_EXACT_PATH_SCHEMES = schemes.EXACT_PATH


@record(frozen=True)
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

    @property
    def bare_path(self) -> str:
        """The path without its query: what names the object or file. A remote URL's ``?``
        starts its query (an Azure SAS: ``/C/B?sv=...&sig=...``), except in exact-path schemes
        (an S3 key may hold ``?``) and local paths, whose ``?`` is part of the name."""
        if self.is_local or self.scheme in _EXACT_PATH_SCHEMES:
            return self.path
        return self.path.partition("?")[0]

    def with_bare_path(self, path: str) -> "Url":
        """This URL (host, site, query: a SAS goes on) naming ``path`` instead: the path
        arithmetic of bundles and listings, which must never put a query inside a name."""
        query = self.path[len(self.bare_path):]
        return replace(self, path=path + query)

    def __str__(self) -> str:
        """The URL for messages and logs: passwords and query strings (signatures) hidden."""
        if self.is_local:
            return f"{self.scheme}://{self.path}"
        if self.scheme in _EXACT_PATH_SCHEMES:  # an S3 key may hold "?": it is not a query
            return f"{self.scheme}://{_redact(self.host)}{self.path}"
        path, query_mark, _ = self.path.partition("?")
        return f"{self.scheme}://{_redact(self.host)}{path}{'?<query hidden>' if query_mark else ''}"

    def __repr__(self) -> str:
        """As a record's, with the password and query hidden as in :meth:`__str__` (a debug log
        prints operations, and their URLs, this way)."""
        host, path = self.host, self.path
        if not self.is_local:
            host = _redact(host)
            if self.scheme not in _EXACT_PATH_SCHEMES and "?" in path:
                path = path.partition("?")[0] + "?<query hidden>"
        return f"Url(scheme={self.scheme!r}, host={host!r}, path={path!r}, site_label={self.site_label!r})"

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


def _redact_text(text: str) -> str:
    """``text``, a URL that did not parse, with a password in its authority hidden as
    :func:`_redact` hides it (the error names the URL; a password the grammar refuses, such as
    one with ``%``-escapes or ``!``, is what made it fail)."""
    scheme, sep, rest = text.partition("://")
    slash = rest.find("/")
    authority, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    return f"{scheme}{sep}{_redact(authority)}{path}" if sep else text


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Expand variables as pegasus-transfer's ``re.sub(r"\\${?([a-zA-Z][a-zA-Z0-9_]+)}?")`` does:
    each brace is optional on its own, so ``${VAR}``, ``${VAR`` and ``$VAR`` all name VAR and a
    ``}`` right after a name is consumed (``$VAR}`` too); a name has two characters or more;
    an undefined variable expands to ``""``; a ``$`` that starts no name stays."""
    if "$" not in text:
        return text
    out = []
    position = 0
    while True:
        dollar = text.find("$", position)
        if dollar < 0:
            out.append(text[position:])
            return "".join(out)
        out.append(text[position:dollar])
        start = dollar + 2 if text.startswith("{", dollar + 1) else dollar + 1
        end = _name_end(text, start)
        if end - start >= 2:
            out.append(env.get(text[start:end], ""))
            position = end + 1 if text.startswith("}", end) else end
        else:
            out.append("$")
            position = dollar + 1


def _name_end(text: str, start: int) -> int:
    """End of the variable name ``[a-zA-Z][a-zA-Z0-9_]*`` at ``start`` (``start``: none)."""
    if start >= len(text) or text[start] not in _LETTERS:
        return start
    end = start + 1
    while end < len(text) and text[end] in _NAME_CHARS:
        end += 1
    return end


def _split_remote(text: str) -> Optional[Tuple[str, str, str]]:
    """(scheme, authority, path) of ``scheme://authority/path``, or None when ``text`` is not one."""
    scheme, sep, rest = text.partition("://")
    if not sep or not scheme or not _all_in(scheme, _ASCII_WORD, _WORD_PUNCT):
        return None
    slash = rest.find("/")
    host, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    if not _all_in(host, _ASCII_HOST, _HOST_PUNCT):
        return None
    if not path.isprintable() and any(c.isspace() and c != " " for c in path):  # only spaces may be blank
        return None
    return scheme, host, path


def _all_in(text: str, ascii_chars: "frozenset[str]", punct: "Dict[int, Optional[int]]") -> bool:
    """Every character of ``text`` is ``isalnum()`` or in ``punct`` (ASCII text: a set lookup per
    character; ``str.translate`` looks each one up in a dict from Python)."""
    if text.isascii():
        return ascii_chars.issuperset(text)
    letters = text.translate(punct)
    return not letters or letters.isalnum()


def _collapse(path: str) -> str:
    while "//" in path:
        path = path.replace("//", "/")
    return path


def _expand(path: str, env: Optional[Mapping[str, str]]) -> str:
    return path if env is None else expand_vars(path, env)


def parse_url(
    text: str, site_label: Optional[str] = None, env: Optional[Mapping[str, str]] = None, *,
    trailing_blanks: bool = False,
) -> Url:
    """Parse ``text``; raise :class:`InvalidInput` naming the URL when it cannot be parsed.

    ``env``: expand ``$VAR`` in local paths from this mapping (pegasus-transfer's rule); None
    (the default) expands nothing. Blanks around ``text`` are dropped (input files pad URLs),
    but with ``trailing_blanks`` those at its end stay part of the key or path (the library's
    callers name objects literally: ``"x "`` is not ``"x"``)."""
    if not isinstance(text, str):
        raise TypeError(f"parse_url() takes a str, not {type(text).__name__}")
    text = text.lstrip() if trailing_blanks else text.strip()
    if not text:
        raise InvalidInput("empty URL", operation="parse")
    if ":" not in text or text.startswith("/"):
        return Url("file", "", _expand(text, env), site_label)
    lowered = text[:8].lower()
    if lowered.startswith(_LOCAL_SCHEMES):
        return _local_url(text, lowered, site_label, env)
    return _remote_url(text, site_label)


_LOCAL_SCHEMES = ("file:", "symlink:", "moveto:")


def _local_url(text: str, lowered: str, site_label: Optional[str], env: Optional[Mapping[str, str]]) -> Url:
    """A file:, symlink: or moveto: URL (``lowered``: ``text[:8].lower()``): the path after
    the scheme and an optional ``//`` (or ``//localhost``), ``$VAR`` expanded from ``env``."""
    if lowered.startswith("file:"):
        path = text[5:]
        if text.startswith("file:") and path.startswith("//"):
            path = path[11:] if path.startswith("localhost", 2) else path[2:]
        return Url("file", "", _expand(path, env), site_label)
    scheme = "symlink" if lowered.startswith("symlink:") else "moveto"
    rest = text[len(scheme) + 1 :]
    if rest.startswith("//"):
        rest = rest[2:]
    return Url(scheme, "", _expand(rest, env), site_label)


def _remote_url(text: str, site_label: Optional[str]) -> Url:
    """A ``scheme://host/path`` URL; :class:`InvalidInput` for text that is not one."""
    parts = _split_remote(text)
    if parts is None:
        raise InvalidInput("unable to parse URL", url=_redact_text(text), operation="parse")
    scheme, host, path = parts[0].lower(), parts[1], parts[2]
    if not host.strip("@:"):
        raise InvalidInput("malformed URL: no host, site or bucket after '://'", url=text, operation="parse")
    if scheme in _EXACT_PATH_SCHEMES:
        return Url(scheme, host, path, site_label)
    if scheme == "https":  # a store's own https spelling (https://ACCOUNT.blob.core.windows.net/...)
        alias = schemes.https_alias(host)
        if alias is not None:
            scheme, host = alias
    if "?" in path:
        path, query_mark, query = path.partition("?")
        return Url(scheme, host, _collapse(path) + query_mark + query, site_label)
    return Url(scheme, host, _collapse(path), site_label)


_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def unquote_plus(text: str) -> str:
    """``urllib.parse.unquote_plus(text)`` (UTF-8, invalid bytes replaced), without importing
    :mod:`urllib.parse`, which brings ``re`` into a job step that lists a directory (S3
    listings percent-encode keys: ``encoding-type=url``). Text with non-ASCII characters and
    escapes, which S3 never sends, goes to the stdlib."""
    text = text.replace("+", " ")
    if "%" not in text:
        return text
    if not text.isascii():
        from urllib.parse import unquote
        return unquote(text)
    parts = text.split("%")
    out = bytearray(parts[0], "ascii")
    for part in parts[1:]:
        if len(part) >= 2 and part[0] in _HEX_DIGITS and part[1] in _HEX_DIGITS:
            out.append(int(part[:2], 16))
            out += part[2:].encode("ascii")
        else:
            out += b"%"
            out += part.encode("ascii")
    return out.decode("utf-8", "replace")
