"""Credentials, found exactly where Pegasus and the AWS tools look for them.

Pegasus credentials file (INI, ``pegasus-s3`` format):

* chosen by ``PEGASUS_CREDENTIALS_<site>`` (site label with ``-`` as ``_``), then
  ``PEGASUS_CREDENTIALS``, then ``~/.pegasus/credentials.conf``;
* refused when group or other have any permission bit (the message says how to fix it);
* ``[SITE]`` holds ``endpoint``, ``region``, ``batch_delete``, ``batch_delete_size``;
  ``[USER@SITE]`` holds ``access_key`` and ``secret_key`` (and ``session_token`` for
  temporary credentials);
* ``[scheme://host:port]`` holds ``header.<Name>`` values for HTTP downloads from exactly
  that origin; ``[scheme://host]`` means the scheme's default port and a bare ``[host]``
  means ``https://host:443``. Credentials are scoped to scheme, host and port: a redirect
  to plain ``http://`` or to another port never carries them.

AWS-style URLs (``s3://BUCKET/KEY``) use the standard AWS chain: see :mod:`transfer.backends.aws_chain`.

Secrets are never part of an error message or a ``repr``.
"""

from __future__ import annotations

import os

from transfer.errors import ConfigError
from transfer.lean import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Mapping, Optional

DEFAULT_PORTS = {"http": 80, "https": 443}

_DEFAULTS = {"batch_delete": "True", "batch_delete_size": "1000"}


@record(frozen=True)
class Credentials:
    """An access key pair; ``repr`` never shows the secret."""

    access_key: str
    secret_key: str = field(repr=False)
    session_token: Optional[str] = field(default=None, repr=False)


if TYPE_CHECKING:
    CredentialSource = Callable[[], Credentials]
else:
    CredentialSource = object  # for type checkers, the Callable above
"""Current credentials, renewed by the source when they expire (see :mod:`transfer.backends.aws_chain`)."""


def site_env_suffix(site_label: Optional[str]) -> Optional[str]:
    """Pegasus's environment-key form of a site label (``my-site`` -> ``my_site``)."""
    return site_label.replace("-", "_") if site_label else None


def pegasus_credentials_path(site_label: Optional[str], env: Mapping[str, str]) -> str:
    """The credentials file a transfer for ``site_label`` uses (may not exist)."""
    suffix = site_env_suffix(site_label)
    if suffix and env.get(f"PEGASUS_CREDENTIALS_{suffix}"):
        return env[f"PEGASUS_CREDENTIALS_{suffix}"]
    if env.get("PEGASUS_CREDENTIALS"):
        return env["PEGASUS_CREDENTIALS"]
    home = env.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".pegasus", "credentials.conf")


MAX_CREDENTIALS_BYTES = 1 << 20  # a credentials or key file; a larger one is refused, not read


def read_private(path: str, what: str = "credentials file", limit: int = MAX_CREDENTIALS_BYTES) -> bytes:
    """The bytes of the private credentials file ``path``: :func:`read_credentials_file`,
    and ConfigError also when group or others have any permission bit."""
    return read_credentials_file(path, what, limit, private=True)


def read_credentials_file(path: str, what: str, limit: int = MAX_CREDENTIALS_BYTES, private: bool = False) -> bytes:
    """The bytes of ``path``, read the one safe way (:mod:`transfer.named_files`: no FIFO,
    device or other user's link, at most ``limit`` bytes); ConfigError naming ``path`` (and
    calling it ``what``) when it is missing, unreadable or unsafe, or (``private``) when
    group or others have any permission bit."""
    from transfer.named_files import read_fd
    fd = _open_checked(path, what, private)
    try:
        return read_fd(fd, limit, path)
    except OSError as err:
        raise ConfigError(f"cannot read {what}: {err.strerror}", url=path, operation="credentials") from None
    finally:
        os.close(fd)


def check_private(path: str, what: str = "credentials file") -> None:
    """Raise ConfigError unless ``path`` is a private regular file this process can open (as
    :func:`read_private` opens it; callers that read the file use that instead)."""
    os.close(_open_checked(path, what, True))


def _open_checked(path: str, what: str, private: bool) -> int:
    from transfer.named_files import OWN_LINKS, UnsafeFile, is_missing, open_regular
    try:
        fd, st = open_regular(path, OWN_LINKS)
    except UnsafeFile as err:
        reason = f"{what} not found" if is_missing(err) else f"cannot read {what}: {err.strerror}"
        raise ConfigError(reason, url=path, operation="credentials") from None
    if private and st.st_mode & 0o077:
        os.close(fd)
        raise ConfigError(f"{what} is accessible by group/others (mode {st.st_mode & 0o7777:04o}); "
                          f"fix with: chmod 600 {path}", url=path, operation="credentials")
    return fd


class PegasusCredentialsFile:
    """A parsed, permission-checked Pegasus credentials file."""

    def __init__(self, path: str) -> None:
        try:
            text = read_private(path).decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(f"malformed credentials file: {type(err).__name__}", url=path,
                              operation="credentials") from None
        self.path = path
        plain = _plain_ini(text)
        self._sections = plain if plain is not None else _configparser_ini(text, path)

    def section(self, name: str) -> Optional[Dict[str, str]]:
        for candidate in (name, name.lower()):
            found = self._sections.get(candidate)
            if found is not None:
                return dict(found)
        return None

    def require(self, name: str, what: str) -> Dict[str, str]:
        found = self.section(name)
        if found is None:
            raise ConfigError(f"no section [{name}] for {what}", url=self.path,
                              operation="credentials")
        return found

    def headers_for(self, scheme: str, host: str, port: Optional[int] = None) -> Dict[str, str]:
        """``header.<Name>`` values for the origin ``scheme://host:port`` (``port`` None: the
        scheme's default): from ``[scheme://host:port]``, else (default port only)
        ``[scheme://host]``, else (``https`` on 443 only) ``[host]``."""
        default = DEFAULT_PORTS.get(scheme.lower())
        port = default if port is None else port
        names = [f"{scheme}://{host}:{port}"]
        if port == default:
            names.append(f"{scheme}://{host}")
            if scheme.lower() == "https":
                names.append(host)
        found = next((s for s in map(self.section, names) if s is not None), {})
        return {k[len("header."):]: v for k, v in found.items() if k.startswith("header.")}


@record(frozen=True)
class S3SiteConfig:
    """What an ``s3://USER@SITE/...`` URL needs: endpoint, region, keys, delete batching."""

    endpoint: Optional[str]
    region: Optional[str]
    credentials: Optional[Credentials]
    batch_delete: bool = True
    batch_delete_size: int = 1000
    source: Optional["CredentialSource"] = field(default=None, repr=False, compare=False)
    where: str = ""  # where endpoint and region were set, for error messages


def pegasus_s3_config(creds: PegasusCredentialsFile, identity: str) -> S3SiteConfig:
    """Resolve ``USER@SITE`` against a Pegasus credentials file."""
    if "@" not in identity:
        raise ConfigError("S3 URL has no USER@ identity", url=creds.path, operation="credentials")
    site = identity.split("@", 1)[1].split(":", 1)[0]
    site_section = creds.require(site, f"site '{site}'")
    endpoint = site_section.get("endpoint")
    if not endpoint:
        raise ConfigError(f"section [{site}] has no endpoint", url=creds.path,
                          operation="credentials")
    ident = creds.require(identity, f"identity '{identity}'")
    if not ident.get("access_key") or not ident.get("secret_key"):
        raise ConfigError(f"section [{identity}] needs access_key and secret_key", url=creds.path,
                          operation="credentials")
    try:
        batch_size = int(site_section.get("batch_delete_size", "1000"))
    except ValueError:
        raise ConfigError(f"[{site}] batch_delete_size is not a number", url=creds.path,
                          operation="credentials") from None
    return S3SiteConfig(
        endpoint=endpoint.rstrip("/"),
        region=site_section.get("region") or None,
        credentials=Credentials(ident["access_key"], ident["secret_key"], ident.get("session_token") or None),
        batch_delete=site_section.get("batch_delete", "True").lower() in ("1", "true", "yes", "t"),
        batch_delete_size=max(1, min(1000, batch_size)),
        where=f"{creds.path} [{site}]",
    )


def _plain_ini(text: str) -> Optional[Dict[str, Dict[str, str]]]:
    """The sections of an INI text (each with :data:`_DEFAULTS` under its values) as
    ``configparser`` reads it, for the plain files credentials are: ``[section]`` and
    ``key = value`` (or ``key: value``) lines, ``#``/``;`` comments. None for anything else
    (continuation lines, ``[DEFAULT]``, duplicates, malformed lines), which
    :func:`_configparser_ini` then reads: ``configparser`` imports ``re`` on every job step."""
    sections: Dict[str, Dict[str, str]] = {}
    current: Optional[Dict[str, str]] = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if line[0] in " \t":
            return None
        if stripped[0] == "[" and stripped[-1] == "]":
            name = stripped[1:-1]
            if not name or name in sections or name == "DEFAULT" or "]" in name:
                return None
            current = sections[name] = {}
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        key = line[:cut].strip().lower()
        if current is None or cut < 0 or not key or key in current:
            return None
        current[key] = line[cut + 1:].strip()
    return {name: {**_DEFAULTS, **values} for name, values in sections.items()}


def _configparser_ini(text: str, path: str) -> Dict[str, Dict[str, str]]:
    import configparser
    parser = configparser.ConfigParser(defaults=_DEFAULTS, interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error as err:
        raise ConfigError(f"malformed credentials file: {type(err).__name__}", url=path,
                          operation="credentials") from None
    return {name: dict(parser.items(name)) for name in parser.sections()}


def read_ini(path: str) -> Dict[str, Dict[str, str]]:
    """Sections of an AWS-style INI file ({} if it does not exist or this user may not read
    it, as the AWS tools and ``configparser.read`` skip it), read the one safe way
    (:mod:`transfer.named_files`); ConfigError naming the file when it is unsafe (a FIFO, a
    device, another user's link, over the bound) or malformed."""
    import configparser
    import errno
    from transfer.named_files import OWN_LINKS, UnsafeFile, is_missing, read_file
    try:
        text = read_file(path, MAX_CREDENTIALS_BYTES, OWN_LINKS)[0].decode("utf-8")
    except UnsafeFile as err:
        if is_missing(err) or err.errno == errno.EACCES:
            return {}
        raise ConfigError(f"cannot read AWS file: {err.strerror}", url=path, operation="credentials") from None
    except UnicodeDecodeError:
        raise ConfigError("malformed AWS file: not UTF-8", url=path, operation="credentials") from None
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text, source=path)
    except configparser.Error as err:
        raise ConfigError(f"malformed AWS file: {type(err).__name__}", url=path,
                          operation="credentials") from None
    return {name: dict(parser.items(name)) for name in parser.sections()}
