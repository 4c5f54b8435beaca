"""The ``pegasus-cloudio-transfer`` command: hand the job to the node stager, else run it here.

With ``PEGASUS_CLOUDIO_STAGER`` set to a stager's socket (:mod:`pegasus_cloudio.stager`), in
the environment or else in the config file (:mod:`transfer.knobs`), the job runs in that
stager (no interpreter start-up or imports paid here when the environment names it); when it
is unset, or no stager takes the job, the drop-in runs in this process as usual.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported on this path (start-up time)
if TYPE_CHECKING:
    from typing import Mapping


def console_main() -> None:
    path = stager_socket(os.environ)
    if path:
        from pegasus_cloudio.stager.client import hand_off
        code = hand_off(path, sys.argv[1:], os.environ)
        if code is not None:
            sys.exit(code)
    from pegasus_cloudio.dropin.main import main
    sys.exit(main())


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
