"""What a backend may read when it is opened: settings, environment, shared counters, the
permission-checked Pegasus credentials files and one TLS context. Backends import this
module, never :mod:`transfer.session` (which imports the backend registry)."""

from __future__ import annotations

import os

from transfer import _threads
from transfer.config import Settings
from transfer.credentials import PegasusCredentialsFile, pegasus_credentials_path
from transfer.errors import ConfigError
from transfer.http.connection import Timeouts, verifying_ssl_context
from transfer.http.pool import PoolStats
from transfer.lean import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl
    from _thread import LockType
    from typing import Dict, Mapping, Optional

__all__ = ["Context", "check_ca_bundle"]


@record
class Context:
    """What backends may read: settings, environment, shared counters, credentials files."""

    settings: Settings
    env: Mapping[str, str]
    stats: PoolStats = field(default_factory=PoolStats)
    _credentials: Dict[str, PegasusCredentialsFile] = field(default_factory=dict)
    _ssl: Optional[ssl.SSLContext] = None
    _lock: LockType = field(default_factory=_threads.Lock)

    @property
    def timeouts(self) -> Timeouts:
        return Timeouts(self.settings.connect_timeout, self.settings.read_timeout)

    def ssl_context(self) -> ssl.SSLContext:
        with self._lock:
            if self._ssl is None:
                self._ssl = _ssl_context(self.settings.ca_bundle, "PEGASUS_CLOUDIO_CA_BUNDLE")
            return self._ssl

    def pegasus_credentials(self, site_label: Optional[str]) -> PegasusCredentialsFile:
        """The permission-checked credentials file for ``site_label`` (read once)."""
        path = os.path.abspath(pegasus_credentials_path(site_label, self.env))
        with self._lock:
            found = self._credentials.get(path)
            if found is None:
                found = self._credentials[path] = PegasusCredentialsFile(path)
            return found


def check_ca_bundle(ca_file: str, setting: str) -> None:
    """Load ``ca_file`` now, as TLS connections will: ConfigError ``SETTING=FILE: cannot load
    CA certificates: REASON`` when it cannot be, before any request is made."""
    _ssl_context(ca_file, setting)


def _ssl_context(ca_file: Optional[str], setting: str) -> ssl.SSLContext:
    """The verifying TLS context; an unusable CA file is a ConfigError naming ``setting``."""
    try:
        return verifying_ssl_context(ca_file)
    except OSError as err:  # ssl.SSLError included
        reason = getattr(err, "strerror", None) or str(err)
        raise ConfigError(f"{setting}={ca_file}: cannot load CA certificates: {reason}",
                          url=ca_file, operation="config") from err
