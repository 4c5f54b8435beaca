"""Multipart uploads: each file's parts on the engine's part pool, and the uploads in flight,
aborted with retries on failure and all at once on a signal.

An upload that is neither completed nor aborted keeps its parts in the bucket (and on the
bill) until a lifecycle rule or ``pegasus-cloudio-s3 rmup`` removes it, so aborts are
retried with backoff, and a signal handler can abort everything in flight within a short
budget (HTCondor follows SIGTERM with SIGKILL).

A store that is down when an upload fails (killed, restarting) cannot take the abort either.
So before an upload of a key starts, the uploads of that key left open are aborted (the
sweep): those this engine could not abort (the file's earlier attempt, whatever their age),
and, on a store that lists them (:class:`~transfer.backends.base.PendingUploads`), those
started more than the backend's ``orphan_age`` ago (a killed run's: a younger one may be
another writer's, still sending) and those started while a create of this engine went
unanswered (the store made the upload and the answer was lost; within 2 s of that request).
The sweep never fails the upload it precedes.
"""

from __future__ import annotations

import logging
import random
import time

from transfer import _threads
from transfer.backends.base import MultipartUploads, pending_uploads
from transfer.errors import TransferError
from transfer.http.connection import FileRegion
from transfer.ranged import PartPool, join
from transfer.retry import RetryPolicy
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Tuple

    from transfer.pacing import Pace

_log = logging.getLogger(__name__)
ABORT_ATTEMPTS = 4
_SLACK = 2.0  # seconds either side of a lost create: the store's Initiated has whole seconds


class InFlightUploads:
    """The multipart uploads one engine has started and not yet finished. Thread-safe."""

    def __init__(self) -> None:
        self._lock = _threads.Lock()
        self._live: Dict[str, Tuple[MultipartUploads, Url]] = {}
        self._stranded: Dict[str, List[str]] = {}  # URL -> ids of its uploads whose abort failed
        self._unanswered: Dict[str, List[Tuple[float, float]]] = {}  # URL -> (sent, failed) of lost creates

    def start(self, backend: MultipartUploads, url: Url, upload_id: str) -> None:
        with self._lock:
            self._live[upload_id] = (backend, url)

    def finish(self, upload_id: str) -> None:
        with self._lock:
            self._live.pop(upload_id, None)

    def upload(self, backend: MultipartUploads, path: str, dest: Url, size: int, parts: PartPool,
               policy: RetryPolicy, sleep: Callable[[float], None], rng: random.Random,
               pace: Optional[Pace] = None) -> int:
        """Upload the ``size`` bytes of the local file ``path`` to ``dest`` in parts of the
        backend's ``part_size``, sent on ``parts``; the upload is in flight from the moment it
        is started, and aborted (:meth:`abort`) on any failure, after its last part stopped.
        Each part waits for its token from ``pace``, the pace of ``dest``'s prefix, as ranged
        reads do (:mod:`transfer.pacing`): no burst of parts into a prefix the store throttles;
        a throttle answer to a part fails the file, whose retry loop cuts the pace."""
        step = backend.part_size
        regions = [FileRegion(path, offset, min(step, size - offset)) for offset in range(0, size, step)]
        self.sweep(backend, dest)
        asked = time.time()
        try:
            upload_id = backend.start_upload(dest)
        except TransferError as err:
            if err.retryable:  # the store may have made the upload and lost the answer
                with self._lock:
                    self._unanswered.setdefault(str(dest), []).append((asked, time.time()))
            raise
        self.start(backend, dest, upload_id)
        try:
            # The shared part pool: parts never queue behind the file tasks that wait for them.
            sent = [parts.submit(_paced(backend.upload_part, pace), dest, upload_id, number, region)
                    for number, region in enumerate(regions, 1)]
            try:
                etags = [part.result() for part in sent]
            finally:
                join(sent)  # no part may still be sending when the upload is aborted
            backend.complete_upload(dest, upload_id, etags)
        except BaseException:
            if not self.abort(backend, dest, upload_id, policy, sleep, rng):
                with self._lock:
                    self._stranded.setdefault(str(dest), []).append(upload_id)
            raise
        finally:
            self.finish(upload_id)
        return size

    def sweep(self, backend: MultipartUploads, url: Url) -> List[str]:
        """Abort the uploads of ``url``'s key left open (see the module doc), one try each;
        the ids aborted. A listing the store refuses (no ``s3:ListBucketMultipartUploads``
        permission, a store that is still down) leaves the old ones to ``rmup`` or a
        lifecycle rule, with a debug line."""
        with self._lock:
            ids = self._stranded.pop(str(url), [])
            lost = self._unanswered.pop(str(url), [])
            live = set(self._live)
        listing = pending_uploads(backend)
        if listing is not None:
            cutoff = time.time() - listing.orphan_age

            def left(started: float) -> bool:  # old, or made by a create of ours whose answer was lost
                return started <= cutoff or any(sent - _SLACK <= started <= failed + _SLACK for sent, failed in lost)
            try:
                ids += [found.upload_id for found in listing.pending_uploads(url)
                        if found.initiated is not None and left(found.initiated) and found.upload_id not in ids]
            except TransferError as err:
                with self._lock:
                    self._unanswered.setdefault(str(url), []).extend(lost)
                _log.debug("cannot list the open uploads of %s: %s", url, err)
        aborted = []
        for upload_id in ids:
            if upload_id in live:
                continue
            try:
                backend.abort_upload(url, upload_id)
                aborted.append(upload_id)
                _log.info("aborted multipart upload %s of %s, left open before", upload_id, url)
            except TransferError as err:
                with self._lock:  # the next upload of this key tries again
                    self._stranded.setdefault(str(url), []).append(upload_id)
                _log.warning("could not abort multipart upload %s of %s: %s (remove it with "
                             "pegasus-cloudio-s3 rmup)", upload_id, url, err)
        return aborted

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


def _paced(send: "Callable[[Url, str, int, FileRegion], str]", pace: Optional[Pace]
           ) -> "Callable[[Url, str, int, FileRegion], str]":
    """``send`` after waiting for a token from ``pace`` (None: at once)."""
    if pace is None:
        return send

    def paced(url: Url, upload_id: str, number: int, region: FileRegion) -> str:
        pace.acquire()
        return send(url, upload_id, number, region)
    return paced


def _bound(fn: "Callable[..., None]", *args: object) -> "Callable[[], None]":
    return lambda: fn(*args)
