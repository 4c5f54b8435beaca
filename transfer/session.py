"""A Session owns the backends of one process run: one per endpoint, created on first use.

Nothing here is global: a CLI creates one Session, passes it to the engine, and closes it
in ``finally``. Backends that talk to the same endpoint with the same credentials share
one instance and therefore one connection pool sized to ``settings.threads``.
"""

from __future__ import annotations

import os

from transfer import _threads
from transfer import backends
from transfer.backends.base import Backend, Store, cache_keys, store
from transfer.backends.opening import Opening
from transfer.config import Settings
from transfer.context import Context
from transfer.errors import TransferError
from transfer.http.pool import PoolStats
from transfer.lean import Protocol
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

__all__ = ["BackendOpener", "Context", "Session"]  # Context lives in transfer.context; re-exported for callers


class BackendOpener(Protocol):
    """What opens the backends of one URL scheme: the two functions every backend module has
    (see :mod:`transfer.backends`), as an object, so a caller can serve a scheme its own way."""

    def endpoint_key(self, url: Url, context: Opening) -> Hashable:
        """Equal keys share one backend instance (and its connection pool)."""

    def open_backend(self, url: Url, context: Opening) -> Backend:
        """A new backend for ``url``'s endpoint."""


class Session:
    """Backends by endpoint for one run; close() releases every connection.

    ``settings``: None reads :meth:`Settings.from_env` from ``env``; a value given is checked the
    same way (InvalidInput naming the field's knob: a zero thread count would hang the first
    batch, a NaN timeout fail it mid-request). ``env``: the environment
    that credential lookups (``PEGASUS_CREDENTIALS*``, ``AWS_*``, ``HOME``) and settings read;
    None takes a snapshot of ``os.environ``; a mapping is used *instead of* ``os.environ``
    (which is then never read). ``backends``: scheme -> :class:`BackendOpener` serving that
    scheme instead of the registry's module (e.g. S3 at a given endpoint with given keys)."""

    def __init__(self, settings: Optional[Settings] = None, env: Optional[Mapping[str, str]] = None,
                 backends: Optional[Mapping[str, BackendOpener]] = None):
        env = dict(os.environ) if env is None else env
        if settings is None:
            settings = Settings.from_env(env)
        else:
            settings.validate()
        self.context = Context(settings, env)
        self._openers: Dict[str, BackendOpener] = dict(backends or {})
        self._backends: Dict[Hashable, Backend] = {}
        self._by_location: Dict[Tuple[str, str, Optional[str]], Backend] = {}
        self._lock = _threads.Lock()

    @property
    def settings(self) -> Settings:
        return self.context.settings

    @property
    def stats(self) -> PoolStats:
        return self.context.stats

    def backend(self, url: Url) -> Backend:
        """The backend for ``url``'s endpoint. Endpoints depend only on scheme, authority and
        site label, so repeated lookups for a batch's thousands of URLs are one dict read."""
        location = (url.scheme, url.host, url.site_label)
        found = self._by_location.get(location)
        if found is None:
            found = self._by_location[location] = self._resolve(url)
        return found

    def by_backend(self, urls: Sequence[Url]) -> List[Tuple[Backend, List[Url]]]:
        """``urls`` grouped by their endpoints' backends, in the order first met (a batch's
        thousands of URLs: one dict read each, no call); a URL whose backend cannot be made
        is left out (its own read reports the error)."""
        groups: Dict[int, Tuple[Backend, List[Url]]] = {}
        by_location = self._by_location
        for url in urls:
            found = by_location.get((url.scheme, url.host, url.site_label))
            if found is None:
                try:
                    found = self.backend(url)
                except TransferError:
                    continue
            group = groups.get(id(found))
            if group is None:
                group = groups[id(found)] = (found, [])
            group[1].append(url)
        return list(groups.values())

    def cache_key(self, url: Url) -> Optional[str]:
        """The node-cache name of the remote object ``url`` (None: its backend keys none,
        :class:`~transfer.backends.base.CacheKeys`); the TransferError of a backend that
        cannot be made."""
        keys = cache_keys(self.backend(url))
        return keys.cache_key(url) if keys is not None else None

    def store(self, url: Url, operation: str = "use") -> Store:
        """The backend for ``url`` typed as a full :class:`~transfer.backends.base.Store` (list,
        delete, put, ...); InvalidInput naming the URL for a read-only source (plain HTTP)."""
        return store(self.backend(url), url, operation)

    def _resolve(self, url: Url) -> Backend:
        opener = self._openers.get(url.scheme)
        if opener is None:
            module = backends.backend_module(url.scheme)
            key: Hashable = (module.__name__, module.endpoint_key(url, self.context))
        else:
            key = ("opener", id(opener), opener.endpoint_key(url, self.context))
        found = self._backends.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._backends.get(key)
            if found is None:
                opened = module.open_backend(url, self.context) if opener is None else opener.open_backend(
                    url, self.context)
                found = self._backends[key] = opened
            return found

    def opened(self) -> List[Backend]:
        """The backends opened so far (for a signal handler's clean-up)."""
        return list(self._backends.values())

    def close(self) -> None:
        with self._lock:
            opened, self._backends = list(self._backends.values()), {}
            self._by_location = {}
        for backend in opened:
            backend.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
