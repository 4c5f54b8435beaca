"""The drop-in's log: pegasus-transfer's lines on stderr, without importing :mod:`logging`.

``logging`` imports ``re``, ``traceback``, ``string`` and ``weakref`` (several ms of CPU on
every job step), for a log that is one stream and one format. :data:`log` writes the stock
tool's format, ``%(asctime)s %(levelname)7s:  %(message)s`` with ``logging``'s default time
(local time, ``YYYY-MM-DD HH:MM:SS,mmm``), to the stream :meth:`JobLog.setup` names (the
process's stderr, or the job's in a node stager's forked copy). Messages take ``%``
arguments as ``logging``'s do; DEBUG lines appear only with ``-d``.
"""

from __future__ import annotations

import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TextIO

DEBUG, INFO, WARNING, ERROR, CRITICAL = 10, 20, 30, 40, 50
_NAMES = {DEBUG: "DEBUG", INFO: "INFO", WARNING: "WARNING", ERROR: "ERROR", CRITICAL: "CRITICAL"}


class JobLog:
    """One job's log (see the module docstring); what pegasus-transfer's logger was."""

    def __init__(self) -> None:
        self.stream: "TextIO" = sys.stderr
        self.level = INFO

    def setup(self, debug: bool, stream: "TextIO") -> None:
        self.stream = stream
        self.level = DEBUG if debug else INFO
        if debug:  # -d tells the library's story too (endpoints, retries): logging is imported only then
            _library_to(self)

    def is_enabled_for(self, level: int) -> bool:
        return level >= self.level

    def log(self, level: int, message: str, *args: object) -> None:
        """Write one line; never raises for the stream: a line it refuses (its reader gone, a
        full disk, no stderr at all) is lost, not the job, as with ``logging``'s handlers in the
        stock tool. What stays buffered is the exit's to report (:mod:`pegasus_cloudio.ending`)."""
        if level < self.level:
            return
        line = _line(level, message % args if args else message)
        try:
            self.stream.write(line)
            self.stream.flush()
        except (OSError, ValueError, AttributeError):  # ValueError: closed; AttributeError: None
            pass

    def say_now(self, level: int, message: str, *args: object) -> None:
        """:meth:`log` for a signal handler; never raises. If the stream cannot take the line
        (the handler interrupted a write to it, which then holds its lock; or its reader is
        gone), the line goes straight to the stream's file descriptor."""
        if level < self.level:
            return
        line = _line(level, message % args if args else message)
        try:
            self.stream.write(line)
            self.stream.flush()
            return
        except (RuntimeError, OSError, ValueError):
            pass
        try:
            from transfer.atomic import write_all
            write_all(self.stream.fileno(), line.encode("utf-8", "replace"))
        except (OSError, ValueError, AttributeError):
            pass

    def debug(self, message: str, *args: object) -> None:
        if DEBUG >= self.level:  # called once per file: off, it costs one comparison
            self.log(DEBUG, message, *args)

    def info(self, message: str, *args: object) -> None:
        self.log(INFO, message, *args)

    def warning(self, message: str, *args: object) -> None:
        self.log(WARNING, message, *args)

    def error(self, message: str, *args: object) -> None:
        self.log(ERROR, message, *args)

    def critical(self, message: str, *args: object) -> None:
        self.log(CRITICAL, message, *args)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (OSError, ValueError):
            pass


def _line(level: int, text: str) -> str:
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    return "%s,%03d %7s:  %s\n" % (stamp, int((now - int(now)) * 1000), _NAMES[level], text)


log = JobLog()



def _library_to(job_log: JobLog) -> None:
    """The library's log records (``transfer.*``), DEBUG and up, written as ``job_log``'s lines."""
    import logging

    class Bridge(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            job_log.log(record.levelno, "%s", record.getMessage())

    library = logging.getLogger("transfer")
    library.handlers[:] = [Bridge(logging.DEBUG)]
    library.setLevel(logging.DEBUG)
    library.propagate = False
