"""Settings of the transfer engine and backends: :class:`Settings`, read by :mod:`transfer.knobs`.

Each field is the knob ``PEGASUS_CLOUDIO_<FIELD>``; where its value comes from (command line >
environment > config file > default; the library reads the file only when asked) is
:mod:`transfer.knobs`'s one rule. A bad value raises :class:`~transfer.errors.InvalidInput`
naming the knob and its source: one that does not parse, and one no setting can mean (a count
or size below 1, a timeout that is not above 0, a delay below 0, NaN or infinity in any
of them), so a job never starts a request with it.
"""

from __future__ import annotations

from transfer import lean
from transfer.errors import InvalidInput
from transfer.knobs import PREFIX, layered, origin_of
from transfer.lean import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Mapping, Optional

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_TIMEOUTS = ("connect_timeout", "read_timeout")   # seconds, above 0 and finite
_DELAYS = ("retry_base_delay", "retry_max_delay", "throttle_timeout", "multipart_orphan_age")  # seconds, 0 or more and finite


@record(frozen=True)
class Settings:
    """Tuning of the transfer engine and backends.

    threads:             concurrent transfers (and connections kept per endpoint).
    max_attempts:        tries per file before it is reported failed (permanent errors: 1).
    retry_base_delay:    seconds; the first retry waits up to this (full jitter, doubling).
    retry_max_delay:     seconds; cap of one wait between attempts.
    throttle_timeout:    seconds a file is retried for while the store throttles (503 SlowDown,
                         429), counted from its first throttle answer; such answers spend
                         neither attempts nor the retry budget.
    pool_rate_fraction:  0 (off) to 1: with the peer index's Redis, a prefix's rate is shared
                         by the pool and kept below this fraction of the store's documented
                         rate (``docs/throttling.md``).
    connect_timeout:     seconds for TCP+TLS connect.
    read_timeout:        seconds without a byte before a request is abandoned.
    multipart_threshold: bytes; uploads at or above this use parallel multipart.
    multipart_part_size: bytes per part of a multipart upload.
    multipart_orphan_age: seconds; an open multipart upload of a key older than this is taken
                         for one a killed run left behind and aborted by the next upload of
                         that key (a younger one may be another writer's, still running).
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
    throttle_timeout: float = 300.0
    pool_rate_fraction: float = 0.0
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    multipart_threshold: int = 64 << 20
    multipart_part_size: int = 16 << 20
    multipart_orphan_age: float = 86400.0
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
        return lean.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None, *, config_file: bool = False) -> "Settings":
        """Defaults, then ``PEGASUS_CLOUDIO_*`` variables in ``env`` (default ``os.environ``);
        with ``config_file``, the config file's values where ``env`` leaves a knob unset
        (:func:`transfer.knobs.layered`; a mapping that function returned needs no second read)."""
        values = layered(env, config_file=config_file)
        changes: Dict[str, object] = {}
        for field in lean.fields(cls):
            name = PREFIX + field.name.upper()
            if name in values:
                changes[field.name] = _convert(name, values[name], field.default, origin_of(values, name))
        settings = cls(**changes)  # type: ignore[arg-type]
        settings.validate(values)
        return settings

    def validate(self, values: Optional[Mapping[str, str]] = None) -> None:
        """Raise InvalidInput naming the first field no setting can mean (and, given the
        ``values`` it was read from, their source)."""
        for field in lean.fields(self):
            problem = _problem(field.name, getattr(self, field.name))
            if problem:
                name = PREFIX + field.name.upper()
                raise InvalidInput(f"{name}{origin_of(values or {}, name)} {problem}", operation="config")


def parse_size(text: str) -> int:
    """``"8M"``, ``"64MiB"``, ``"1048576"`` -> bytes; ValueError for anything else."""
    body = text.strip().upper()
    body = body[:-1] if body.endswith("B") else body
    body = body[:-1] if body.endswith("I") else body
    unit = body[-1:] if body[-1:] in _UNITS else ""
    digits = body[:len(body) - len(unit)].strip()
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(text)
    return int(digits) * _UNITS.get(unit, 1)


def parse_seconds(text: str) -> float:
    """``"2.5"`` -> 2.5: a finite number; ValueError for anything else (``nan``, ``inf``, words)."""
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(text)
    return value


def parse_flag(text: str) -> bool:
    """``1/true/yes/on`` -> True, ``0/false/no/off`` -> False (any case); ValueError otherwise."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _problem(field: str, value: object) -> Optional[str]:
    """Why ``value`` of ``field`` means nothing, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value != value or value in (float("inf"), float("-inf")):  # NaN, infinity (no math import)
        return f"must be a finite number (got {value})"
    if field in _TIMEOUTS and not value > 0:
        return f"must be above 0 seconds (got {value})"
    if field in _DELAYS and value < 0:
        return f"must not be negative (got {value})"
    if field == "pool_rate_fraction" and not 0 <= value <= 1:
        return f"must be from 0 to 1 (got {value})"
    if field == "multipart_part_size" and value < 5 << 20:
        return "must be at least 5 MiB (S3 minimum)"
    if isinstance(value, int) and value < 1:
        return f"must be at least 1 (got {value})"
    return None


def _convert(name: str, raw: str, default: object, origin: str = "") -> object:
    try:
        if isinstance(default, bool):
            return parse_flag(raw)
        if isinstance(default, int):
            return parse_size(raw) if name.endswith(("_THRESHOLD", "_SIZE", "_BYTES")) else int(raw)
        if isinstance(default, float):
            return float(raw)
        return raw.strip() or None
    except ValueError:
        raise InvalidInput(f"invalid value {raw!r} for {name}{origin}", operation="config") from None
