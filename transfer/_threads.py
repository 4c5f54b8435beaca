"""Locks, events and threads on :mod:`_thread`, without :mod:`threading`.

Every job step starts the drop-in, and ``import threading`` (with the ``functools``,
``collections`` and ``_weakrefset`` it pulls in) costs about 5 ms of CPU of each one. The
modules on a job's path use these instead; their contracts are :mod:`threading`'s:

* :data:`Lock` *is* ``threading.Lock`` (both are ``_thread.allocate_lock``).
* :class:`Event`: ``set``, ``clear``, ``is_set`` and ``wait(timeout)`` (True once set,
  else False at the timeout); any number of waiters.
* :func:`start` runs ``target()`` on a new daemon thread and returns something to ``join()``.
  The thread is a ``threading.Thread`` named ``name`` when :mod:`threading` is loaded
  already (a library user, a test, the stager: ``threading.enumerate()`` and logging then
  see it by name), else a bare ``_thread`` thread.

A waiter blocks on a lock of its own that the waking side releases, the design of
``threading.Condition``; one lock (``_mutex``) guards each object's state. :func:`block` waits
without a timeout in slices of :data:`SLICE` seconds: Python runs a signal handler in the main
thread only, and a main thread asleep on a lock wakes for it only when the signal interrupts that
very thread; between slices it runs the handler of a signal any thread received (HTCondor's
SIGTERM: the drop-in's main thread waits on its workers, and its handler must run).
"""

from __future__ import annotations

import _thread
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Optional, Protocol

    class Joinable(Protocol):
        def join(self, timeout: Optional[float] = None) -> None: ...

    class Cancel(Protocol):
        """What cancels an engine run: a ``threading.Event`` or an :class:`Event`."""

        def is_set(self) -> bool: ...

        def wait(self, timeout: Optional[float] = None) -> bool: ...

__all__ = ["Event", "Lock", "block", "start"]

Lock = _thread.allocate_lock
SLICE = 0.5  # seconds a wait without a timeout sleeps before it looks for a signal to handle


def _waiter() -> "_thread.LockType":
    lock = _thread.allocate_lock()
    lock.acquire()
    return lock


def block(lock: "_thread.LockType", timeout: "Optional[float]" = None) -> bool:
    """``lock.acquire(True, timeout)``; without a timeout, in slices (the module docstring)."""
    if timeout is not None:
        return lock.acquire(True, max(0.0, timeout))
    while not lock.acquire(True, SLICE):
        pass
    return True


class Event:
    """A flag threads wait on (``threading.Event``'s contract, see the module docstring)."""

    __slots__ = ("_flag", "_mutex", "_waiters")

    def __init__(self) -> None:
        self._flag = False
        self._mutex = _thread.allocate_lock()
        self._waiters: "List[_thread.LockType]" = []

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._mutex:
            self._flag = True
            for waiter in self._waiters:
                waiter.release()
            self._waiters.clear()

    def clear(self) -> None:
        with self._mutex:
            self._flag = False

    def wait(self, timeout: "Optional[float]" = None) -> bool:
        with self._mutex:
            if self._flag:
                return True
            waiter = _waiter()
            self._waiters.append(waiter)
        if block(waiter, timeout):
            return True
        with self._mutex:
            if waiter in self._waiters:  # timed out: nobody will release it now
                self._waiters.remove(waiter)
                return False
        return True  # set() released it between the timeout and the mutex


class _Bare:
    """A started ``_thread`` thread: ``join`` waits until its target has returned."""

    __slots__ = ("_done",)

    def __init__(self, target: "Callable[[], object]") -> None:
        self._done = _waiter()
        _thread.start_new_thread(self._run, (target,))

    def _run(self, target: "Callable[[], object]") -> None:
        try:
            target()
        finally:
            self._done.release()

    def join(self, timeout: "Optional[float]" = None) -> None:
        if block(self._done, timeout):
            self._done.release()  # later joins return at once too


def start(target: "Callable[[], object]", name: str) -> "Joinable":
    """Run ``target()`` on a new daemon thread (see the module docstring)."""
    threading = sys.modules.get("threading")
    if threading is None:
        return _Bare(target)
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread  # type: ignore[no-any-return]
