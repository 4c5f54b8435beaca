"""A command's end without the interpreter's teardown.

:func:`end` exits as ``sys.exit(code)`` would, minus the part that only costs CPU: Python's
finalization, which frees every module, class and function one by one (about 6 ms of a job
step's CPU with the drop-in's modules loaded, 3 ms for a bare interpreter, on a 2-core VM).
What a normal exit does that anyone can observe is done first, in the interpreter's order:
the atexit callbacks (logging's flush, ``weakref.finalize``; one that fails is reported and
does not change the status, on Python 3.9 too), then the standard streams flushed; then
:func:`os._exit`. The normal exit is taken instead whenever it would do something more that
is observable:

* a thread of :mod:`threading` that is not a daemon is still running (the interpreter
  waits for it);
* a standard stream cannot be flushed (the interpreter reports it and exits 120);
* ``code`` is not an int in 0..255 (``sys.exit`` prints a message and exits 1, maps None
  to 0, and other ints modulo 256).

Objects' finalizers (``__del__``) do not run, so a command that uses this closes what it
opens (``with``), as the node stager's copies, which end with ``os._exit`` too, already
must. Never imports :mod:`threading` (a job step's import budget: ``tests/test_startup_imports.py``).
"""

from __future__ import annotations

import atexit
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn, Optional, Union


def end(code: "Optional[Union[int, str]]") -> "NoReturn":
    """Exit with ``code``: see the module's contract."""
    if type(code) is not int or not 0 <= code <= 255 or _threads_running():
        sys.exit(code)
    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - Python 3.9 raises a failing callback's error again, after
        pass  # printing it; the normal exit prints it once and keeps the status, and so do we
    if not flush_standard_streams():
        sys.exit(code)  # the interpreter's exit reports it and sets the status
    os._exit(code)


def flush_standard_streams() -> bool:
    """Flush stdout, then stderr (either may be None: started without it); False, and nothing
    raised, when one cannot be flushed (its reader gone, a full disk). Its output stays
    buffered, so the process's exit, through :func:`end` or the interpreter, fails to flush
    it again and reports it: status 120."""
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except Exception:  # noqa: BLE001 - whatever the stream raises is the exit's to report
        return False
    return True


def _threads_running() -> bool:
    threading = sys.modules.get("threading")
    if threading is None:  # no thread of threading's was ever started
        return False
    main = threading.main_thread()
    return any(thread is not main and not thread.daemon and thread.is_alive() for thread in threading.enumerate())
