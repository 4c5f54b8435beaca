"""Cache configuration: a frozen value object, read from ``PEGASUS_CLOUDIO_CACHE_*``.

``PEGASUS_CLOUDIO_CACHE_DIR``               directory; ``off`` disables the cache. Default:
                                            ``$XDG_CACHE_HOME/pegasus-cloudio`` or
                                            ``~/.cache/pegasus-cloudio``.
``PEGASUS_CLOUDIO_CACHE_MAX_BYTES``         size cap (``10G`` style sizes allowed). Default: 10 %
                                            of the filesystem or 10 GiB, whichever is smaller.
``PEGASUS_CLOUDIO_CACHE_HIGH_WATERMARK``    evict when the cache holds more than this x max.
``PEGASUS_CLOUDIO_CACHE_LOW_WATERMARK``     ... down to this x max.
``PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES``    never insert when the filesystem has less free.
``PEGASUS_CLOUDIO_CACHE_PIN_SECONDS``       entries handed out as symlinks are not evicted for
                                            this long after their last use.
``PEGASUS_CLOUDIO_CACHE_HARDLINK``          ``0`` to hand out copies instead of hard links.
``PEGASUS_CLOUDIO_CACHE_VERIFY_BYTES``      hits on entries up to this size re-check the SHA-256
                                            (default 1M; ``all``: every hit). A hit on a bigger
                                            entry re-hashes it only when its change time (ctime)
                                            moved since it was last known intact; ``pegasus-cloudio
                                            cache verify`` re-hashes everything (silent media
                                            errors change no ctime).
``PEGASUS_CLOUDIO_CACHE_UPLOADS``           ``1``: files jobs upload are written through into the
                                            cache; ``0``: never; ``auto`` (default): only when
                                            peer sharing is on (peers then serve them to other
                                            nodes). Each costs a few file creations on the node.
``PEGASUS_CLOUDIO_CACHE_FSYNC``             ``0`` to skip fsync of new entries (faster, but an
                                            entry may be lost - never wrong - after a power cut).
                                            Entries a hit re-hashes (``VERIFY_BYTES``) are never
                                            fsynced: damage from a power cut fails that hash.

:func:`config_from_env` reads the mapping it is given; where each value comes from (command
line > environment > config file > default) is :func:`transfer.knobs.layered`'s one rule.
"""

from __future__ import annotations

import os
from transfer.lean import record

from transfer.config import parse_flag, parse_seconds, parse_size
from transfer.errors import InvalidInput
from transfer.knobs import PREFIX, family, origin_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Mapping, Optional, TypeVar

OFF = "off"
DEFAULT_MAX_BYTES = 10 << 30
DEFAULT_FS_FRACTION = 0.10
DEFAULT_MIN_FREE_BYTES = 1 << 30
DEFAULT_VERIFY_BYTES = 1 << 20
VERIFY_ALL = "all"
_DEFAULT_VERIFY: Optional[int] = DEFAULT_VERIFY_BYTES
_ENV = PREFIX + "CACHE_"
if TYPE_CHECKING:
    _T = TypeVar("_T")
else:
    _T = object  # the alias above is for type checkers; typing is not imported at run time


@record(frozen=True)
class CacheConfig:
    """How one node cache behaves.

    directory:       where entries live; private to the user (0700).
    max_bytes:       size cap of the entries.
    high_watermark:  eviction starts when the entries exceed ``high_watermark * max_bytes``...
    low_watermark:   ...and removes least recently used entries not in use down to
                     ``low_watermark * max_bytes``.
    min_free_bytes:  free space the filesystem must keep; below it nothing is inserted and
                     transfers go uncached.
    pin_seconds:     an entry handed out as a symlink is not evicted for this long after its
                     last use (the job reads it after the transfer process has exited).
    hardlink:        hand out hard links when on the same filesystem (False: reflink or copy,
                     for jobs that modify their inputs in place).
    fsync:           fsync new entries before they become visible.
    uploads:         write uploaded files through into the cache: True, False, or None
                     (auto: only when the engine has peers, who can serve them to other nodes).
    verify_bytes:    a hit on an entry of at most this size re-hashes it against the SHA-256
                     recorded at insert (bit rot, tampering); a mismatch drops the entry and
                     the object is fetched again. None: every hit, any size. A hit on a bigger
                     entry re-hashes it when its ctime differs from the one recorded when it
                     was last known intact (any write, chmod or utime moves the ctime).
    """

    directory: str
    max_bytes: int
    high_watermark: float = 0.9
    low_watermark: float = 0.7
    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES
    pin_seconds: float = 3600.0
    hardlink: bool = True
    fsync: bool = True
    verify_bytes: Optional[int] = DEFAULT_VERIFY_BYTES
    uploads: Optional[bool] = None

    def __post_init__(self) -> None:
        if not self.directory:
            raise InvalidInput(f"{_ENV}DIR must not be empty", operation="config")
        if self.max_bytes < 1:
            raise InvalidInput(f"{_ENV}MAX_BYTES must be at least 1", operation="config")
        if not 0.0 < self.low_watermark <= self.high_watermark <= 1.0:
            raise InvalidInput(f"cache watermarks must satisfy 0 < low <= high <= 1, got "
                               f"{self.low_watermark} and {self.high_watermark}", operation="config")
        if self.min_free_bytes < 0 or self.pin_seconds < 0 or (self.verify_bytes or 0) < 0:
            raise InvalidInput(f"{_ENV}MIN_FREE_BYTES, {_ENV}PIN_SECONDS and {_ENV}VERIFY_BYTES must not be "
                               "negative", operation="config")

    def verifies(self, size: int) -> bool:
        """Whether a hit on an entry of ``size`` bytes re-hashes it."""
        return self.verify_bytes is None or size <= self.verify_bytes

    @property
    def high_bytes(self) -> int:
        return int(self.high_watermark * self.max_bytes)

    @property
    def low_bytes(self) -> int:
        return int(self.low_watermark * self.max_bytes)


def default_directory(env: Mapping[str, str]) -> str:
    """``$XDG_CACHE_HOME/pegasus-cloudio``, else ``$HOME/.cache/pegasus-cloudio``."""
    base = env.get("XDG_CACHE_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pegasus-cloudio")


def default_max_bytes(directory: str) -> int:
    """10 % of the filesystem holding ``directory`` (or its nearest existing parent), at most 10 GiB."""
    probe = os.path.abspath(directory)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe)
    except OSError:
        return DEFAULT_MAX_BYTES
    return max(1, min(DEFAULT_MAX_BYTES, int(st.f_blocks * st.f_frsize * DEFAULT_FS_FRACTION)))


def config_from_env(env: Mapping[str, str]) -> Optional[CacheConfig]:
    """The configuration ``PEGASUS_CLOUDIO_CACHE_*`` describes, or None when it is ``off``.

    Raises InvalidInput naming the variable for a malformed value.
    """
    raw = _raw(env)
    directory = raw.get("DIR") or default_directory(env)
    if directory.lower() == OFF:
        return None
    directory = os.path.abspath(os.path.expanduser(directory))
    return CacheConfig(
        directory=directory,
        max_bytes=(_number(raw, "MAX_BYTES", parse_size, 0) if "MAX_BYTES" in raw
                   else default_max_bytes(directory)),
        high_watermark=_number(raw, "HIGH_WATERMARK", float, 0.9),
        low_watermark=_number(raw, "LOW_WATERMARK", float, 0.7),
        min_free_bytes=_number(raw, "MIN_FREE_BYTES", parse_size, DEFAULT_MIN_FREE_BYTES),
        pin_seconds=_number(raw, "PIN_SECONDS", parse_seconds, 3600.0),
        hardlink=_flag(raw, "HARDLINK", True),
        fsync=_flag(raw, "FSYNC", True),
        verify_bytes=_number(raw, "VERIFY_BYTES", _verify_limit, _DEFAULT_VERIFY),
        uploads=_auto_flag(raw, "UPLOADS"),
    )


def uploads_setting(env: Mapping[str, str]) -> Optional[bool]:
    """``PEGASUS_CLOUDIO_CACHE_UPLOADS`` alone (what :func:`config_from_env` puts in
    ``uploads``), read without the rest. Raises InvalidInput naming it when malformed."""
    return _auto_flag(_raw(env), "UPLOADS")


def _raw(env: Mapping[str, str]) -> Dict[str, str]:
    return family(env, _ENV)


def _number(raw: Mapping[str, str], name: str, convert: Callable[[str], _T], default: _T) -> _T:
    if name not in raw:
        return default
    try:
        return convert(raw[name])
    except ValueError:
        raise InvalidInput(f"invalid value {raw[name]!r} for {_ENV}{name}{origin_of(raw, name)}",
                           operation="config") from None


def _verify_limit(text: str) -> Optional[int]:
    return None if text.strip().lower() == VERIFY_ALL else parse_size(text)


def _auto_flag(raw: Mapping[str, str], name: str) -> Optional[bool]:
    """``auto`` (or unset) -> None; ``1/true/yes/on`` -> True; ``0/false/no/off`` -> False."""
    value = raw.get(name, "auto").lower()
    if value == "auto":
        return None
    if value in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value in ("1", "true", "yes", "on")
    raise InvalidInput(f"{_ENV}{name}{origin_of(raw, name)} must be auto, 1 or 0 (got {raw[name]!r})",
                       operation="config")


def _flag(raw: Mapping[str, str], name: str, default: bool) -> bool:
    return _number(raw, name, parse_flag, default)
