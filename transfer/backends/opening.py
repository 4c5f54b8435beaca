"""What a backend module's factory may read when the session opens a backend.

:class:`Opening` is a protocol; :class:`transfer.context.Context` implements it. Backend
modules type ``endpoint_key(url, opening)`` and ``open_backend(url, opening)`` against it and
never import the context or the session; the backend classes themselves take plain values
(pools, settings, credentials, a TLS context) from their factory.
"""

from __future__ import annotations

from transfer.lean import Protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl
    from typing import Mapping, Optional

    from transfer.config import Settings
    from transfer.credentials import PegasusCredentialsFile
    from transfer.http.connection import Timeouts
    from transfer.http.pool import PoolStats


class Opening(Protocol):
    @property
    def settings(self) -> Settings: ...

    @property
    def env(self) -> Mapping[str, str]: ...

    @property
    def stats(self) -> PoolStats: ...

    @property
    def timeouts(self) -> Timeouts: ...

    def ssl_context(self) -> ssl.SSLContext:
        """The one verifying TLS context of the run (built on first use)."""

    def pegasus_credentials(self, site_label: Optional[str]) -> PegasusCredentialsFile:
        """The permission-checked credentials file for ``site_label``."""
