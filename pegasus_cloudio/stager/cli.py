"""``pegasus-cloudio stager``: run the node stager in the foreground until SIGTERM/SIGINT.

Start one per user and worker node (a systemd user unit, or HTCondor's ``STARTD_CRON`` /
a job-independent daemon) and give jobs ``PEGASUS_CLOUDIO_STAGER=<socket>`` in their
environment (a site profile); see ``docs/user-guide.md``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from pegasus_cloudio.stager.preload import preload
from pegasus_cloudio.stager.server import Stager, StagerError


def default_socket() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "pegasus-cloudio", "stager.sock")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", default=default_socket(),
                        help="Unix socket to serve, in a private directory (default: %(default)s)")


def main(args: argparse.Namespace) -> int:
    # The stager's own lines at INFO; the root logger at its default level (WARNING), as a
    # job's copy wants it: setting it there would touch (copy) every logger, per job.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s stager: %(message)s")
    logging.getLogger("pegasus_cloudio.stager").setLevel(logging.INFO)
    missing = preload()
    if missing:
        logging.getLogger("pegasus_cloudio.stager").info("not preloaded (not installed): %s", ", ".join(missing))
    try:
        Stager(args.socket).serve()
    except StagerError as err:
        sys.stderr.write(f"pegasus-cloudio stager: {err}\n")
        return 1
    return 0
