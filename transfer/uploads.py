"""Multipart uploads in flight: aborted with retries on failure, and all at once on a signal.

An upload that is neither completed nor aborted keeps its parts in the bucket (and on the
bill) until a lifecycle rule or ``pegasus-cloudio-s3 rmup`` removes it, so aborts are
retried with backoff, and a signal handler can abort everything in flight within a short
budget (HTCondor follows SIGTERM with SIGKILL).
"""

from __future__ import annotations

import logging
import random
import time

from transfer import _threads
from transfer.backends.base import MultipartUploads
from transfer.errors import TransferError
from transfer.retry import RetryPolicy
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Tuple

_log = logging.getLogger(__name__)
ABORT_ATTEMPTS = 4


class InFlightUploads:
    """The multipart uploads one engine has started and not yet finished. Thread-safe."""

    def __init__(self) -> None:
        self._lock = _threads.Lock()
        self._live: Dict[str, Tuple[MultipartUploads, Url]] = {}

    def start(self, backend: MultipartUploads, url: Url, upload_id: str) -> None:
        with self._lock:
            self._live[upload_id] = (backend, url)

    def finish(self, upload_id: str) -> None:
        with self._lock:
            self._live.pop(upload_id, None)

    def abort(self, backend: MultipartUploads, url: Url, upload_id: str, policy: RetryPolicy,
              sleep: Callable[[float], None], rng: random.Random) -> bool:
        """Abort one upload, retrying retryable errors with backoff; False if it stayed."""
        for attempt in range(1, ABORT_ATTEMPTS + 1):
            try:
                backend.abort_upload(url, upload_id)
                return True
            except TransferError as err:
                if not err.retryable or attempt == ABORT_ATTEMPTS:
                    _log.warning("could not abort multipart upload %s of %s: %s (remove it with "
                                 "pegasus-cloudio-s3 rmup)", upload_id, url, err)
                    return False
                sleep(policy.delay(attempt, err, rng))
        return False

    def abort_all(self, seconds: float) -> List[str]:
        """Abort every live upload in parallel; the URLs of those not aborted within ``seconds``."""
        with self._lock:
            live = list(self._live.items())
        done: Dict[str, bool] = {}

        def one(upload_id: str, backend: MultipartUploads, url: Url) -> None:
            try:
                backend.abort_upload(url, upload_id)
                done[upload_id] = True
            except TransferError as err:
                _log.warning("could not abort multipart upload %s of %s: %s", upload_id, url, err)

        threads = [_threads.start(_bound(one, uid, backend, url), f"abort-{uid}") for uid, (backend, url) in live]
        deadline = time.monotonic() + seconds
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [str(url) for uid, (_, url) in live if not done.get(uid)]


def _bound(fn: "Callable[..., None]", *args: object) -> "Callable[[], None]":
    return lambda: fn(*args)
