"""An engine's writes to stores, and the node cache's side of each (imported at the first one).

:class:`Writes` stores one local file as one object (in parts on the engine's
:class:`~transfer.ranged.PartPool` at the backend's multipart threshold, :mod:`transfer.uploads`)
and then writes it through to the node cache, or drops the cache's entry of the name (it may
hold the bytes the upload replaced). The engine's per-file path, its two-hop copies and the
bundle groups' packed uploads (:mod:`transfer.bundles.groups`) all use one ``Writes``, given as a
value: nothing below the engine calls the engine back to write.
"""

from __future__ import annotations

import os

from transfer import _threads
from transfer.atomic import local_error
from transfer.backends.base import multipart_uploads, peer_scopes, uploads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Optional, Tuple

    from transfer.cache import NodeCache
    from transfer.pacing import Pacer
    from transfer.peers import PeerRound
    from transfer.ranged import PartPool
    from transfer.retry import RetryPolicy
    from transfer.retrying import Retrier
    from transfer.session import Session
    from transfer.uploads import InFlightUploads
    from transfer.urls import Url

__all__ = ["Writes"]


class Writes:
    """Uploads of one engine over ``session``'s backends. ``cache`` (with ``peers``, the engine's
    round) is written through as its config's ``uploads`` says (unset: with peers only); the
    other values are the engine's part pool, retry policy, sleep, retrier and pacer, which
    multipart uploads use. Thread-safe."""

    def __init__(self, session: Session, parts: PartPool, retry: RetryPolicy, sleep: Callable[[float], None],
                 retrier: Retrier, pacer: Pacer, cache: Optional[NodeCache] = None,
                 peers: Optional[PeerRound] = None) -> None:
        self._session = session
        self._parts = parts
        self._retry = retry
        self._sleep = sleep
        self._retrier = retrier
        self._pacer = pacer
        self._cache = cache
        self._peers = peers
        wanted = cache.config.uploads if cache is not None else None
        self._cache_uploads = cache is not None and (wanted if wanted is not None else peers is not None)
        self._lock = _threads.Lock()
        self.in_flight: Optional[InFlightUploads] = None  # multipart uploads, made at the first

    def upload(self, path: str, dest: Url, *, write_through: bool = True) -> int:
        """Store ``path`` as ``dest``; then write it through (or, without ``write_through``, or
        when the upload failed, drop the node's entry of ``dest``). Returns its size."""
        try:
            size, version = self.put(path, dest)
        except Exception:
            self.write_through(dest, None, None)  # the object may have changed all the same
            raise
        self.write_through(dest, path if write_through else None, version)
        return size

    def put(self, path: str, dest: Url) -> Tuple[int, Optional[str]]:
        """Store ``path`` as ``dest`` (in parts at the backend's threshold); size and version."""
        backend = self._session.backend(dest)
        in_parts = multipart_uploads(backend)
        if in_parts is not None:
            try:
                size = os.stat(path).st_size
            except OSError as err:
                raise local_error(err, path, "put") from err
            if size >= in_parts.multipart_threshold:
                return self._multipart().upload(in_parts, path, dest, size, self._parts, self._retry, self._sleep,
                                                self._retrier.random(), self._pacer.pace(dest)), None
        info = uploads(backend, dest, "put").put(path, dest)
        return info.size, info.version

    def write_through(self, dest: Url, path: Optional[str], version: Optional[str]) -> None:
        """After an upload (or copy) to ``dest``: an uploaded file serves later jobs on this node
        (and, with peers, on others) when the cache's ``uploads`` setting (auto: peers present)
        asks for it; otherwise, or with no ``path``, the node's entry of the name is dropped -
        it may hold the bytes the upload replaced."""
        key = self._session.cache_key(dest) if self._cache is not None and not dest.is_local else None
        if key is None or self._cache is None:
            return
        if path is None or not self._cache_uploads:
            self._cache.drop(key)
        elif self._cache.insert_file(key, path, version) and self._peers is not None:
            scopes = peer_scopes(self._session.backend(dest))
            self._peers.stored(key, scopes.peer_scope(dest) if scopes is not None else None)

    def abort_all(self, seconds: float) -> List[str]:
        """Abort every multipart upload in flight within ``seconds``; the URLs left unaborted."""
        return self.in_flight.abort_all(seconds) if self.in_flight is not None else []

    def _multipart(self) -> InFlightUploads:
        if self.in_flight is None:
            from transfer.uploads import InFlightUploads
            with self._lock:
                if self.in_flight is None:
                    self.in_flight = InFlightUploads()
        return self.in_flight
