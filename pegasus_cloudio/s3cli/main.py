"""``pegasus-cloudio-s3``: a drop-in for ``pegasus-s3`` 5.1.3 (spec §3) on the transfer library.

Same subcommands and options (``ls [-l -H]``, ``mkdir``, ``rm [-f] [-F FILE]``,
``put [-f] [-b]``, ``get``, ``cp [-f] [-c]``; global ``-v -d -C``), the legacy 4.x options
(``put/get -r -c MB -p N``, ``cp -r``; ``rmdir``, ``lsup``, ``rmup`` are recognised and
refused with a message), a real ``help``, the same configuration lookup and URL syntax.
Exit codes: 0 success, 1 any failure (one line on stderr; 5.1.3 printed it on stdout),
2 usage error; no subcommand prints the usage and exits 0, as 5.1.3 does.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Sequence, TextIO

from pegasus_cloudio.s3cli.commands import S3Commands
from pegasus_cloudio.s3cli.upload_ops import parse_duration
from pegasus_cloudio.s3cli.uri import CommandError, S3Uri, find_config, parse_s3_uri
from pegasus_cloudio.version import version_line
from transfer import Session, Settings
from transfer.errors import TransferError
from transfer.knobs import layered, story

if TYPE_CHECKING:
    from pegasus_cloudio.dropin.signals import Interrupts
    from pegasus_cloudio.s3cli.commands import ShowProgress, Sizes

log = logging.getLogger("pegasus_cloudio.s3cli")
LEGACY = {"rmdir": "URL..."}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pegasus-cloudio-s3",
                                     description="Upload, download, list and delete objects in S3 "
                                                 "(a drop-in for pegasus-s3 5.1.3).")
    parser.add_argument("-v", "--verbose", action="store_true", help="Enable verbose mode")
    parser.add_argument("-d", "--debug", action="store_true", help="Enable debug mode")
    parser.add_argument("-C", "--conf", dest="config", default=None, help="Path to configuration file")
    _add_progress_options(parser, False)
    parser.add_argument("--version", action="version", version=version_line("pegasus-cloudio-s3"))
    sub = parser.add_subparsers(dest="cmd", metavar="{ls,mkdir,rm,put,get,cp,lsup,rmup,help}")
    ls = sub.add_parser("ls", help="List the contents of a bucket (or the buckets)")
    ls.add_argument("url", metavar="URL")
    ls.add_argument("-l", "--long", dest="long_format", action="store_true", help="Use long listing format")
    ls.add_argument("-H", "--human-sized", dest="human_sized", action="store_true", help="Human readable sizes")
    mkdir = sub.add_parser("mkdir", help="Create a bucket")
    mkdir.add_argument("urls", metavar="URL", nargs="+")
    rm = sub.add_parser("rm", help="Delete keys (wildcards * ? [...] are expanded)")
    rm.add_argument("urls", metavar="URL", nargs="*")
    rm.add_argument("-f", "--force", action="store_true", help="Ignore nonexistent keys")
    rm.add_argument("-F", "--file", default=None, help="File containing a list of URLs to delete")
    put = sub.add_parser("put", help="Upload a file to a key (URL/ appends the file name)")
    put.add_argument("file", metavar="FILE")
    put.add_argument("url", metavar="URL")
    put.add_argument("-b", "--create-bucket", dest="create_bucket", action="store_true",
                     help="Create the destination bucket if it does not already exist")
    put.add_argument("-f", "--force", action="store_true", help="Overwrite key if it already exists")
    _add_legacy_transfer_options(put, "upload all files in the directory FILE under URL")
    _add_progress_options(put, argparse.SUPPRESS)
    get = sub.add_parser("get", help="Download a key to a file")
    get.add_argument("url", metavar="URL")
    get.add_argument("file", metavar="FILE", nargs="?", default=None)
    _add_legacy_transfer_options(get, "download every key equal to URL or under URL/")
    _add_progress_options(get, argparse.SUPPRESS)
    cp = sub.add_parser("cp", help="Copy keys inside the store")
    cp.add_argument("srcs", metavar="SRC", nargs="+")
    cp.add_argument("dest", metavar="DST")
    cp.add_argument("-c", "--create-dest", dest="create", action="store_true",
                    help="Create destination bucket if it does not exist")
    cp.add_argument("-f", "--force", action="store_true", help="If DEST key exists, then overwrite it")
    cp.add_argument("-r", "--recursive", action="store_true", help="SRC may be a bucket: copy all its keys")
    _add_progress_options(cp, argparse.SUPPRESS)
    lsup = sub.add_parser("lsup", help="List multipart uploads in progress under URL (pegasus-s3 4.x)")
    lsup.add_argument("url", metavar="URL")
    rmup = sub.add_parser("rmup", help="Abort multipart upload UPLOAD of URL, or with -a every upload "
                                       "under URL (pegasus-s3 4.x)")
    rmup.add_argument("url", metavar="URL")
    rmup.add_argument("upload", metavar="UPLOAD", nargs="?", default=None)
    rmup.add_argument("-a", "--all", action="store_true", help="Abort every upload under URL")
    rmup.add_argument("--older-than", metavar="DURATION", default=None,
                      help="With -a, only uploads started longer ago than DURATION (90s, 30m, 12h, 7d): "
                           "for a cron, sparing uploads still being written")
    helper = sub.add_parser("help", help="Print this message (or the help of COMMAND)")
    helper.add_argument("topic", metavar="COMMAND", nargs="?")
    for name, usage in LEGACY.items():
        legacy = sub.add_parser(name, help=f"(pegasus-s3 4.x; not supported) {usage}")
        legacy.add_argument("args", nargs="*")
        legacy.add_argument("-a", "--all", action="store_true", help=argparse.SUPPRESS)
    return parser


def _add_progress_options(parser: argparse.ArgumentParser, default: object) -> None:
    """``--no-progress`` and ``-q``, on the command and on put/get/cp (``default`` SUPPRESS
    there, so that a subcommand's unset flag leaves the command's)."""
    parser.add_argument("--no-progress", dest="no_progress", action="store_true", default=default,
                        help="Show no progress line: on a terminal put, get and cp show bytes, rate and "
                             "time left on one line of stderr; elsewhere one line per 30 s of long work")
    parser.add_argument("-q", "--quiet", dest="no_progress", action="store_true", default=default,
                        help="The same as --no-progress")


def _add_legacy_transfer_options(parser: argparse.ArgumentParser, recursive_help: str) -> None:
    parser.add_argument("-r", "--recursive", action="store_true", help=recursive_help)
    parser.add_argument("-c", "--chunksize", type=int, default=None, metavar="MB",
                        help="part size in MB for multipart uploads (4.x option; 0 = default)")
    parser.add_argument("-p", "--parallel", type=int, default=None, metavar="N",
                        help="concurrent transfers (4.x option)")


def main(argv: Optional[Sequence[str]] = None, env: Optional[Mapping[str, str]] = None,
         stdout: Optional[TextIO] = None) -> int:
    """Parse, run one subcommand, map failures to a one-line message and exit code 1."""
    parser = build_parser()
    args = parser.parse_args(argv)
    out = stdout or sys.stdout
    _setup_logging(args.verbose, args.debug)
    if args.cmd is None:
        parser.print_usage(out)
        return 0
    if args.cmd == "help":
        return _help(parser, args.topic, out)
    from pegasus_cloudio.dropin.signals import Interrupts
    try:
        # Ctrl-C or SIGTERM: temp files removed, multipart uploads aborted, exit at once (not after
        # the transfers in flight), 1 unless every transfer had already finished well
        with Interrupts(_Stderr(), truthful=True) as interrupts:
            _dispatch(args, dict(os.environ) if env is None else dict(env), out, interrupts)
    except (CommandError, TransferError, OSError) as err:
        if args.debug:  # -v says what happens; a traceback is for debugging, not for an ordinary error
            log.exception("Encountered error:")
        sys.stderr.write(f"{err}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted\n")
        return 1
    return 0


class _Stderr:
    """The signal handler's voice (:class:`~pegasus_cloudio.dropin.signals.Interrupts`): one line
    on stderr, straight to the descriptor when the stream is busy with the interrupted write. On
    a terminal each line first clears the one it starts on: a progress line may be showing there."""

    def __init__(self) -> None:
        from pegasus_cloudio.progress import CLEAR_LINE
        self._clear = CLEAR_LINE if _isatty(sys.stderr) else ""

    def say_now(self, level: int, message: str, *args: object) -> None:
        line = f"{self._clear}pegasus-cloudio-s3: {message % args if args else message}\n"
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except Exception:  # RuntimeError (reentrant write), a closed stream
            try:
                os.write(2, line.encode("utf-8", "replace"))
            except OSError:
                pass


def _help(parser: argparse.ArgumentParser, topic: Optional[str], out: TextIO) -> int:
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    chosen: Dict[str, argparse.ArgumentParser] = subparsers.choices
    if topic is None:
        out.write(parser.format_help())
        return 0
    if topic not in chosen:
        sys.stderr.write(f"Unknown command: {topic}\n")
        return 2
    out.write(chosen[topic].format_help())
    return 0


def _dispatch(args: argparse.Namespace, env: Dict[str, str], out: TextIO, interrupts: "Interrupts") -> None:
    if args.cmd in LEGACY:
        raise CommandError(f"'{args.cmd}' is a pegasus-s3 4.x subcommand that pegasus-cloudio-s3 does "
                           "not implement")
    env["PEGASUS_CREDENTIALS"] = find_config(args.config, env)
    log.info("credentials file %s", env["PEGASUS_CREDENTIALS"])
    knobs = _knobs(env, args)
    for line in story(knobs):
        log.debug("setting %s", line)
    settings = _settings(knobs)
    log.debug("settings: %s", settings)
    with Session(settings, knobs) as session:
        try:
            _act(args, session, settings, out, interrupts)
        finally:
            log.info("%d connection(s) opened, %d request(s) sent", session.stats.connections_opened,
                     session.stats.requests_sent)


def _act(args: argparse.Namespace, session: Session, settings: Settings, out: TextIO,
         interrupts: "Interrupts") -> None:
    """Run the subcommand ``args`` names in ``session``."""
    commands = S3Commands(session, out, threads=settings.threads, watcher=interrupts,
                          progress=None if args.no_progress else _progress_maker(session))
    actions: Dict[str, Callable[[], None]] = {
        "ls": lambda: commands.ls(parse_s3_uri(args.url), args.long_format, args.human_sized),
        "mkdir": lambda: _each(commands.mkdir, args.urls),
        "rm": lambda: commands.rm(_rm_urls(args), force=args.force),
        "put": lambda: commands.put(args.file, args.url, force=args.force,
                                    create_bucket=args.create_bucket, recursive=args.recursive),
        "get": lambda: commands.get(args.url, args.file, recursive=args.recursive),
        "cp": lambda: commands.cp(args.srcs, args.dest, force=args.force, create=args.create,
                                  recursive=args.recursive),
        "lsup": lambda: commands.lsup(parse_s3_uri(args.url)),
        "rmup": lambda: commands.rmup(parse_s3_uri(args.url), args.upload, every=args.all,
                                      older_than=None if args.older_than is None
                                      else parse_duration(args.older_than)),
    }
    actions[args.cmd]()


def _progress_maker(session: Session) -> "ShowProgress":
    """The reporters of this run's batches on stderr (:mod:`pegasus_cloudio.progress`): a live line
    on a terminal, whose total may cost a HEAD per source; elsewhere the 30 s lines, with the
    total only where it is known without a request."""
    from pegasus_cloudio.progress import Progress
    session.stats.meter()
    live = _isatty(sys.stderr)

    def make(files: int, total: Optional[int], sizes: Optional["Sizes"]) -> Progress:
        if total is None and sizes is not None and live:
            total = sizes()
        return Progress(sys.stderr, moved=session.stats.bytes_moved, files=files, total=total, live=live,
                        prefix="pegasus-cloudio-s3: ")
    return make


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def _each(action: Callable[[S3Uri], None], urls: Sequence[str]) -> None:
    for url in urls:
        action(parse_s3_uri(url))


def _knobs(env: Mapping[str, str], args: argparse.Namespace) -> Dict[str, str]:
    """The run's settings environment (transfer.knobs): legacy ``-p`` is ``THREADS`` and ``-c``
    is ``MULTIPART_PART_SIZE`` and ``_THRESHOLD``, over the environment and the config file."""
    parallel, chunk = getattr(args, "parallel", None), getattr(args, "chunksize", None)
    return layered(env, config_file=True, command_line={
        "PEGASUS_CLOUDIO_THREADS": str(max(1, parallel)) if parallel else None,
        "PEGASUS_CLOUDIO_MULTIPART_PART_SIZE": f"{chunk}M" if chunk else None,
        "PEGASUS_CLOUDIO_MULTIPART_THRESHOLD": f"{chunk}M" if chunk else None})


def _settings(knobs: Mapping[str, str]) -> Settings:
    """Library settings for one run; never bundles (one key per PUT)."""
    return Settings.from_env(knobs).replace(bundle=False, bundle_sites=None)


def _rm_urls(args: argparse.Namespace) -> List[str]:
    urls = list(args.urls)
    if args.file:
        with open(args.file, "rb") as fh:
            data = fh.read()
        for number, raw in enumerate(data.splitlines(), 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise CommandError(f"{args.file}: line {number} is not UTF-8 text") from None
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if len(fields) != 1:
                raise CommandError(f"Invalid record: {line.strip()} ({args.file}, line {number})")
            urls.append(fields[0])
    if not urls:
        raise CommandError("Specify URL")
    return urls


def _setup_logging(verbose: bool, debug: bool) -> None:
    """-v: what the command does (credentials file, connections and requests); -d: also every
    setting and where it came from, each endpoint's source and addressing, retries (the
    library's ``transfer`` loggers). Never a secret."""
    handler = logging.StreamHandler(sys.stderr)
    shape = logging.Formatter
    if _isatty(sys.stderr):  # a progress line may be showing: imported only then (start-up time)
        from pegasus_cloudio.progress import LineClearing as shape
    handler.setFormatter(shape("%(asctime)s:%(levelname)s:%(name)s: %(message)s"))
    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    for logger in (log, logging.getLogger("transfer")):
        logger.handlers[:] = [handler]
        logger.setLevel(level)
        logger.propagate = False


def console_main() -> None:
    from pegasus_cloudio.ending import end  # the exit without the interpreter's teardown
    end(main())


if __name__ == "__main__":
    console_main()
