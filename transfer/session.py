"""A Session owns the backends of one process run: one per endpoint, created on first use.

Nothing here is global: a CLI creates one Session, passes it to the engine, and closes it
in ``finally``. Backends that talk to the same endpoint with the same credentials share
one instance and therefore one connection pool sized to ``settings.threads``.
"""

from __future__ import annotations

import os
import threading

from transfer import backends
from transfer.backends.base import Backend
from transfer.config import Settings
from transfer.context import Context
from transfer.http.pool import PoolStats
from transfer.urls import Url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Hashable, Mapping, Optional, Tuple

__all__ = ["Context", "Session"]  # Context lives in transfer.context; re-exported for callers


class Session:
    """Backends by endpoint for one run; close() releases every connection."""

    def __init__(self, settings: Optional[Settings] = None, env: Optional[Mapping[str, str]] = None):
        env = dict(os.environ) if env is None else env
        self.context = Context(settings or Settings.from_env(env), env)
        self._backends: Dict[Hashable, Backend] = {}
        self._by_location: Dict[Tuple[str, str, Optional[str]], Backend] = {}
        self._lock = threading.Lock()

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

    def _resolve(self, url: Url) -> Backend:
        module = backends.backend_module(url.scheme)
        key = (module.__name__, module.endpoint_key(url, self.context))
        found = self._backends.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._backends.get(key)
            if found is None:
                found = self._backends[key] = module.open_backend(url, self.context)
            return found

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
