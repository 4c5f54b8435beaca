"""``pegasus-cloudio-condor-plugin``: an HTCondor multi-file transfer plugin (protocol v4).

``plugin -classad`` prints the query ad (old ``Name = expr`` lines, nothing on stderr).
``plugin -infile IN -outfile OUT [-upload]`` (flags in any order, unknown ones ignored)
reads every file ad of IN, runs all files as one batch on one
:class:`~transfer.engine.Engine` and :class:`~transfer.session.Session` (one warm
connection pool per endpoint, ``PEGASUS_CLOUDIO_THREADS`` workers, default 8, retries with
backoff inside the plugin), and writes one result ad per file to OUT as each file finishes.
Downloads land atomically at ``LocalFileName``; uploads send ``LocalFileName`` to the URL.

Exit codes are listed in :mod:`pegasus_cloudio.condor.outcome`; configuration and credentials
in :mod:`pegasus_cloudio.condor.environment` and :mod:`pegasus_cloudio.condor.credentials`;
docs/condor.md is the administrator's and user's guide. SIGTERM/SIGINT (an eviction) stop the
batch at once, transfers in flight included: files not finished get a failed (transient) ad, no
partial or temporary file is left, and the plugin exits without waiting for network reads.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

from pegasus_cloudio.condor import PLUGIN_VERSION
from pegasus_cloudio.condor.ads import BindingsMissing, FileAd, ResultWriter, query_ad_text, read_file_ads
from pegasus_cloudio.condor.batch import available_methods, build_items
from pegasus_cloudio.condor.environment import (
    NodeConfigError, PluginEnvironment, build_environment, configured_methods, keep_node_keys_home,
)
from pegasus_cloudio.condor.outcome import EXIT_FAILED, EXIT_OK, EXIT_PLUGIN, exit_code
from pegasus_cloudio.condor.http_transfers import plugin_session
from pegasus_cloudio.condor.jobenv import JobAdError
from pegasus_cloudio.condor.report import Reporter, say
from pegasus_cloudio.condor.starter import reads_one_message_after_failure, starter_version
from transfer.lean import record
from transfer.node import open_node_cache, open_pacer, open_peers, session_scopes
from pegasus_cloudio.version import plain, version_line
from transfer.config import Settings
from transfer.knobs import CONFIG_VAR, PREFIX, Knobs, layered
from transfer.engine import Engine
from transfer.atomic import remove_temp_files
from transfer.named_files import NO_LINKS, read_file
from transfer.errors import TransferError, TransientError
from transfer.ops import Transfer

PROG = "pegasus-cloudio-condor-plugin"
USAGE = f"usage: {PROG} -classad | -infile IN -outfile OUT [-upload]"
STARTD_VERSION_ATTR = "PegasusCloudioPluginVersion"
MAX_REQUEST_BYTES = 256 << 20  # the starter's request: a file ad is a few hundred bytes


@record(frozen=True)
class Args:
    classad: bool = False
    infile: Optional[str] = None
    outfile: Optional[str] = None
    upload: bool = False


def parse_args(args: Sequence[str]) -> Args:
    """The starter's flags in any order; unknown arguments are ignored (HTCondor may add some)."""
    found: Dict[str, Any] = {}
    i = 0
    while i < len(args):
        flag = args[i].lower()
        if flag in ("-infile", "-outfile") and i + 1 < len(args):
            found[flag[1:]] = args[i + 1]
            i += 1
        elif flag in ("-upload", "-classad"):
            found[flag[1:]] = True
        i += 1
    return Args(**found)


def query_fields(env: Mapping[str, str]) -> Dict[str, object]:
    """The ``-classad`` answer; ``PEGASUS_CLOUDIO_CONDOR_METHODS`` (environment or node file)
    may narrow the schemes, e.g. to leave http/https to curl_plugin."""
    return {
        "MultipleFileSupport": True,
        "PluginType": "FileTransfer",
        "PluginVersion": PLUGIN_VERSION,
        "ProtocolVersion": 4,
        "SupportedMethods": ",".join(available_methods(configured_methods(env))),
        STARTD_VERSION_ATTR: PLUGIN_VERSION,
        "StartdAttrs": STARTD_VERSION_ATTR,
    }


def main(argv: Optional[Sequence[str]] = None, env: Optional[Mapping[str, str]] = None) -> int:
    """Run the plugin; ``argv`` is the full vector (``argv[0]`` names the plugin, as in HTCondor)."""
    argv = list(sys.argv if argv is None else argv)
    if any(flag in argv[1:2] for flag in ("--version", "-version")):
        sys.stdout.write(version_line(PROG) + "\n")
        return 0
    if any(flag in argv[1:2] for flag in ("--help", "-help", "-h")):
        sys.stdout.write(f"{USAGE}\n\n{plain(__doc__ or '')}")
        return 0
    environ = dict(os.environ if env is None else env)
    args = parse_args(argv[1:])
    try:
        if args.classad:
            sys.stdout.write(query_ad_text(query_fields(environ)))
            sys.stdout.flush()
            return 0
        if not (args.infile and args.outfile):
            say(USAGE)
            return EXIT_PLUGIN
        return _run(args, argv[0] if argv else PROG, environ)
    except BindingsMissing as err:
        say(str(err))
        return EXIT_PLUGIN


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Have Linux send SIGTERM when the process that started the plugin dies.

    On ``condor_rm`` during a transfer the starter SIGKILLs its transfer process, the
    plugin's parent; without this the plugin would run on, orphaned. SIGTERM takes the
    usual path: unfinished files get failed ads, temporary files are removed.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request was made
        os.kill(os.getpid(), signal.SIGTERM)


def _run(args: Args, argv0: str, environ: Mapping[str, str]) -> int:
    assert args.infile and args.outfile
    _die_with_parent()
    sandbox = os.path.dirname(os.path.abspath(args.infile))
    refusal = _root_for_another(sandbox)
    if refusal:
        return _unusable(args, refusal)
    try:
        penv = build_environment(environ, argv0, sandbox)
        request = read_file(args.infile, MAX_REQUEST_BYTES, NO_LINKS)[0]  # in the job's sandbox
        files = read_file_ads(request.decode("utf-8", "surrogateescape"))  # see read_file_ads
        writer = ResultWriter(args.outfile)
    except (NodeConfigError, JobAdError) as err:
        return _unusable(args, str(err))
    except OSError as err:
        return _unusable(args, f"cannot use {err.filename or 'a plugin file'}: {err.strerror or err}")
    except ValueError as err:
        return _unusable(args, f"cannot read the transfer request {args.infile}: {err}")
    for line in penv.warnings:
        say(line)
    for name in penv.refused:
        say(f"ignoring job variable {name}: not a setting the plugin takes from the job (secrets "
            "belong in a credentials file)")
    try:
        code = _transfer(files, args.upload, penv, sandbox, writer, environ)
    finally:
        closed = _close(writer)
    return code if closed or code != EXIT_OK else EXIT_FAILED


def _close(writer: ResultWriter) -> bool:
    """Close the result file; False, after one line, when closing reveals an error that no
    write reported (a write's own error was reported by the :class:`Reporter` already)."""
    try:
        writer.close()
    except OSError as err:
        say(f"cannot write the result file {writer.path}: {err.strerror or err}")
        return False
    return True


def _root_for_another(sandbox: str) -> Optional[str]:
    """Why the plugin must not run, if it runs as root for a job whose user owns ``sandbox``
    (``RUN_FILETRANSFER_PLUGINS_WITH_ROOT = true``): that user controls every name in it (a
    symlink to /etc/shadow), and root would upload, or write, what the user cannot."""
    try:
        owner = os.stat(sandbox).st_uid
    except OSError:
        return None  # reading the request there fails next, with its own message
    if os.geteuid() != 0 or owner == 0:
        return None
    return (f"refusing to run as root for a job of uid {owner}: its files would be read and written with "
            "root's rights; set RUN_FILETRANSFER_PLUGINS_WITH_ROOT = false (the default)")


def _unusable(args: Args, message: str) -> int:
    """The plugin cannot run this request: one line on stderr, one failed ad, EXIT_PLUGIN.

    The ad makes the starter hold the job with ``message`` (a starter that finds no ad at
    all may requeue the job instead, and it would fail the same way again).
    """
    say(message)
    assert args.outfile
    fields = {"TransferSuccess": False, "TransferError": message, "TransferUrl": "", "TransferFileName": "",
              "TransferType": "upload" if args.upload else "download"}
    try:
        writer = ResultWriter(args.outfile)
        try:
            writer.write(fields)
        finally:
            writer.close()
    except OSError as err:
        if str(err) not in message:  # else the line just said is this refusal (a FIFO or a link as -outfile)
            say(f"cannot write the result file {args.outfile}: {err.strerror or err}")
    return EXIT_PLUGIN


def _transfer(files: List[FileAd], upload: bool, penv: PluginEnvironment, sandbox: str,
              writer: ResultWriter, environ: Mapping[str, str]) -> int:
    """Every file ad -> one result ad; returns the exit code."""
    items = build_items(files, upload, penv.env, sandbox, available_methods(configured_methods(environ)))
    try:
        settings = settings_for(penv)
    except TransferError as err:
        for item in items:
            item.problem, item.op = item.problem or err, None
        settings = Settings()
    compact = reads_one_message_after_failure(starter_version(environ))
    reporter = Reporter(writer, items, upload=upload, penv=penv, say=say, compact=compact)
    for item in items:
        if item.problem is not None:
            reporter.problem(item)
    ops = [item.op for item in items if item.op is not None]
    if ops:
        _run_engine(ops, settings, penv, reporter)
    return _conclude(reporter)


def _conclude(reporter: Reporter) -> int:
    """Write the failed ads, say the summary line and return the exit code."""
    reporter.finish()
    code = exit_code(reporter.errors)
    if reporter.write_failed and code == 0:
        code = EXIT_FAILED
    say(f"{reporter.total - len(reporter.errors)} of {reporter.total} files transferred; exit code {code}")
    return code


def settings_for(penv: PluginEnvironment) -> Settings:
    """The engine's settings; ``penv.env`` becomes the settings layer's mapping (the job user's
    config file under the environment, :mod:`transfer.knobs`), which the cache and peers read too.
    A bad value's message names its layer (node file, plugin environment, job variable)."""
    before = set(penv.env)
    node_file = CONFIG_VAR in penv.from_node and bool(penv.env[CONFIG_VAR].strip())
    origins = {name: penv.origin(name) for name in penv.env if name.startswith(PREFIX)}
    penv.env = layered(Knobs(penv.env, origins), config_file=True)
    if node_file:  # the administrator's settings file: its values are the node's
        penv.from_node |= set(penv.env) - before
    for note in keep_node_keys_home(penv):
        say(note)
    return Settings.from_env(penv.env)


def _run_engine(ops: List[Transfer], settings: Settings, penv: PluginEnvironment, reporter: Reporter) -> None:
    with plugin_session(settings, penv.env) as session:
        reporter.session = session
        cache = open_node_cache(penv.env)
        peers = open_peers(penv.env, cache)
        pacer = open_pacer(penv.env, settings.pool_rate_fraction, session_scopes(session), say)
        engine = Engine(session, on_result=reporter.on_result, cache=cache, peers=peers, pacer=pacer)
        cancel = threading.Event()
        try:
            with _stop_on_signals(reporter, engine, cancel):
                engine.run(ops, cancel)
        except Exception as err:  # noqa: BLE001 - a backend bug must not cost other files their ads
            name = type(err).__name__
            reporter.fail_unreported(lambda item: TransferError(f"internal error ({name})", operation="transfer"))
            say(f"internal error: {name}: {str(err)[:200]}")
        finally:  # the cache is not closed here: the engine's run closes it (its counters, eviction)
            if peers is not None:
                peers.close()


ABORT_SECONDS = 5.0


def _leave(signum: int, reporter: Reporter, engine: Engine, cancel: threading.Event) -> None:
    """SIGTERM/SIGINT: stop now, as the drop-in does (``pegasus_cloudio.dropin.signals``).

    No temporary file stays in the job's directory, multipart uploads in flight are aborted
    (within :data:`ABORT_SECONDS`), every file not reported gets a failed (transient) ad, and
    the process ends with ``os._exit``: waiting for the workers would keep downloading into
    the job's scratch, after HTCondor let the job go, for as long as the transfers take.
    """
    code = EXIT_PLUGIN
    try:
        for handled in (signal.SIGTERM, signal.SIGINT):
            signal.signal(handled, signal.SIG_IGN)  # a second signal must not re-enter this
        cancel.set()
        remove_temp_files()
        stuck = engine.abort_uploads(ABORT_SECONDS)
        remove_temp_files()  # anything a worker created meanwhile
        reporter.fail_unreported(lambda item: TransientError(
            f"interrupted by signal {signum} before the transfer finished", operation="transfer"))
        code = _conclude(reporter)
        reporter.close()
        for url in stuck:
            say(f"the multipart upload to {url} could not be aborted; remove it with pegasus-cloudio-s3 rmup")
    finally:
        os._exit(code)


@contextlib.contextmanager
def _stop_on_signals(reporter: Reporter, engine: Engine, cancel: threading.Event) -> Iterator[None]:
    """SIGTERM/SIGINT -> :func:`_leave`, never in the middle of handling a file's result."""

    def leave(signum: int) -> None:
        _leave(signum, reporter, engine, cancel)

    def handler(signum: int, _frame: object) -> None:
        if reporter.writing:
            reporter.pending_signal = signum
            return
        leave(signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread (e.g. main() called by a test)
        return
    reporter.on_signal = leave
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def console_main() -> None:
    from pegasus_cloudio.ending import end  # the exit without the interpreter's teardown
    end(main())


if __name__ == "__main__":
    console_main()
