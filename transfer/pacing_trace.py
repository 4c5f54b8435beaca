"""An opt-in trace of a process's pacing (:mod:`transfer.pacing`): where a cut's seconds go.

``PEGASUS_CLOUDIO_PACE_TRACE=DIR`` makes each job append one line per pacing event to
``DIR/PID.trace`` (``scripts/pace_trace.py`` reads them beside the throttling front's arrival
times, ``bench throttle --trace DIR``). Off (the default) a :class:`~transfer.pacing.Pace`
holds None and tests it on its slow paths only. A line is ``EVENT TIME VALUES...`` (epoch
seconds, one ``os.write`` to a file opened ``O_APPEND``, so threads never interleave):

* ``send T BOOKED DUE LATER``: a paced request leaves at T; it reserved its token at BOOKED for
  DUE, and was re-timed to LATER by a cut it learned of while it waited (0: not re-timed);
* ``free T``: a request leaves unpaced (its prefix not limited in this process);
* ``503 T SENT PACED CUT WAITED FROM``: a throttle answer to a request sent at SENT; CUT 1 if it
  cut the prefix's rate (the state's ``cut_at`` is T) from FROM requests/s, WAITED the seconds
  its update took (the lock);
* ``take T WAITED``: a reservation's update took WAITED seconds.

Not for production: the directory is trusted as given (a debugging knob of the benchmarks).
"""

from __future__ import annotations

import os

__all__ = ["PaceTrace", "open_trace"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping, Optional


class PaceTrace:
    """Appends events to ``directory/PID.trace`` (module doc). Call it as ``trace(event, *values)``."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        self._fd = os.open(os.path.join(directory, f"{os.getpid()}.trace"), flags, 0o600)

    def __call__(self, event: str, *values: float) -> None:
        line = event + "".join(f" {v:.6f}" for v in values) + "\n"
        try:
            os.write(self._fd, line.encode())
        except OSError:
            pass  # a trace never fails a transfer


def open_trace(env: Mapping[str, str]) -> Optional[PaceTrace]:
    """The trace ``PEGASUS_CLOUDIO_PACE_TRACE`` asks for in ``env``; None when unset or unusable."""
    directory = env.get("PEGASUS_CLOUDIO_PACE_TRACE", "").strip()
    if not directory:
        return None
    try:
        return PaceTrace(directory)
    except OSError:
        return None
