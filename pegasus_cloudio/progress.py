"""Progress where a person waits: bytes, rate and time left of long work, on stderr.

On a terminal, one line rewritten in place with ``\\r`` every :data:`LIVE_INTERVAL` seconds, in
the AWS CLI's words ("Completed 12.0 MiB/1.0 GiB (34.5 MiB/s) with 3 file(s) remaining, 0:29
left"), ended with a newline when the work ends; nothing for work that ends before the first
line. Elsewhere (a job's stderr, a log file) one whole line per :data:`JOB_INTERVAL` seconds
of long work, and nothing for shorter work, so a job's error file does not fill up.

The reporter only reads counters that exist anyway: the body bytes the session's connections
moved (:meth:`transfer.http.pool.PoolStats.bytes_moved`, one integer per connection) and the
files the engine finished (its ``on_result``). Nothing is called per chunk, and the library
never prints: the front ends (``pegasus-cloudio-s3``, ``bench``) start a reporter. The
drop-in never does: its stdout and stderr are records the Pegasus tools parse.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional, TextIO

from transfer.ops import Result

LIVE_INTERVAL = 0.5
JOB_INTERVAL = 30.0
CLEAR_LINE = "\r\x1b[K"  # to the start of the line, erased: a live progress line may be showing there
_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def size_text(count: float) -> str:
    """``count`` bytes as the AWS CLI writes them: ``12.0 MiB``, ``300 Bytes``."""
    for unit, name in _UNITS:
        if count >= unit:
            return f"{count / unit:.1f} {name}"
    return f"{count:.0f} Bytes"


def time_text(seconds: float) -> str:
    """``H:MM:SS`` or ``M:SS``."""
    whole = int(seconds + 0.5)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class LineClearing(logging.Formatter):
    """A terminal's log records (``-v``, ``-d``): each first clears the line it starts on, so a
    record never continues a live progress line; the progress line is redrawn below it at its
    next tick."""

    def format(self, record: logging.LogRecord) -> str:
        return CLEAR_LINE + super().format(record)


class Progress:
    """One reporter for one batch: ``with Progress(...) as shown: engine.run(ops)``, with
    ``shown.finished`` as (or called from) the engine's ``on_result``.

    ``moved``: the body bytes moved so far (read from the reporter's thread); ``files`` and
    ``total``: the batch's file count and byte count (None: unknown, no time left shown);
    ``live``: a terminal (``\\r`` line) or not (whole lines); ``prefix`` starts each job line
    (the command's name); ``clock`` decides when a line is due (a test drives it and calls
    :meth:`tick`). Writing never raises into the transfer: a closed stream stops the lines."""

    def __init__(self, stream: TextIO, *, moved: Callable[[], int], files: int, total: Optional[int],
                 live: bool, prefix: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream
        self._moved = moved
        self._files = files
        self._total = total
        self._live = live
        self._prefix = prefix
        self._clock = clock
        self._lock = threading.Lock()
        self._done_files = 0
        self._done_bytes = 0  # of finished files: a server-side copy moves none through us
        self._started = clock()
        self._last: Optional[float] = None  # when the last line was written
        self._width = 0  # of the live line now on the terminal
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def interval(self) -> float:
        return LIVE_INTERVAL if self._live else JOB_INTERVAL

    def finished(self, result: Result) -> None:
        """One operation's result (the engine's ``on_result``, from its threads)."""
        with self._lock:
            self._done_files += 1
            self._done_bytes += result.bytes if result.ok else 0

    def line(self) -> str:
        """What the reporter would write now, without prefix or line end."""
        elapsed = max(self._clock() - self._started, 1e-9)
        with self._lock:
            done = max(self._moved(), self._done_bytes)
            left_files = self._files - self._done_files
        rate = done / elapsed
        if self._total is not None:
            done = min(done, self._total)  # a retried body counts twice on the wire
        text = f"Completed {size_text(done)}"
        if self._total is not None:
            text += f"/{size_text(self._total)}"
        text += f" ({size_text(rate)}/s) with {left_files} file(s) remaining"
        if self._total is not None and rate > 0 and left_files:
            text += f", {time_text((self._total - done) / rate)} left"
        return text

    def tick(self) -> None:
        """Write a line if one is due: on a terminal at every call, in a job once
        :data:`JOB_INTERVAL` has passed since the start and since the last line."""
        now = self._clock()
        if not self._live:
            since = now - (self._started if self._last is None else self._last)
            if since < JOB_INTERVAL:
                return
        self._last = now
        self._write(self.line())

    def _write(self, text: str) -> None:
        if self._live:
            padding = " " * max(0, self._width - len(text))  # the rest of a longer line before
            self._width = len(text)
            out = f"\r{text}{padding}"
        else:
            out = f"{self._prefix}{text}\n"
        try:
            self._stream.write(out)
            self._stream.flush()
        except (OSError, ValueError):  # a closed stream or terminal: the work goes on unshown
            self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()

    def __enter__(self) -> "Progress":
        self._started = self._clock()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the thread; on a terminal, if a line is showing, write its final state and
        end it with a newline (after an error too: the error's line then starts clean)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._live and self._last is not None:
            self._write(self.line())
            try:
                self._stream.write("\n")
                self._stream.flush()
            except (OSError, ValueError):
                pass
