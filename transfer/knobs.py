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
drop-in reads it before deciding whether to hand its job to a stager. The settings a backend's
own modules read are rows of its scheme in :mod:`transfer.schemes` (a new backend touches no
list here), imported when a name that is no general knob is looked up (:data:`TABLE` and
:data:`KNOWN` hold both).
"""

from __future__ import annotations

import os
TYPE_CHECKING = False  # typing is not imported at run time (start-up time of the drop-in)
if TYPE_CHECKING:
    from typing import Dict, FrozenSet, Mapping, Optional, Tuple

    Row = Tuple[str, str, str, str, str]
    TABLE: Tuple[Row, ...]  # every knob: GENERAL, then each scheme's (module __getattr__)
    KNOWN: FrozenSet[str]  # PREFIX + the name of each row of TABLE

PREFIX = "PEGASUS_CLOUDIO_"
CONFIG_VAR = PREFIX + "CONFIG"
MAX_CONFIG_BYTES = 1 << 20

_EF = "env, file"
# Every general knob: (NAME, default, unit, sources, what it does); a scheme's own are in its row of
# transfer.schemes. docs/knobs.md is generated from both (``python -m transfer.knobs``,
# tests/test_knobs.py fails when they differ), and tests check the defaults against the objects
# that read them. "env": the environment (Pegasus env profiles, a job's environment); "file": the
# config file; a command's option is named where it has one.
GENERAL = (
    ("THREADS", "8", "transfers", "env, file, `pegasus-cloudio-s3 -p`; drop-in `--threads` below it",
     "concurrent transfers, and connections kept per endpoint"),
    ("MAX_ATTEMPTS", "3", "tries", "env, file, drop-in `-m`", "tries per file before it is reported failed"),
    ("RETRY_BASE_DELAY", "0.5", "s", _EF, "the first retry waits up to this (full jitter, doubling)"),
    ("RETRY_MAX_DELAY", "20", "s", _EF, "cap of one wait between attempts"),
    ("THROTTLE_TIMEOUT", "300", "s", _EF,
     "a file the store throttles (503 SlowDown, 429) is retried this long from its first throttle answer, "
     "spending neither attempts nor the retry budget (docs/throttling.md)"),
    ("POOL_RATE_FRACTION", "0", "fraction", _EF,
     "above 0 (up to 1), with `P2P_REDIS`: one request rate per prefix for the whole pool, kept below this "
     "fraction of the store's documented rate (docs/throttling.md); 0: off"),
    ("PACE_TRACE", "off", "directory", "env",
     "a debugging trace: each job appends its pacing events (requests sent, throttle answers, cuts) to "
     "DIRECTORY/PID.trace (transfer/pacing_trace.py, `bench throttle --trace`)"),
    ("CONNECT_TIMEOUT", "10", "s", _EF, "TCP and TLS connect"),
    ("READ_TIMEOUT", "60", "s", _EF, "without a byte, a request is abandoned"),
    ("MULTIPART_THRESHOLD", "64M", "bytes", "env, file, `pegasus-cloudio-s3 -c`",
     "uploads at or above this go as parallel multipart uploads"),
    ("MULTIPART_PART_SIZE", "16M", "bytes", "env, file, `pegasus-cloudio-s3 -c`", "bytes per part of a multipart upload"),
    ("MULTIPART_ORPHAN_AGE", "86400", "s", _EF,
     "an open multipart upload of a key older than this is taken for one a killed run left and aborted by "
     "the next upload of the key (docs/dropin.md)"),
    ("DOWNLOAD_PART_SIZE", "16M", "bytes", _EF, "bytes per ranged GET; objects of twice this or more download in parallel ranges"),
    ("CA_BUNDLE", "system CAs", "path", _EF, "PEM file of CAs that verify TLS instead of the system store"),
    ("GCS_ENDPOINT", "Google's", "URL", _EF, "GCS JSON API endpoint (an emulator); `STORAGE_EMULATOR_HOST` also works"),
    ("SSH_KNOWN_HOSTS", "unset", "path", _EF, "known_hosts file; when set, SSH host keys must match it"),
    ("BUNDLE", "0", "flag", _EF, "pack batches of small uploads into bundles, for every destination site"),
    ("BUNDLE_SITES", "unset", "site labels", _EF, "comma-separated destination sites that get bundles"),
    ("BUNDLE_MIN_FILES", "8", "files", _EF, "fewest small files bound for one directory worth a bundle"),
    ("BUNDLE_MAX_MEMBER_SIZE", "1M", "bytes", _EF, "larger files go up as plain objects"),
    ("BUNDLE_MAX_SIZE", "64M", "bytes", _EF, "a batch larger than this is split into several bundles"),
    ("CACHE_DIR", "`$XDG_CACHE_HOME/pegasus-cloudio` else `~/.cache/pegasus-cloudio`", "path",
     "env, file, `pegasus-cloudio cache --dir`", "the node cache's directory; `off` disables it"),
    ("CACHE_MAX_BYTES", "10 % of the filesystem, at most 10G", "bytes", "env, file, `pegasus-cloudio cache --max-bytes`",
     "size cap of the node cache"),
    ("CACHE_HIGH_WATERMARK", "0.9", "x max", _EF, "eviction starts above this share of the cap"),
    ("CACHE_LOW_WATERMARK", "0.7", "x max", _EF, "eviction removes entries down to this share"),
    ("CACHE_MIN_FREE_BYTES", "1G", "bytes", _EF, "below this much free space nothing is inserted"),
    ("CACHE_PIN_SECONDS", "3600", "s", _EF, "an entry handed out as a symlink is kept this long after its last use"),
    ("CACHE_HARDLINK", "1", "flag", _EF, "hand out hard links (0: copies, for jobs that modify inputs in place)"),
    ("CACHE_FSYNC", "1", "flag", _EF, "fsync new entries before they become visible"),
    ("CACHE_VERIFY_BYTES", "1M", "bytes or `all`", _EF, "hits on entries up to this size re-check their SHA-256"),
    ("CACHE_UPLOADS", "auto", "flag or `auto`", _EF, "write uploaded files through into the cache (auto: with peers)"),
    ("P2P_REDIS", "unset (no sharing)", "URL", _EF, "`redis://` or `rediss://` of the peer replica index"),
    ("P2P_CLUSTER", "0", "flag", _EF, "the index address is a Redis Cluster node"),
    ("P2P_NAMESPACE", "pcio", "text", _EF, "prefix of every index key (one per pool)"),
    ("P2P_TOKEN", "unset", "text", _EF, "the pool's bearer token (prefer `P2P_TOKEN_FILE`)"),
    ("P2P_TOKEN_FILE", "unset", "path", _EF, "file holding the pool's bearer token, mode 0600"),
    ("P2P_CA_FILE", "unset", "path", _EF, "PEM of the pool CA that signed the daemons' certificates"),
    ("P2P_PLAIN_HTTP", "0", "flag", _EF, "allow `http://` peers (trusted networks only)"),
    ("P2P_NETWORKS", "loopback and private ranges", "CIDRs", _EF, "networks peers must be in"),
    ("P2P_NODE", "the host name", "text", _EF, "this node's name in the index"),
    ("P2P_RACK", "unset", "text", _EF, "this node's rack (same host, then rack, preferred)"),
    ("P2P_CONNECT_TIMEOUT", "0.5", "s", _EF, "connect to a peer (TCP and TLS)"),
    ("P2P_FIRST_BYTE_TIMEOUT", "1", "s", _EF, "from request to a peer's response headers"),
    ("P2P_READ_TIMEOUT", "5", "s", _EF, "without a byte in a peer's body"),
    ("P2P_CLAIM_SECONDS", "10", "s", _EF, "a node fetching a file claims it this long; others wait for its replica"),
    ("P2P_MAX_PEERS", "3", "peers", _EF, "peers tried per file before the store"),
    ("P2P_BIND", "required", "address:port", _EF, "`pegasus-cloudio serve`: where it listens"),
    ("P2P_CERT", "required unless plain http", "path", _EF, "`serve`: PEM certificate chain signed by the pool CA"),
    ("P2P_KEY", "required unless plain http", "path", _EF, "`serve`: its private key"),
    ("P2P_USERS", "required", "users", _EF, "`serve`: `user` or `user=/cache/dir` whose caches are served"),
    ("P2P_URL", "`https://<bind address>`", "URL", _EF, "`serve`: scheme and host name peers use"),
    ("P2P_MAX_SERVES", "32", "serves", _EF, "`serve`: concurrent serves before answering 503"),
    ("P2P_MAX_CONNECTIONS", "256", "connections", _EF, "`serve`: open connections per served user"),
    ("P2P_HEARTBEAT_TTL", "30", "s", _EF, "`serve`: a heartbeat keeps the node alive in the index this long"),
    ("P2P_SUMMARY_MAX", "50000", "ids", "env, file, `cache-summary --max`", "cap on the ids a cache summary publishes"),
    ("STAGER", "unset", "path", _EF, "the node stager's socket: jobs hand their transfers to it"),
    ("STOCK_TRANSFER", "`pegasus-transfer` in `$PEGASUS_HOME/bin` or on PATH", "path", _EF,
     "the stock tool that serves the schemes the drop-in does not"),
    ("CONFIG", "`~/.pegasus/cloudio.conf`", "path", "env", "the config file"),
    ("CONDOR_METHODS", "every scheme served", "schemes", "env, the plugin's node file",
     "the HTCondor plugin's `SupportedMethods`, narrowed"),
    ("CONDOR_CONFIG", "`/etc/pegasus-cloudio/condor-plugin.conf`", "path", "env", "the HTCondor plugin's node file"),
)
_GENERAL_NAMES = frozenset(PREFIX + row[0] for row in GENERAL)
_all: "Optional[Tuple[Tuple[Row, ...], FrozenSet[str]]]" = None


def _every() -> "Tuple[Tuple[Row, ...], FrozenSet[str]]":
    """(TABLE, KNOWN), made at first use: the schemes' rows import :mod:`transfer.schemes`."""
    global _all
    if _all is None:
        from transfer.schemes import knob_rows
        table = GENERAL + knob_rows()
        _all = table, frozenset(PREFIX + row[0] for row in table)
    return _all


def __getattr__(name: str) -> object:
    """``TABLE`` (every knob's row) and ``KNOWN`` (every knob's name: the docs name each;
    tests/test_knob_values.py), made at first use."""
    if name == "TABLE":
        return _every()[0]
    if name == "KNOWN":
        return _every()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_known(name: str) -> bool:
    """Whether ``name`` is a knob's (``PREFIX + NAME``); a general knob's without importing the schemes."""
    return name in _GENERAL_NAMES or name in _every()[1]


# PEGASUS_CLOUDIO_* names that are no knob: the test bed's (bench/pegasus_cloudio_testbed), not warned about
NOT_KNOBS = frozenset(PREFIX + name for name in (
    "TOOLS_DIR", "POOL_DIR", "POOL_CACHE", "KEEP_POOL", "PEGASUS_DIR", "PEGASUS_TARBALL"))
ENVIRONMENT = "the environment"
COMMAND_LINE = "the command line"

__all__ = ["COMMAND_LINE", "CONFIG_VAR", "ENVIRONMENT", "GENERAL", "KNOWN", "PREFIX", "TABLE", "Knobs",
           "config_file_path", "family", "is_known", "layered", "markdown", "origin_of", "read_config_file", "story", "uncommented", "unknown_names"]


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
        if not is_known(name):  # a typo would otherwise be a knob silently ignored
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
    if not isinstance(source, Knobs):  # a Knobs was layered (and warned about) already
        _warn_unknown(source)
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


SECRETS = frozenset({PREFIX + "P2P_TOKEN"})  # never written out, not even by -d


def story(knobs: "Mapping[str, str]") -> "list[str]":
    """What ``-d`` says of the settings: one ``NAME=value (from SOURCE)`` line per knob set,
    in name order; a secret's value is never shown."""
    origins = knobs.origins if isinstance(knobs, Knobs) else {}
    return [f"{name}={'***' if name in SECRETS else knobs[name]} (from {origins.get(name, ENVIRONMENT)})"
            for name in sorted(knobs) if name.startswith(PREFIX) and is_known(name)]


_warned: "set[str]" = set()  # once a process: the drop-in layers its environment twice (stager check, run)


def unknown_names(env: "Mapping[str, str]") -> "Dict[str, str]":
    """``PEGASUS_CLOUDIO_*`` names of ``env`` that no reader knows (a typo silently ignored
    otherwise), each with the closest known name (``""`` when none is close)."""
    found = sorted(name for name in env if name.startswith(PREFIX) and name not in NOT_KNOBS and not is_known(name))
    if not found:
        return {}
    import difflib  # only when there is a typo to name: start-up time
    return {name: next(iter(difflib.get_close_matches(name, sorted(_every()[1]), n=1, cutoff=0.8)), "")
            for name in found}


def _warn_unknown(env: "Mapping[str, str]") -> None:
    """One warning line per unknown name, once a process (see :func:`unknown_names`)."""
    for name, closest in unknown_names(env).items():
        if name in _warned:
            continue
        _warned.add(name)
        hint = f"; did you mean {closest}?" if closest else " (the settings are listed in docs/knobs.md)"
        import logging
        logging.getLogger("transfer.config").warning("%s in the environment is no setting and is ignored%s",
                                                     name, hint)


def _invalid(message: str) -> Exception:
    from transfer.errors import InvalidInput
    return InvalidInput(message, operation="config")


def markdown() -> str:
    """docs/knobs.md: the table of every knob, from :data:`GENERAL` and the schemes' rows."""
    head = ["# Settings (knobs)", "",
            "Generated from `transfer/knobs.py` and `transfer/schemes.py` by `python -m transfer.knobs > docs/knobs.md`;",
            "do not edit.", "",
            "Every setting is named `PEGASUS_CLOUDIO_<NAME>`. Its value is the first of: the command's option",
            "(where it has one), the environment (Pegasus `env` profiles), the config file (`NAME = value` lines",
            "in `$PEGASUS_CLOUDIO_CONFIG`, default `~/.pegasus/cloudio.conf`), the default. A misspelt name is",
            "an error in the config file and one warning line naming the closest setting in the environment.",
            "Sizes take `K`, `M`, `G`, `T` (powers of 1024); flags take `1/true/yes/on` and `0/false/no/off`.", ""]
    columns = ["| name | default | unit | sources | what it does |", "|---|---|---|---|---|"]

    def rows(table: "Tuple[Row, ...]") -> "list[str]":
        return [f"| `{PREFIX}{name}` | {default} | {unit} | {sources} | {what} |"
                for name, default, unit, sources, what in table]

    own = ["", "## Settings of one kind of store", "",
           "Read by that backend's own modules; each is in its scheme's row of `transfer/schemes.py`.", ""]
    return "\n".join(head + columns + rows(GENERAL) + own + columns + rows(_every()[0][len(GENERAL):])) + "\n"


if __name__ == "__main__":
    import sys
    sys.stdout.write(markdown())
