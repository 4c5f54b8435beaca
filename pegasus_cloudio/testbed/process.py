"""Helpers shared by the test-bed servers: stopping a child process, probing an HTTP endpoint."""

from __future__ import annotations

import ssl
import subprocess
import urllib.error
import urllib.request
from typing import Optional

STOP_GRACE_S = 10.0


def terminate(proc: "subprocess.Popen[bytes]", grace: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; always reaps the process."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def answers_ok(url: str, context: Optional[ssl.SSLContext] = None) -> bool:
    """True when GET ``url`` answers 200 within two seconds."""
    try:
        with urllib.request.urlopen(url, timeout=2.0, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
