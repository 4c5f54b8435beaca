"""A loopback stand-in for Microsoft Entra's token services, as azure-identity calls them.

One https server (a :func:`~pegasus_cloudio_testbed.certs.make_tls_files` certificate) answers:

* ``GET /msi/token?api-version=2019-08-01&resource=R`` with ``X-IDENTITY-HEADER``: the App
  Service managed-identity endpoint (``IDENTITY_ENDPOINT``/``IDENTITY_HEADER`` in a job's
  environment, :meth:`TokenServer.managed_identity_env`); a wrong header is refused (401);
* ``POST /TENANT/oauth2/v2.0/token`` (``grant_type=client_credentials`` with a
  ``client_assertion``): the token endpoint workload identity calls, with the authority host
  overridden (``AZURE_AUTHORITY_HOST``, :meth:`TokenServer.workload_identity_env`); an
  assertion other than the federated token file's, or another tenant or client id, is
  refused (400 ``invalid_client``).

Tokens are JWTs that Azurite's ``--oauth basic`` accepts (issuer ``https://sts.windows.net/TENANT/``,
audience :attr:`TokenServer.audience`, ``iat``/``nbf`` a minute ago, ``exp`` after
:attr:`TokenServer.lifetime` seconds), signed with a key of the server's own that nobody checks.
Set ``audience`` to another value to issue tokens Azurite refuses. ``issued`` lists every
token given out, ``requests`` counts token requests.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Dict, List, Optional, Union

from .certs import TlsFiles
from .webserver import serve

__all__ = ["TokenServer"]

STORAGE_AUDIENCE = "https://storage.azure.com"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    """Managed identity (App Service style) and workload identity tokens on 127.0.0.1; use as a
    context manager. ``tenant``, ``client_id``: the identity's; ``federated_token``: what the
    workload's token file must hold."""

    def __init__(self, tls: TlsFiles, *, lifetime: int = 3600) -> None:
        self.tls = tls
        self.lifetime = lifetime
        self.audience = STORAGE_AUDIENCE
        self.tenant = str(uuid.uuid4())
        self.client_id = str(uuid.uuid4())
        self.identity_header = secrets.token_hex(16)
        self.federated_token = _b64url(secrets.token_bytes(48))
        self.issued: List[str] = []
        self.requests = 0
        self._key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._server = None  # type: Optional[object]
        self.port = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def managed_identity_env(self) -> Dict[str, str]:
        return {"IDENTITY_ENDPOINT": f"{self.url}/msi/token", "IDENTITY_HEADER": self.identity_header}

    def workload_identity_env(self, token_file: Union[str, Path]) -> Dict[str, str]:
        """The AKS webhook's variables; writes :attr:`federated_token` to ``token_file``."""
        Path(token_file).write_text(self.federated_token)
        return {"AZURE_AUTHORITY_HOST": self.url, "AZURE_TENANT_ID": self.tenant, "AZURE_CLIENT_ID": self.client_id,
                "AZURE_FEDERATED_TOKEN_FILE": str(token_file)}

    def __enter__(self) -> "TokenServer":
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                owner._managed_identity(self)

            def do_POST(self) -> None:  # noqa: N802
                owner._workload_identity(self)

            def log_message(self, *args: object) -> None:
                pass
        server = serve(Handler, self.tls)
        self._server = server
        self.port = server.server_address[1]
        return self

    def __exit__(self, *exc: object) -> None:
        server = self._server
        if server is not None:
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]

    def token(self) -> str:
        """A new token as configured now (audience, lifetime), recorded in :attr:`issued`."""
        now = int(time.time())
        header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        claims = {"aud": self.audience, "iss": f"https://sts.windows.net/{self.tenant}/", "iat": now - 60,
                  "nbf": now - 60, "exp": now + self.lifetime, "tid": self.tenant, "appid": self.client_id,
                  "oid": str(uuid.uuid4()), "ver": "1.0"}
        body = _b64url(json.dumps(claims).encode())
        signature = _b64url(hmac.new(self._key, f"{header}.{body}".encode(), hashlib.sha256).digest())
        token = f"{header}.{body}.{signature}"
        with self._lock:
            self.issued.append(token)
        return token

    def _count(self) -> None:
        with self._lock:
            self.requests += 1

    def _managed_identity(self, request: BaseHTTPRequestHandler) -> None:
        self._count()
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.path).query)
        header = request.headers.get("X-IDENTITY-HEADER")
        if not request.path.startswith("/msi/token") or header != self.identity_header:
            _answer(request, 401, {"statusCode": 401, "message": "Unauthorized"})
            return
        resource = query.get("resource", [""])[0]
        _answer(request, 200, {"access_token": self.token(), "expires_on": str(int(time.time()) + self.lifetime),
                               "resource": resource, "token_type": "Bearer", "client_id": self.client_id})

    def _workload_identity(self, request: BaseHTTPRequestHandler) -> None:
        self._count()
        length = int(request.headers.get("Content-Length") or 0)
        form = urllib.parse.parse_qs(request.rfile.read(length).decode())
        field = {name: values[0] for name, values in form.items()}
        if (request.path != f"/{self.tenant}/oauth2/v2.0/token" or field.get("client_id") != self.client_id
                or field.get("client_assertion") != self.federated_token):
            _answer(request, 400, {"error": "invalid_client", "error_description": "AADSTS700213: No matching "
                                   "federated identity record found for presented assertion."})
            return
        _answer(request, 200, {"token_type": "Bearer", "expires_in": self.lifetime, "ext_expires_in": self.lifetime,
                               "access_token": self.token()})


def _answer(request: BaseHTTPRequestHandler, status: int, document: Dict[str, object]) -> None:
    body = json.dumps(document).encode()
    request.send_response(status)
    request.send_header("Content-Type", "application/json")
    request.send_header("Content-Length", str(len(body)))
    request.end_headers()
    request.wfile.write(body)
