"""The ``pegasus-cloudio-transfer`` command: hand the job to the node stager, else run it here.

With ``PEGASUS_CLOUDIO_STAGER`` set to a stager's socket (:mod:`pegasus_cloudio.stager`), the
job runs in that stager (no interpreter start-up or imports paid here); when it is unset, or
no stager takes the job, the drop-in runs in this process as usual.
"""

from __future__ import annotations

import os
import sys


def console_main() -> None:
    path = os.environ.get("PEGASUS_CLOUDIO_STAGER", "")  # wire.ENV_VAR, not imported unless set
    if path:
        from pegasus_cloudio.stager.client import hand_off
        code = hand_off(path, sys.argv[1:], os.environ)
        if code is not None:
            sys.exit(code)
    from pegasus_cloudio.dropin.main import main
    sys.exit(main())
