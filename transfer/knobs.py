"""Where every setting comes from: one layer, one precedence, for every command and the library.

Every knob is named ``PEGASUS_CLOUDIO_<NAME>``. Its value is the first of these that sets it
(an empty value counts as unset):

1. the command line, where a command has an option for the knob (``-m`` is
   ``MAX_ATTEMPTS``, ``pegasus-cloudio cache --dir`` is ``CACHE_DIR``, ...);
2. the environment (Pegasus ``env`` profiles, HTCondor job environments);
3. the config file: ``NAME = value`` lines (``#`` starts a comment) in the file named by
   ``PEGASUS_CLOUDIO_CONFIG`` (environment only), default ``~/.pegasus/cloudio.conf``;
4. the knob's default, applied by the object that reads it (:class:`transfer.Settings`,
   :class:`transfer.cache.CacheConfig`, ...).

The commands read the config file. The library reads it only when asked
(``Settings.from_env(config_file=True)``, or :func:`layered` with ``config_file=True``): a
program importing ``transfer`` is configured by its arguments and environment, never by a
file in the home directory it did not name. In the library, explicit arguments (a
``Settings`` value, keyword arguments) win over the environment.

A missing default file is no file. An unreadable default file (permissions, a directory) is
skipped with one warning, so a transfer that needs none of its settings still runs; a file
named by ``PEGASUS_CLOUDIO_CONFIG`` that cannot be read, and a malformed line or a byte that
is not UTF-8 in any config file, raise :class:`~transfer.errors.InvalidInput` naming the file
(a file is read as :mod:`transfer.named_files` reads what others name: a FIFO, a device,
another user's link or more than :data:`MAX_CONFIG_BYTES` is a file that cannot be read)
(and line); so does a name no reader knows (not in :data:`KNOWN`: a typo). A value that is there but means nothing is refused by its reader, naming the knob
and, through :func:`origin_of`, the source it came from. This module imports only ``os`` (and
:mod:`transfer.named_files` when it reads the file): the
drop-in reads it before deciding whether to hand its job to a stager.
"""

from __future__ import annotations

import os
TYPE_CHECKING = False  # typing is not imported at run time (start-up time of the drop-in)
if TYPE_CHECKING:
    from typing import Dict, Mapping, Optional

PREFIX = "PEGASUS_CLOUDIO_"
CONFIG_VAR = PREFIX + "CONFIG"
MAX_CONFIG_BYTES = 1 << 20

KNOWN = frozenset(PREFIX + name for name in (  # every knob the docs name (tests/test_knob_values.py)
    "THREADS", "MAX_ATTEMPTS", "RETRY_BASE_DELAY", "RETRY_MAX_DELAY", "THROTTLE_TIMEOUT", "POOL_RATE_FRACTION", "CONNECT_TIMEOUT", "READ_TIMEOUT",
    "MULTIPART_THRESHOLD", "MULTIPART_PART_SIZE", "DOWNLOAD_PART_SIZE", "CA_BUNDLE", "GCS_ENDPOINT",
    "GCS_ANONYMOUS", "SSH_KNOWN_HOSTS", "BUNDLE", "BUNDLE_SITES", "BUNDLE_MIN_FILES", "BUNDLE_MAX_MEMBER_SIZE",
    "BUNDLE_MAX_SIZE", "CACHE_DIR", "CACHE_MAX_BYTES", "CACHE_HIGH_WATERMARK", "CACHE_LOW_WATERMARK",
    "CACHE_MIN_FREE_BYTES", "CACHE_PIN_SECONDS", "CACHE_HARDLINK", "CACHE_FSYNC", "CACHE_VERIFY_BYTES",
    "CACHE_UPLOADS", "P2P_REDIS", "P2P_CLUSTER", "P2P_NAMESPACE", "P2P_TOKEN", "P2P_TOKEN_FILE", "P2P_CA_FILE",
    "P2P_PLAIN_HTTP", "P2P_NETWORKS", "P2P_NODE", "P2P_RACK", "P2P_CONNECT_TIMEOUT", "P2P_FIRST_BYTE_TIMEOUT",
    "P2P_READ_TIMEOUT", "P2P_CLAIM_SECONDS", "P2P_MAX_PEERS", "P2P_BIND", "P2P_CERT", "P2P_KEY", "P2P_USERS",
    "P2P_URL", "P2P_MAX_SERVES", "P2P_MAX_CONNECTIONS", "P2P_HEARTBEAT_TTL", "P2P_SUMMARY_MAX", "STAGER",
    "STOCK_TRANSFER", "CONFIG", "CONDOR_METHODS", "CONDOR_CONFIG"))
ENVIRONMENT = "the environment"
COMMAND_LINE = "the command line"

__all__ = ["COMMAND_LINE", "CONFIG_VAR", "ENVIRONMENT", "KNOWN", "PREFIX", "Knobs", "config_file_path", "family",
           "layered", "origin_of", "read_config_file", "uncommented"]


class Knobs(dict[str, str]):
    """What :func:`layered` returns: the merged mapping, and ``origins``, where each knob's value
    came from (``"the environment"``, ``"config file PATH line N"``, ``"the command line"``, or
    what a caller such as the HTCondor plugin says)."""

    def __init__(self, values: "Mapping[str, str]", origins: "Optional[Mapping[str, str]]" = None) -> None:
        super().__init__(values)
        self.origins: "Dict[str, str]" = dict(origins or {})


def origin_of(values: "Mapping[str, str]", name: str) -> str:
    """`` (from SOURCE)`` for knob ``name`` of a :class:`Knobs` mapping, for error messages;
    ``""`` when the mapping does not know (a plain mapping, e.g. a library caller's)."""
    source = values.origins.get(name) if isinstance(values, Knobs) else None
    return f" (from {source})" if source else ""


def family(env: "Mapping[str, str]", prefix: str) -> Knobs:
    """The knobs of ``env`` named ``prefix + NAME``, as ``NAME -> value`` (stripped; empty ones
    dropped), with their origins, so that a reader's message can say where a bad one came from."""
    known = env.origins if isinstance(env, Knobs) else {}
    values = {name[len(prefix):]: value.strip() for name, value in env.items()
              if name.startswith(prefix) and value.strip()}
    return Knobs(values, {name[len(prefix):]: known[name] for name in known if name.startswith(prefix)})


def config_file_path(env: "Mapping[str, str]") -> "tuple[str, bool]":
    """(path of the config file, whether ``PEGASUS_CLOUDIO_CONFIG`` named it)."""
    named = (env.get(CONFIG_VAR) or "").strip()
    if named:
        return named, True
    home = env.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".pegasus", "cloudio.conf"), False


def read_config_file(env: "Mapping[str, str]") -> "Dict[str, str]":
    """The file's ``PEGASUS_CLOUDIO_*`` values (empty ones dropped); ``{}`` when there is no file
    or the default one cannot be read. Raises InvalidInput as the module docstring says."""
    return {name: value for name, (value, _) in _read(env)[1].items()}


def _read(env: "Mapping[str, str]") -> "tuple[str, Dict[str, tuple[str, int]]]":
    """(the file's path, ``name -> (value, line number)``) as :func:`read_config_file` reads it."""
    path, named = config_file_path(env)
    from transfer.named_files import OWN_LINKS, is_missing, read_file
    try:
        data = read_file(path, MAX_CONFIG_BYTES, OWN_LINKS)[0]
    except OSError as err:
        if named:
            reason = "not found" if is_missing(err) else err.strerror
            raise _invalid(f"cannot read config file {path} (named by {CONFIG_VAR}): {reason}") from None
        if not is_missing(err):  # e.g. a daemon's HOME=/root seen by a job's user
            import logging
            logging.getLogger("transfer.config").warning("ignoring config file %s: %s", path, err.strerror)
        return path, {}
    return path, _parse(data, path)


def uncommented(line: str) -> str:
    """A configuration line without its comment, stripped: ``#`` starts one at the line's start
    or after a blank; inside a value (``/data/run#1``) it is the value's."""
    if line.lstrip().startswith("#"):
        return ""
    for blank in (" #", "\t#"):
        line = line.split(blank, 1)[0]
    return line.strip()


def _parse(data: bytes, path: str) -> "Dict[str, tuple[str, int]]":
    values: "Dict[str, tuple[str, int]]" = {}
    for number, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise _invalid(f"config file {path} line {number}: not UTF-8 text (byte {err.start + 1} of the line)") from None
        text = uncommented(line)
        if not text:
            continue
        name, sep, value = text.partition("=")
        name = name.strip()
        if not sep or not name.startswith(PREFIX) or not name[len(PREFIX):].replace("_", "").isalnum():
            raise _invalid(f"config file {path} line {number}: expected {PREFIX}NAME = value")
        if name == CONFIG_VAR:
            raise _invalid(f"config file {path} line {number}: {CONFIG_VAR} is read from the environment only")
        if name not in KNOWN:  # a typo would otherwise be a knob silently ignored
            raise _invalid(f"config file {path} line {number}: no setting is named {name}")
        if value.strip():
            values[name] = (value.strip(), number)
    return values


def layered(env: "Optional[Mapping[str, str]]" = None, *, config_file: bool,
            command_line: "Optional[Mapping[str, Optional[str]]]" = None) -> Knobs:
    """``env`` (default ``os.environ``) as every reader of settings sees it: the config file's
    knobs filled in where the environment leaves them unset (with ``config_file``), then the
    command line's values (None: the option was not given) on top. Other variables pass as is.
    The result's ``origins`` name each knob's source (those of ``env`` when it is a Knobs).
    """
    source = os.environ if env is None else env
    merged = Knobs({name: value for name, value in source.items()
                    if not (name.startswith(PREFIX) and not value.strip())})
    known = source.origins if isinstance(source, Knobs) else {}
    merged.origins = {name: known.get(name, ENVIRONMENT) for name in merged if name.startswith(PREFIX)}
    if config_file:
        path, values = _read(source)
        for name, (value, number) in values.items():
            if name not in merged:
                merged[name] = value
                merged.origins[name] = f"config file {path} line {number}"
    for name, given in (command_line or {}).items():
        if given is not None and given.strip():
            merged[name] = given
            merged.origins[name] = COMMAND_LINE
    return merged


def _invalid(message: str) -> Exception:
    from transfer.errors import InvalidInput
    return InvalidInput(message, operation="config")
