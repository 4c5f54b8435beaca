"""Settings: every knob is an environment variable ``PEGASUS_CLOUDIO_<NAME>``.

The same names may be written one per line (``PEGASUS_CLOUDIO_THREADS = 5``; ``#`` starts a
comment) in a config file named by ``PEGASUS_CLOUDIO_CONFIG`` (default
``~/.pegasus/cloudio.conf``, used only if it exists). The environment wins over the file, so
Pegasus ``env`` profiles can override a site-wide file. A bad value raises
:class:`~transfer.errors.InvalidInput` naming the variable.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

from transfer.errors import InvalidInput

PREFIX = "PEGASUS_CLOUDIO_"
_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class Settings:
    """Tuning of the transfer engine and backends.

    threads:             concurrent transfers (and connections kept per endpoint).
    max_attempts:        tries per file before it is reported failed (permanent errors: 1).
    retry_base_delay:    seconds; the first retry waits up to this (full jitter, doubling).
    retry_max_delay:     seconds; cap of one wait between attempts.
    connect_timeout:     seconds for TCP+TLS connect.
    read_timeout:        seconds without a byte before a request is abandoned.
    multipart_threshold: bytes; uploads at or above this use parallel multipart.
    multipart_part_size: bytes per part of a multipart upload.
    download_part_size:  bytes per ranged GET; objects of at least twice this download as
                         parallel ranged GETs (backends with ranged reads, plain-file targets).
    ca_bundle:           PEM file of CAs used instead of the system store to verify TLS.
    gcs_endpoint:        GCS JSON API endpoint (e.g. an emulator); ``STORAGE_EMULATOR_HOST`` also works.
    ssh_known_hosts:     known_hosts file; when set, SSH host keys must match it (strict checking).
    bundle:              pack batches of small uploads into bundles, for every destination site.
    bundle_sites:        comma-separated destination site labels that get bundles (``bundle`` off).
    bundle_min_files:    fewest small files going to one directory in one batch worth a bundle.
    bundle_max_member_size: bytes; larger files are uploaded as plain objects.
    bundle_max_size:     bytes; a batch larger than this is split into several bundles.
    """

    threads: int = 8
    max_attempts: int = 3
    retry_base_delay: float = 0.5
    retry_max_delay: float = 20.0
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    multipart_threshold: int = 64 << 20
    multipart_part_size: int = 16 << 20
    download_part_size: int = 16 << 20
    ca_bundle: Optional[str] = None
    gcs_endpoint: Optional[str] = None
    ssh_known_hosts: Optional[str] = None
    bundle: bool = False
    bundle_sites: Optional[str] = None
    bundle_min_files: int = 8
    bundle_max_member_size: int = 1 << 20
    bundle_max_size: int = 64 << 20

    def bundles_for(self, site_label: Optional[str]) -> bool:
        """Whether uploads to ``site_label`` are bundled."""
        if self.bundle:
            return True
        sites = {s.strip().replace("-", "_") for s in (self.bundle_sites or "").split(",") if s.strip()}
        return site_label is not None and site_label.replace("-", "_") in sites

    def replace(self, **changes: object) -> "Settings":
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "Settings":
        """Defaults, then the config file, then ``PEGASUS_CLOUDIO_*`` variables in ``env``."""
        env = os.environ if env is None else env
        values = dict(read_config_file(env))
        values.update({k: v for k, v in env.items() if k.startswith(PREFIX)})
        changes: Dict[str, object] = {}
        for field in dataclasses.fields(cls):
            name = PREFIX + field.name.upper()
            if name in values and values[name].strip() != "":
                changes[field.name] = _convert(name, values[name], field.default)
        settings = cls(**changes)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def validate(self) -> None:
        for name in ("threads", "max_attempts", "multipart_part_size", "download_part_size"):
            if getattr(self, name) < 1:
                raise InvalidInput(f"{PREFIX}{name.upper()} must be at least 1", operation="config")
        if self.multipart_part_size < 5 << 20:
            raise InvalidInput(f"{PREFIX}MULTIPART_PART_SIZE must be at least 5 MiB (S3 minimum)",
                               operation="config")


def read_config_file(env: Mapping[str, str]) -> Dict[str, str]:
    """``NAME = value`` pairs of the config file, or ``{}`` when there is none.

    The default file is used only if it can be read: a missing or unreadable
    ``~/.pegasus/cloudio.conf`` (a daemon's ``HOME=/root`` seen by a job's user) counts as
    absent. A file named by ``PEGASUS_CLOUDIO_CONFIG`` must be readable; messages name it.
    """
    path = env.get(PREFIX + "CONFIG") or os.path.join(
        env.get("HOME", os.path.expanduser("~")), ".pegasus", "cloudio.conf")
    explicit = bool(env.get(PREFIX + "CONFIG"))
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.readlines()
    except OSError as err:
        if not explicit:
            return {}
        reason = "not found" if isinstance(err, FileNotFoundError) else err.strerror
        raise InvalidInput(f"cannot read config file {path} (named by {PREFIX}CONFIG): {reason}",
                           operation="config") from None
    values: Dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        name, sep, value = text.partition("=")
        if not sep or not name.strip().startswith(PREFIX):
            raise InvalidInput(f"config file {path} line {number}: expected {PREFIX}NAME = value",
                               operation="config")
        values[name.strip()] = value.strip()
    return values


def parse_size(text: str) -> int:
    """``"8M"``, ``"64MiB"``, ``"1048576"`` -> bytes."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(text)
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def _convert(name: str, raw: str, default: object) -> object:
    try:
        if isinstance(default, bool):
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return parse_size(raw) if name.endswith(("_THRESHOLD", "_SIZE", "_BYTES")) else int(raw)
        if isinstance(default, float):
            return float(raw)
        return raw.strip() or None
    except ValueError:
        raise InvalidInput(f"invalid value {raw!r} for {name}", operation="config") from None
