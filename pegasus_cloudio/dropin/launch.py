"""The Python drop-in command: hand the job to the node stager, else run it here.

With ``PEGASUS_CLOUDIO_STAGER`` set to a stager's socket (:mod:`pegasus_cloudio.stager`), in
the environment or else in the config file (:mod:`transfer.knobs`), the job runs in that
stager; when it is unset, or no stager takes the job, the drop-in runs in this process.

Installed from a wheel built with a C compiler, ``pegasus-cloudio-transfer`` is the native
front end (``native/pegasus_cloudio_transfer.c``): it hands a job to a stager the environment
names without starting Python, and otherwise execs this script
(``pegasus-cloudio-transfer-py``), telling it two things in internal variables that are
removed here before anything else reads the environment (so no job, stock tool or stager
request sees them): :data:`NATIVE_VAR`, its own path, which becomes ``sys.argv[0]`` (what the
stock-tool finder skips as itself); :data:`TRIED_VAR`, set when it has already tried the
stager and said why it runs the job here, so the stager is not tried (nor warned about) twice.
"""

from __future__ import annotations

import gc
import os
import sys

TYPE_CHECKING = False  # typing is not imported on this path (start-up time)
if TYPE_CHECKING:
    from typing import Mapping, NoReturn


NATIVE_VAR = "_PEGASUS_CLOUDIO_NATIVE"
TRIED_VAR = "_PEGASUS_CLOUDIO_STAGER_TRIED"
# The cyclic collector runs after this many new container objects, not Python's 700: a job
# step's imports allocate tens of thousands (classes, functions) and free next to none, so the
# default spends 2-3 ms of each step's CPU (0.94-0.96x with this, scripts/step_cpu.py) looking
# for cycles that are not there. What a run leaves in cycles is still collected, later.
GC_THRESHOLD = 10_000


def console_main() -> "NoReturn":
    gc.set_threshold(GC_THRESHOLD)
    native = os.environ.pop(NATIVE_VAR, "")
    if native and sys.argv:
        sys.argv[0] = native
    tried = os.environ.pop(TRIED_VAR, "")
    path = "" if tried else stager_socket(os.environ)
    if path:
        from pegasus_cloudio.ending import end  # the exit without the interpreter's teardown
        from pegasus_cloudio.stager.client import hand_off
        code = hand_off(path, sys.argv[1:], os.environ)
        if code is not None:
            end(code)
    run_here()


def run_here() -> "NoReturn":
    """Run the job in this process and end without the interpreter's teardown
    (:mod:`pegasus_cloudio.ending`); also the entry point of the worker bundle, which has no stager."""
    gc.set_threshold(GC_THRESHOLD)
    from pegasus_cloudio.dropin.main import main
    from pegasus_cloudio.ending import end
    end(main())


def stager_socket(env: "Mapping[str, str]") -> str:
    """The stager socket the environment, else the config file, names; "" for none (a bad
    config file is left to the drop-in to report)."""
    path = env.get("PEGASUS_CLOUDIO_STAGER", "").strip()  # wire.ENV_VAR, not imported unless set
    if path:
        return path
    from transfer.knobs import layered
    try:
        return layered(env, config_file=True).get("PEGASUS_CLOUDIO_STAGER", "")
    except ValueError:
        return ""
