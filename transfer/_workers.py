"""The engine's default thread pool, without :mod:`concurrent.futures` on a job's path.

``concurrent.futures`` imports :mod:`logging` (and with it ``re``, ``traceback``, ``string``),
several ms of CPU on every job step. :class:`Workers` is the part of
``ThreadPoolExecutor`` the engine uses: ``submit`` (threads started as work arrives, up to
``threads``), ``map``, and ``shutdown(wait, cancel_futures)``; a :class:`Task` has
``result()``, ``done()`` and ``cancel()``. Any ``concurrent.futures.Executor`` may be given to
the engine instead.
"""

from __future__ import annotations

import _queue
import _thread

from transfer import _threads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from concurrent.futures import Executor as _Executor, Future as _Future
    from typing import Any, Callable, Iterable, Iterator, List, Optional, TypeVar

    from transfer._threads import Joinable

    _T = TypeVar("_T")
else:
    _Executor = _Future = object

__all__ = ["Cancelled", "InlineExecutor", "Task", "Workers"]


class Cancelled(RuntimeError):
    """The task was cancelled before it started (its pool shut down)."""


class Task(_Future):  # type: ignore[type-arg]
    """One submitted call: ``result()`` waits for it and returns its value or raises its error."""

    def __init__(self, fn: "Callable[..., Any]", args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> None:
        self._call = (fn, args, kwargs)
        self._lock = _thread.allocate_lock()
        self._lock.acquire()  # released once the outcome is known
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._step = 0  # 0 pending, 1 running, 2 finished, 3 cancelled

    def run(self) -> None:
        if self._step != 0:
            return
        self._step = 1
        fn, args, kwargs = self._call
        try:
            self._value = fn(*args, **kwargs)
        except BaseException as err:  # noqa: B036 - handed to the caller of result()
            self._error = err
        self._call = None  # type: ignore[assignment]  # no reference cycles through the arguments
        self._step = 2
        self._lock.release()

    def cancel(self) -> bool:
        if self._step != 0:
            return self._step == 3
        self._step = 3
        self._error = Cancelled("cancelled before it started")
        self._lock.release()
        return True

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except BaseException as err:  # noqa: B036 - returned, as Future.exception does
            return err
        return None

    def cancelled(self) -> bool:
        return self._step == 3

    def running(self) -> bool:
        return self._step == 1

    def done(self) -> bool:
        return self._step >= 2

    def wait(self) -> None:
        """Return once the task has finished or was cancelled (its error, if any, stays for
        :meth:`result`)."""
        if self._step < 2:
            _threads.block(self._lock)
            self._lock.release()

    def result(self, timeout: Optional[float] = None) -> Any:
        if self._step < 2:
            if not _threads.block(self._lock, timeout):
                raise TimeoutError("task still running")
            self._lock.release()
        if self._error is not None:
            raise self._error
        return self._value


class Workers(_Executor):
    """Up to ``threads`` daemon threads named ``<name>_<n>`` running submitted calls in order."""

    def __init__(self, threads: int, thread_name_prefix: str = "transfer") -> None:
        self._threads = max(1, threads)
        self._name = thread_name_prefix
        self._queue: Any = _queue.SimpleQueue()
        self._started: List[Joinable] = []
        self._lock = _threads.Lock()
        self._closed = False

    def submit(self, fn: "Callable[..., _T]", /, *args: Any, **kwargs: Any) -> "Task":
        task = Task(fn, args, kwargs)
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit after shutdown")
            self._queue.put(task)
            if len(self._started) < self._threads:
                self._started.append(_threads.start(self._work, f"{self._name}_{len(self._started)}"))
        return task

    def map(self, fn: "Callable[..., _T]", *iterables: "Iterable[Any]", timeout: Optional[float] = None,
            chunksize: int = 1) -> "Iterator[_T]":
        tasks = [self.submit(fn, *args) for args in zip(*iterables)]
        return (task.result() for task in tasks)

    def _work(self) -> None:
        while True:
            task = self._queue.get()
            if task is None:
                return
            task.run()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            started = list(self._started)
        if cancel_futures:
            while True:
                try:
                    task = self._queue.get_nowait()
                except _queue.Empty:
                    break
                if task is not None:
                    task.cancel()
        for _ in started:
            self._queue.put(None)
        if wait:
            for thread in started:
                thread.join()


class InlineExecutor(_Executor):
    """Runs each task at submit time, in the caller's thread (deterministic tests)."""

    def submit(self, fn: "Callable[..., _T]", /, *args: Any, **kwargs: Any) -> "Task":
        task = Task(fn, args, kwargs)
        task.run()
        return task
