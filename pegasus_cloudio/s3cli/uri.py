"""``pegasus-s3`` URLs and configuration lookup, by the rules of pegasus-s3 5.1.3 (spec §3.2-3.3).

URL: ``s3[s]://USER@SITE[:PORT][/BUCKET[/KEY]]``. ``USER@SITE`` (the identity) is required;
``SITE`` is lower-cased like ``urlsplit().hostname``; ``?`` stays part of the key (wildcards).
Unlike 5.1.3's pegasus-transfer regexes, any identity (``joe.smith@my-minio:9000``) and any
bucket name (``my.bucket``) is accepted.

Config file: ``-C``, then ``$PEGASUS_CREDENTIALS``, then ``$S3CFG``, then
``~/.pegasus/credentials.conf`` if it exists, else ``~/.pegasus/s3cfg``. It must exist and
have no group/other permission bits.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Mapping, Optional
from urllib.parse import urlsplit

from transfer.lean import record
from transfer.urls import Url

WILDCARDS = "*?[]"
_NEW_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_IP_LIKE = re.compile(r"^\d+\.\d+\.\d+\.\d+$")


def new_bucket_problem(name: str) -> Optional[str]:
    """Why S3 would refuse to create a bucket named ``name`` (its naming rules), or None. Only
    ``mkdir`` asks: buckets made under older rules stay readable by any name."""
    if _NEW_BUCKET.match(name) and ".." not in name and not _IP_LIKE.match(name):
        return None
    return (f"{name!r} is not a valid bucket name: use 3-63 lower-case letters, digits, '.' or '-', "
            "starting and ending with a letter or digit, no '..', not an IP address")


class CommandError(Exception):
    """A user-facing failure; the message is printed as is (one line) and the exit code is 1."""


@record(frozen=True)
class S3Uri:
    """A parsed pegasus-s3 URL. ``bucket``/``key`` are None when absent (a key of "" is absent)."""

    scheme: str
    user: str
    site: str
    bucket: Optional[str] = None
    key: Optional[str] = None

    @property
    def ident(self) -> str:
        return f"{self.user}@{self.site}"

    def with_key(self, key: Optional[str]) -> "S3Uri":
        return S3Uri(self.scheme, self.user, self.site, self.bucket, key or None)

    def to_url(self) -> Url:
        """The transfer library's URL for this object (or bucket)."""
        path = f"/{self.bucket}" if self.bucket else ""
        if self.key:
            path += "/" + self.key
        return Url(self.scheme, self.ident, path)

    def __str__(self) -> str:
        text = f"{self.scheme}://{self.ident}"
        if self.bucket:
            text += "/" + self.bucket
        if self.key:
            text += "/" + self.key
        return text


def has_wildcards(text: Optional[str]) -> bool:
    return text is not None and any(c in text for c in WILDCARDS)


def parse_s3_uri(text: str) -> S3Uri:
    """Parse like pegasus-s3; CommandError names the URL when it is not a usable S3 URL."""
    for scheme in ("s3s", "s3"):
        if text.startswith(scheme + "://"):
            break
    else:
        raise CommandError(f"Invalid URL scheme: {text}")
    rest = text[len(scheme) + 3:]
    authority, slash, path = rest.partition("/")
    try:
        parts = urlsplit("http://" + authority)
        hostname, port = parts.hostname, parts.port
    except ValueError:
        raise CommandError(f"Invalid URL: {text}") from None
    if parts.username is None or "@" not in authority:
        raise CommandError(f"User missing from URL: {text}")
    if not hostname:
        raise CommandError(f"Site missing from URL: {text}")
    site = hostname if port is None else f"{hostname}:{port}"
    bucket, _, key = path.strip().partition("/")
    return S3Uri(scheme, parts.username, site, bucket or None, key or None)


def find_config(explicit: Optional[str], env: Mapping[str, str]) -> str:
    """The configuration file pegasus-s3 would use, checked to exist and to be private."""
    home = env.get("HOME") or os.path.expanduser("~")
    if explicit:
        path = explicit
    elif env.get("PEGASUS_CREDENTIALS"):
        path = env["PEGASUS_CREDENTIALS"]
    elif env.get("S3CFG"):
        path = env["S3CFG"]
    else:
        path = os.path.join(home, ".pegasus", "credentials.conf")
        if not os.path.isfile(path):
            path = os.path.join(home, ".pegasus", "s3cfg")
    if not os.path.isfile(path):
        raise CommandError(f"Config file not found: {path}")
    if os.stat(path).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CommandError(f"Permissions of config file {path} are too liberal; fix with: chmod 600 {path}")
    return os.path.abspath(path)
