"""A real Azurite blob service (pinned, see `node_tools.ensure_azurite`) on loopback, over plain HTTP (or https).

Started as ``azurite-blob --blobHost 127.0.0.1 --blobPort N --inMemoryPersistence --skipApiVersionCheck
--loose --disableProductStyleUrl`` in a private temp dir with one storage account of its own (``AZURITE_ACCOUNTS``: a
name and a random key per server, not the well-known development key), ready once the port
answers HTTP at all (every unsigned request is refused, so "answers" is the test). Clients
reach it path-style, ``http://127.0.0.1:N/ACCOUNT/CONTAINER/BLOB``: `Azurite.connection_string`
carries that ``BlobEndpoint``.

What 3.37.0 does, as our backend uses it: Shared Key and SAS are checked (a wrong key is 403
``AuthorizationFailure``); Put Blob, Put Block, Put Block List, Get Blob with ``x-ms-range``,
Get Blob Properties, List Blobs with prefix, delimiter, ``maxresults`` and ``NextMarker``,
Delete Blob, Copy Blob (synchronous within the account), Create Container; ``Content-MD5`` of a
Put Blob or a block is verified. It has no throttling (503 ``ServerBusy`` only through the
test bed's proxies) and takes ``--skipApiVersionCheck`` so a newer ``x-ms-version`` is not
refused; ``--loose`` lets it ignore headers it does not know.

With ``tls`` (a :func:`~pegasus_cloudio_testbed.certs.make_tls_files` set) it serves https
(``--cert``/``--key``), and with ``oauth`` also checks bearer tokens (``--oauth basic``, which
Azurite allows over https only): a JWT's ``nbf``/``exp``, an issuer starting with one of
Azure's token services (``https://sts.windows.net/...``) and a storage audience
(``https://storage.azure.com``); the signature is not checked.
"""

from __future__ import annotations

import base64
import os
import secrets
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import List, Optional

from .certs import TlsFiles

from .node_tools import ensure_azurite
from .ports import free_port
from .process import ServerProcess

__all__ = ["Azurite"]

_PORT_IN_USE = "EADDRINUSE"
_PORT_ATTEMPTS = 3
_POLL_S = 0.1


def _answers(url: str, context: Optional[ssl.SSLContext] = None) -> bool:
    """True when ``url`` answers HTTP at all (a refusal counts: the server is up)."""
    try:
        with urllib.request.urlopen(url, timeout=2.0, context=context):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


class Azurite(ServerProcess):
    """An Azurite blob service with an in-memory store and one account, deleted on `stop`.

    Attributes (meaningful once started): ``host``, ``port``, ``account``, ``key`` (base64, as
    Azure prints account keys), ``endpoint`` (``http://127.0.0.1:PORT/ACCOUNT``, the account's
    blob endpoint) and ``connection_string``.
    """

    LOG_NAME = "azurite.log"

    def __init__(self, *, account: str = "cloudiotest", start_timeout: float = 120.0,
                 tls: Optional[TlsFiles] = None, oauth: bool = False) -> None:
        if oauth and tls is None:
            raise ValueError("Azurite checks bearer tokens over https only: oauth needs tls")
        self.host = "127.0.0.1"
        self.port = 0
        self.account = account
        self.tls = tls
        self.oauth = oauth
        self.key = base64.b64encode(secrets.token_bytes(64)).decode()
        self.start_timeout = start_timeout
        super().__init__()

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}/{self.account}"

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol={self.scheme};AccountName={self.account};AccountKey={self.key};"
                f"BlobEndpoint={self.endpoint};")

    def start(self) -> "Azurite":
        """Start the server and wait until it answers; RuntimeError (with the log tail) if not."""
        program = ensure_azurite()
        self._make_tmp("pegasus-cloudio-azurite-")
        try:
            self._launch(program)
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, program: Path) -> None:
        deadline = time.monotonic() + self.start_timeout
        for _ in range(_PORT_ATTEMPTS):
            self.port = free_port()
            # in memory, so no --location; what it still writes goes to its working dir, the temp dir
            cmd = [str(program), "--blobHost", self.host, "--blobPort", str(self.port), "--inMemoryPersistence",
                   "--skipApiVersionCheck", "--loose", "--disableProductStyleUrl", *self._tls_options()]
            env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE")}
            env["AZURITE_ACCOUNTS"] = f"{self.account}:{self.key}"
            self._spawn_logged(cmd, env)
            context = ssl.create_default_context(cafile=str(self.tls.ca_cert)) if self.tls else None
            if self._wait_until(deadline, lambda: _answers(f"{self.scheme}://{self.host}:{self.port}/", context),
                                _POLL_S):
                return
            if _PORT_IN_USE not in self.log_tail():
                break
            self._discard_process()
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"Azurite did not answer at {self.scheme}://{self.host}:{self.port}/ (it exited, or "
                           f"{self.start_timeout:.0f} s passed); log tail:\n{tail}")

    def _tls_options(self) -> List[str]:
        if self.tls is None:
            return []
        return ["--cert", str(self.tls.cert), "--key", str(self.tls.key), *(["--oauth", "basic"] if self.oauth else [])]
