"""``pegasus-cloudio-transfer``: a drop-in for Pegasus's ``pegasus-transfer`` (5.x).

Same options (``-f -m -n -s -d``), same inputs (v1 text or JSON on stdin or ``-f``), same
exit codes (0 all succeeded, 1 anything failed, 2 usage), same log format and final lines,
same integrity data and monitoring records. Transfers run in this one process on the
``transfer`` engine; schemes without a native backend go to the stock tool in one call.

Settings: the one rule of :mod:`transfer.knobs` (command line > environment > config file >
default); ``-m`` is ``PEGASUS_CLOUDIO_MAX_ATTEMPTS``. One exception, for threads:
``--threads`` is what the Pegasus planner passes (``1`` to PegasusLite jobs, unasked), so it is
a default, not a choice: ``PEGASUS_CLOUDIO_THREADS`` (environment, then config file) wins over
it; then ``--threads``, then ``PEGASUS_TRANSFER_THREADS``, then 8.
"""

from __future__ import annotations

import os
import sys
import time

from pegasus_cloudio.dropin.log import DEBUG, log

# Every job step pays what this module imports, so it imports only what a job uses, when it
# uses it: argparse for --help and unusual command lines, the engine when there is something
# to transfer, the node cache, peers, reporting and integrity steps when they are on.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

    from pegasus_cloudio.dropin import reporting
    from pegasus_cloudio.dropin.monitoring import AttemptRecord
    from pegasus_cloudio.dropin.signals import Interrupts
    from pegasus_cloudio.dropin.spec import Entry
    from transfer import Result, Session, Settings
    from transfer.cache import NodeCache
    from transfer.p2p.source import PeerIndexSource

SEPARATOR = "-" * 80
_VALUED = {"-f": "file", "--file": "file", "-m": "max_attempts", "--max-attempts": "max_attempts",
           "-n": "threads", "--threads": "threads"}
_FLAGS = {"-s": "symlink", "--symlink": "symlink", "-d": "debug", "--debug": "debug"}


class Options:
    """The parsed command line (what ``build_parser`` gives, without argparse)."""

    def __init__(self) -> None:
        self.file: "Optional[str]" = None
        self.max_attempts: "Optional[int]" = None  # PEGASUS_CLOUDIO_MAX_ATTEMPTS, else 3
        self.threads = 0
        self.symlink = False
        self.debug = False


def parse_args(argv: "Sequence[str]") -> "Options | argparse.Namespace":
    """The options of ``argv``: the common forms (``-f F``, ``--threads=5``, ``-s``...) here,
    anything else (``--help``, ``--version``, errors, abbreviations) by :func:`build_parser`."""
    options = Options()
    words = list(argv)
    while words:
        word = words.pop(0)
        name, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        if name in _FLAGS and not eq:
            setattr(options, _FLAGS[name], True)
            continue
        if name not in _VALUED or (not eq and (not words or words[0].startswith("-"))):
            return build_parser().parse_args(argv)
        value = value if eq else words.pop(0)
        dest = _VALUED[name]
        if dest == "file":
            options.file = value
            continue
        try:
            setattr(options, dest, int(value))
        except ValueError:
            return build_parser().parse_args(argv)
    return options


def build_parser() -> "argparse.ArgumentParser":
    import argparse

    from pegasus_cloudio.version import plain, version_line

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            self.print_usage(sys.stderr)
            self.exit(2, f"{self.prog}: error: {message}\n")

    parser = _Parser(prog="pegasus-transfer", description=plain(__doc__.splitlines()[0]))
    parser.add_argument("-f", "--file", help="read the transfer specification from FILE (default: stdin)")
    parser.add_argument("-m", "--max-attempts", type=int, default=None,
                        help="attempts per transfer (default: PEGASUS_CLOUDIO_MAX_ATTEMPTS, else 3)")
    parser.add_argument("-n", "--threads", type=int, default=0,
                        help="concurrent transfers (default: PEGASUS_CLOUDIO_THREADS from the environment "
                             "or config file, which wins over this flag, else this, else "
                             "PEGASUS_TRANSFER_THREADS, else 8)")
    parser.add_argument("-s", "--symlink", action="store_true", help="symlink local-to-local copies")
    parser.add_argument("-d", "--debug", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=version_line("pegasus-cloudio-transfer"))
    return parser


def effective_threads(cli_threads: int, env: "Mapping[str, str]") -> int:
    """The thread count; ConfigError names the environment variable when its value is not a count."""
    for name in ("PEGASUS_CLOUDIO_THREADS", "--threads", "PEGASUS_TRANSFER_THREADS"):
        value = str(cli_threads or "") if name == "--threads" else env.get(name, "").strip()
        if not value:
            continue
        try:
            threads = int(value)
        except ValueError:
            threads = 0
        if threads <= 0:
            from transfer.errors import ConfigError
            from transfer.knobs import origin_of
            raise ConfigError(f"{name}{origin_of(env, name)} must be a whole number above 0 (got {value!r})",
                              operation="parse")
        return threads
    return 8


def main(argv: "Optional[Sequence[str]]" = None, env: "Optional[Mapping[str, str]]" = None,
         stdin: "Optional[TextIO]" = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ) if env is None else dict(env)
    log.setup(args.debug, sys.stderr)
    from pegasus_cloudio.dropin.signals import Interrupts
    try:
        with Interrupts(log) as interrupts:
            code = _run(args, env, stdin or sys.stdin, interrupts)
    except KeyboardInterrupt:
        log.critical("Exiting due to signal 2")
        return 1
    insert_behind()
    return code


_collecting_here = False  # this run queued its bundle members' cache inserts (see insert_behind)


def insert_behind() -> None:
    """The node-cache inserts of bundle members this run queued (:mod:`transfer.cache.behind`),
    made once the job's files are all in place and its summary written: by a child process, so
    the job does not wait for them (its exit, its next step). The child writes to nothing of
    the job's (its standard streams are ``/dev/null``, the job's descriptors closed, its working
    directory ``/``: the cache's paths are absolute; this process returns once the child has
    left, :func:`_wait_until_left`), stays in
    the job's process group (a job's end or removal ends it too), and a child killed half-way
    leaves no entry a later job would trust (``tests/test_cache_members.py``): what it does
    not insert is only a later miss. Inserts are made here, before returning, when a fork
    fails. Nothing happens in a node stager's copy, which drains after its answer itself."""
    global _collecting_here
    if not _collecting_here:
        return
    _collecting_here = False
    from transfer.cache import behind
    if not behind.pending():
        behind.abandon()
        return
    from pegasus_cloudio.ending import flush_standard_streams
    flush_standard_streams()  # one that cannot be flushed is the exit's to report (120), as without inserts
    try:
        left = os.pipe()  # the child's end closes when it has left the job (see below)
    except OSError:
        behind.drain()
        return
    try:
        pid = os.fork()
    except OSError:
        os.close(left[0])
        os.close(left[1])
        behind.drain()
        return
    if pid:
        behind.abandon()
        _wait_until_left(left)
        return
    try:
        leave_the_job()
        os.closerange(3, max(1 << 16, os.sysconf("SC_OPEN_MAX")))  # none of the job's descriptors stay open
        behind.drain()
    finally:
        os._exit(0)


def _wait_until_left(left: "Tuple[int, int]") -> None:
    """Return once the inserting child holds nothing of the job's: it closes every descriptor,
    its end of the pipe ``left`` too, after leaving the job's directory, so end of file here
    means it has (or that it died). Without this wait the command could exit while the child,
    not yet run, still had the job's directory and descriptors, and a scratch mount removed
    at the job's end was busy."""
    os.close(left[1])
    try:
        while os.read(left[0], 1):
            pass
    finally:
        os.close(left[0])


def leave_the_job() -> None:
    """For a process that goes on after the job's answer (the inserts after it): the standard
    streams become ``/dev/null`` (a reader of the job's stdout or stderr sees their end when the
    job's command exits, and nothing written later lands there) and the working directory ``/``
    (the job's scratch mount can be removed at its end)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if devnull > 2:
        os.close(devnull)
    os.chdir("/")


def _run(args: "Options | argparse.Namespace", env: "Mapping[str, str]", stdin: "TextIO",
         interrupts: "Optional[Interrupts]" = None) -> int:
    from pegasus_cloudio.dropin import stats
    from transfer.errors import TransferError
    started = time.time()
    try:
        if env.get("PEGASUS_CREDENTIALS"):
            from transfer.credentials import check_private
            check_private(env["PEGASUS_CREDENTIALS"])
        entries = _load(args, env, stdin)
        knobs, settings = run_settings(args, env)
    except TransferError as err:
        log.critical("%s", err)
        return 1
    log.info("%d transfers loaded", len(entries))
    native: "List[Entry]" = []
    delegated: "List[Entry]" = []
    for entry in entries:
        (native if entry.native else delegated).append(entry)
    log.info(SEPARATOR)
    log.info("Starting transfers - attempt 1")
    records: "Sequence[AttemptRecord]" = ()
    failed = 0
    if native:
        from transfer.session import Session
        with Session(settings, knobs) as session:
            outcome = run_native(native, session, settings, interrupts)
        log.debug("%d connection(s) opened, %d request(s) sent", session.stats.connections_opened,
                  session.stats.requests_sent)
        records, failed = outcome.records, outcome.failed
    stock_rc = 0
    if delegated:
        from pegasus_cloudio.dropin.stock import run_stock
        stock_rc = run_stock(delegated, _stock_argv(args, settings), env, knobs)
    log.info(SEPARATOR)
    for line in stats.format_stats(records, total_seconds=time.time() - started):
        log.info("%s", line)
    if failed == 0 and stock_rc == 0:
        log.info("All transfers completed successfully.")
        return 0
    log.critical("Some transfers failed! See above, and possibly stderr.")
    return 1


def run_settings(args: "Options | argparse.Namespace", env: "Mapping[str, str]") -> "Tuple[Dict[str, str], Settings]":
    """(the mapping every reader of settings gets, the engine's settings): ``-m`` over the
    environment over the config file (:func:`transfer.knobs.layered`), threads as the module
    docstring says. Raises InvalidInput naming a bad file or value."""
    from transfer.config import Settings
    from transfer.knobs import layered
    attempts = None if args.max_attempts is None else str(max(1, args.max_attempts))
    knobs = layered(env, config_file=True, command_line={"PEGASUS_CLOUDIO_MAX_ATTEMPTS": attempts})
    threads = effective_threads(args.threads, knobs)  # first: its message names the flag too
    settings = Settings.from_env(knobs).replace(threads=threads)
    if log.is_enabled_for(DEBUG):
        from transfer.knobs import story
        for line in story(knobs):
            log.debug("setting %s", line)
    log.debug("settings: %s", settings)
    return knobs, settings


def _load(args: "Options | argparse.Namespace", env: "Mapping[str, str]", stdin: "TextIO") -> "List[Entry]":
    from pegasus_cloudio.dropin.spec import SpecError, parse_spec
    if args.file:
        log.info("Reading transfer specification from %s", args.file)
        try:
            with open(args.file, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as err:
            raise SpecError(f"cannot read transfer specification: {err.strerror}", url=args.file,
                            operation="parse") from err
        except UnicodeDecodeError as err:
            raise SpecError(f"transfer specification is not UTF-8 text (byte {err.start})", url=args.file,
                            operation="parse") from None
    else:
        log.info("Reading URL pairs from stdin")
        try:
            text = stdin.read()
            text.encode("utf-8")  # stdin may decode with surrogateescape: refuse what that let in
        except (UnicodeDecodeError, UnicodeEncodeError) as err:
            raise SpecError(f"transfer specification on stdin is not UTF-8 text (character {err.start})",
                            operation="parse") from None
    return parse_spec(text, symlink=args.symlink, env=env) if text.strip() else []


def run_native(entries: "Sequence[Entry]", session: "Session", settings: "Settings",
               interrupts: "Optional[Interrupts]" = None) -> "reporting.Outcome":
    """Run entries on the engine, then integrity steps and monitoring; never raises per file."""
    from pegasus_cloudio.dropin import reporting
    from transfer.engine import Engine
    from transfer.retry import RetryPolicy
    env = session.context.env
    cache: "Optional[NodeCache]" = None
    peers: "Optional[PeerIndexSource]" = None
    if entries and env.get("PEGASUS_CLOUDIO_CACHE_DIR", "").strip().lower() != "off":
        from transfer.node import cache_needed, open_node_cache, open_peers  # neither is imported unless used
        if cache_needed([e.op for e in entries], env):
            cache = open_node_cache(env, log.warning)
            peers = open_peers(env, cache, log.warning)
            if cache is not None:
                _collect_behind()

    def on_result(result: "Result") -> None:
        _log_failure(result)
        if interrupts is not None:
            interrupts.finished(result)

    from transfer.node import open_pacer, session_scopes
    engine = Engine(session, threads=settings.threads,
                    retry=RetryPolicy(settings.max_attempts, settings.retry_base_delay,
                                      settings.retry_max_delay, throttle_timeout=settings.throttle_timeout),
                    on_result=on_result, cache=cache, peers=peers,
                    pacer=open_pacer(env, settings.pool_rate_fraction, session_scopes(session), log.warning))
    if interrupts is not None:
        interrupts.watch(engine, [e.op for e in entries])
    try:
        results = engine.run([e.op for e in entries]) if entries else []
        return reporting.finish(entries, results, engine, session.context.env)
    finally:  # the cache is not closed here: the engine's run closes it (its counters, eviction)
        if peers is not None:
            peers.close()


def _collect_behind() -> None:
    """Queue bundle members' cache inserts for :func:`insert_behind`, unless a node stager's
    copy collects them already."""
    global _collecting_here
    from transfer.cache import behind
    if not behind.collecting():
        behind.collect()
        _collecting_here = True


def _log_failure(result: "Result") -> None:
    if result.ok:
        log.debug("done %s (%d bytes, %d attempt(s))", result.op, result.bytes, result.attempts)
    else:
        log.error("%s (after %d attempt(s))", result.error, result.attempts)


def _stock_argv(args: "Options | argparse.Namespace", settings: "Settings") -> "List[str]":
    argv = ["--threads", str(settings.threads), "--max-attempts", str(settings.max_attempts)]
    if args.symlink:
        argv.append("--symlink")
    if args.debug:
        argv.append("--debug")
    return argv
