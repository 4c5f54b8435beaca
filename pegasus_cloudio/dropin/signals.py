"""SIGTERM and SIGINT in the drop-in: leave nothing behind, say what did not finish, exit 1.

HTCondor evicts a job with SIGTERM and follows with SIGKILL, so the handler does the cheap,
important things first: (1) unlink every temp file of this process (no ``.NAME.PID.N.part``
nor ``.NAME.PID.N.link`` stays in the job's directory), (2) abort multipart uploads in flight
within :data:`ABORT_SECONDS`, (3) log which transfers did not finish, (4) ``os._exit(1)``
without unwinding worker threads that may sit in network reads. It never logs success.
"""

from __future__ import annotations

import _thread
import _signal  # type: ignore[import-not-found]  # signal's C module: signal imports enum (start-up time)
import os
import sys

from pegasus_cloudio.dropin.log import CRITICAL, ERROR

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, Dict, List, Optional, Protocol, Sequence

    from transfer import Engine, Result
    from transfer.ops import Operation

    class Says(Protocol):
        """What the handler writes through: :meth:`pegasus_cloudio.dropin.log.JobLog.say_now`'s signature."""

        def say_now(self, level: int, message: str, *args: object) -> None: ...

ABORT_SECONDS = 5.0
HANDLED = (_signal.SIGTERM, _signal.SIGINT)


class Interrupts:
    """``with Interrupts(log) as guard:`` - installs the handlers (main thread only).

    ``truthful``: a signal that comes once every watched operation has finished, all of them
    well, exits 0 (the files are in place); ``pegasus-cloudio-s3`` asks for it. The drop-in
    keeps exit 1 for any signal, which is what Pegasus expects of an evicted job."""

    def __init__(self, log: Says, abort_seconds: float = ABORT_SECONDS, truthful: bool = False) -> None:
        self._log = log
        self._abort_seconds = abort_seconds
        self._truthful = truthful
        self._failed = 0
        self._engine: Optional[Engine] = None
        self._pending: Dict[int, Operation] = {}
        self._lock = _thread.RLock()  # the handler may interrupt the main thread holding it
        self._previous: Dict[int, Any] = {}

    def __enter__(self) -> "Interrupts":
        for signum in HANDLED:
            try:
                self._previous[signum] = _signal.signal(signum, self._handle)
            except ValueError:  # not the main thread (a library caller's worker): handlers stay
                break
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            _signal.signal(signum, handler)

    def watch(self, engine: Engine, ops: Sequence[Operation]) -> None:
        """The batch about to run: its operations count as unfinished until their result."""
        with self._lock:
            self._engine = engine
            self._pending = {id(op): op for op in ops}  # described only if a signal comes

    def finished(self, result: Result) -> None:
        with self._lock:
            self._pending.pop(id(result.op), None)
            self._failed += not result.ok

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        code = 1
        try:
            with self._lock:
                done = self._truthful and self._engine is not None and not self._pending and not self._failed
            if done:
                self._log.say_now(ERROR, "Interrupted by signal %d after every transfer finished", signum)
                code = 0
            else:
                self._leave(signum)
        finally:  # whatever happened above, the job ends here: never carry on after an eviction
            if code == 0:  # the listing or message already written must not be lost
                try:
                    sys.stdout.flush()
                except Exception:  # its lock is held by the interrupted write, or it is gone
                    pass
            os._exit(code)

    def _leave(self, signum: int) -> None:
        removed = _remove_temp_files()
        with self._lock:
            engine, pending = self._engine, [describe(op) for op in self._pending.values()]
        stuck: List[str] = engine.abort_uploads(self._abort_seconds) if engine is not None else []
        removed += _remove_temp_files()  # anything a worker created meanwhile
        say = self._log.say_now
        say(CRITICAL, "Exiting due to signal %d: %d transfer(s) did not finish, %d temporary file(s) removed",
            signum, len(pending), removed)
        for text in pending:
            say(ERROR, "Not finished: %s", text)
        for url in stuck:
            say(ERROR, "Multipart upload to %s could not be aborted; remove it with pegasus-cloudio-s3 rmup", url)


def _remove_temp_files() -> int:
    """:func:`transfer.atomic.remove_temp_files`; nothing to do (and nothing imported inside a
    signal handler, which could wait on the import lock) before that module was loaded."""
    atomic = sys.modules.get("transfer.atomic")
    return atomic.remove_temp_files() if atomic is not None else 0


def describe(op: Operation) -> str:
    from transfer.ops import Transfer
    if isinstance(op, Transfer):
        return f"{op.sources[0]} -> {op.dest}"
    return f"{type(op).__name__.lower()} {op.target}"
