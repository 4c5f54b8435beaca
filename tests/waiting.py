"""Waiting on a condition instead of sleeping a fixed time and assuming progress."""

import time


def wait_for(predicate, what, timeout=30.0, interval=0.02):
    """Poll ``predicate`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(interval)
