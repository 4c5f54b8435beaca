"""A Session owns the backends of one process run: one per endpoint, created on first use.

Nothing here is global: a CLI creates one Session, passes it to the engine, and closes it
in ``finally``. Backends that talk to the same endpoint with the same credentials share
one instance and therefore one connection pool sized to ``settings.threads``.
"""

from __future__ import annotations

import os
import ssl
import threading
from dataclasses import dataclass, field
from typing import Dict, Hashable, Mapping, Optional, Tuple

from transfer import backends
from transfer.backends.base import Backend
from transfer.config import Settings
from transfer.errors import ConfigError
from transfer.credentials import PegasusCredentialsFile, pegasus_credentials_path
from transfer.http.connection import Timeouts, verifying_ssl_context
from transfer.http.pool import PoolStats
from transfer.urls import Url


@dataclass
class Context:
    """What backends may read: settings, environment, shared counters, credentials files."""

    settings: Settings
    env: Mapping[str, str]
    stats: PoolStats = field(default_factory=PoolStats)
    _credentials: Dict[str, PegasusCredentialsFile] = field(default_factory=dict)
    _ssl: Optional[ssl.SSLContext] = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def timeouts(self) -> Timeouts:
        return Timeouts(self.settings.connect_timeout, self.settings.read_timeout)

    def ssl_context(self) -> ssl.SSLContext:
        with self._lock:
            if self._ssl is None:
                self._ssl = _ssl_context(self.settings.ca_bundle)
            return self._ssl

    def pegasus_credentials(self, site_label: Optional[str]) -> PegasusCredentialsFile:
        """The permission-checked credentials file for ``site_label`` (read once)."""
        path = os.path.abspath(pegasus_credentials_path(site_label, self.env))
        with self._lock:
            found = self._credentials.get(path)
            if found is None:
                found = self._credentials[path] = PegasusCredentialsFile(path)
            return found


def _ssl_context(ca_file: Optional[str]) -> ssl.SSLContext:
    """The verifying TLS context; an unusable CA file is a ConfigError naming the setting."""
    try:
        return verifying_ssl_context(ca_file)
    except (OSError, ssl.SSLError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise ConfigError(f"PEGASUS_CLOUDIO_CA_BUNDLE={ca_file}: cannot load CA certificates: {reason}",
                          url=ca_file, operation="config") from err


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
