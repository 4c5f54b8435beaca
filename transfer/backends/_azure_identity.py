"""Bearer tokens for Azure Blob Storage from Microsoft Entra identities (the ``[azure]`` extra).

Opt-in only: nothing here runs, and ``azure.identity`` is not imported, unless
``PEGASUS_CLOUDIO_AZURE_CREDENTIAL`` names an identity, or (workload identity only) the AKS
webhook's three variables ``AZURE_FEDERATED_TOKEN_FILE``, ``AZURE_CLIENT_ID`` and
``AZURE_TENANT_ID`` are all set. An anonymous read never probes a metadata endpoint.

``PEGASUS_CLOUDIO_AZURE_CREDENTIAL`` (env, config file; a Pegasus ``env`` profile is the env):

* ``managed-identity``: azure-identity's ``ManagedIdentityCredential`` (``AZURE_CLIENT_ID``,
  when set, picks a user-assigned identity). It reads the process environment itself:
  ``IDENTITY_ENDPOINT``/``IDENTITY_HEADER`` (App Service, Functions, Container Apps), else the
  instance metadata endpoint (a VM, a VM scale set);
* ``workload-identity``: ``WorkloadIdentityCredential`` with ``AZURE_TENANT_ID``,
  ``AZURE_CLIENT_ID``, ``AZURE_FEDERATED_TOKEN_FILE`` and ``AZURE_AUTHORITY_HOST`` read from the
  environment mapping given (not ``os.environ``);
* ``cli``: ``AzureCliCredential`` (the ``az login`` of the job's user);
* ``default``: ``DefaultAzureCredential`` (its whole chain, metadata probe included);
* ``none``: no identity (also turns off the implicit workload identity).

Tokens are for ``https://storage.azure.com/.default``, kept and renewed before they expire
(:class:`BearerTokens`). Every failure to get one is one :class:`~transfer.errors.ConfigError`
line naming the setting; there is no fallback to anonymous access. Tokens appear in no
message or ``repr``. The ``azure`` and ``msal`` loggers are set to ERROR when first used,
unless the program gave them a level itself: azure-identity logs each failed try on lines of
its own, and its debug records are no place for a token endpoint's answers.
"""

from __future__ import annotations

import logging
import threading
import time

from transfer.errors import ConfigError, InvalidInput
from transfer.knobs import origin_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Optional, Tuple

    TokenFetch = Callable[[], Tuple[str, float]]  # (token, expiry as a Unix time)

CREDENTIAL_VAR = "PEGASUS_CLOUDIO_AZURE_CREDENTIAL"
MODES = ("managed-identity", "workload-identity", "cli", "default", "none")
WORKLOAD_VARS = ("AZURE_FEDERATED_TOKEN_FILE", "AZURE_CLIENT_ID", "AZURE_TENANT_ID")
SCOPE = "https://storage.azure.com/.default"
REFRESH_MARGIN_S = 300.0  # renew this long before expiry (a short-lived token: at half its life)


def identity_mode(env: Mapping[str, str]) -> Optional[str]:
    """The identity ``env`` asks for (see the module docstring), or None; InvalidInput naming
    the setting and its source when it names none of :data:`MODES`."""
    raw = env.get(CREDENTIAL_VAR, "").strip().lower()
    if raw:
        if raw not in MODES:
            raise InvalidInput(f"{CREDENTIAL_VAR}{origin_of(env, CREDENTIAL_VAR)} must be one of "
                               f"{', '.join(MODES)} (got {raw!r})", operation="credentials")
        return None if raw == "none" else raw
    if all(env.get(name, "").strip() for name in WORKLOAD_VARS):
        return "workload-identity"
    return None


def describe(mode: str, env: Mapping[str, str]) -> str:
    """Where the identity came from, for messages: the setting and its value, or the AKS variables."""
    if env.get(CREDENTIAL_VAR, "").strip() or mode != "workload-identity":
        return f"{CREDENTIAL_VAR}={mode}{origin_of(env, CREDENTIAL_VAR)}"
    return f"workload identity ({', '.join(WORKLOAD_VARS)}; {CREDENTIAL_VAR}=none turns it off)"


class BearerTokens:
    """The current token of one identity, thread-safe: fetched on first use, then again when
    less than :data:`REFRESH_MARGIN_S` (or half its lifetime, if shorter) is left. ``fetch``
    returns (token, expiry as a Unix time) or raises; ``clock`` is ``time.time``'s shape."""

    def __init__(self, fetch: TokenFetch, clock: Callable[[], float] = time.time) -> None:
        self._fetch = fetch
        self._clock = clock
        self._lock = threading.Lock()
        self._token = ""
        self._renew_at = 0.0

    def __repr__(self) -> str:  # never the token
        return "BearerTokens()"

    def authorization(self) -> str:
        """``Bearer TOKEN``, renewed first when due."""
        with self._lock:
            now = self._clock()
            if not self._token or now >= self._renew_at:
                token, expires = self._fetch()
                self._token = token
                self._renew_at = expires - min(REFRESH_MARGIN_S, max(0.0, expires - now) / 2)
            return f"Bearer {self._token}"


def token_fetch(mode: str, env: Mapping[str, str], ca_bundle: Optional[str], account: str) -> TokenFetch:
    """The fetch of :class:`BearerTokens` for ``mode`` (azure-identity imported here, only);
    ConfigError naming the setting when the extra is missing or the identity gives no token."""
    where = describe(mode, env)
    _quiet(("azure", "msal"))
    try:
        credential = _credential(mode, env, {"connection_verify": ca_bundle} if ca_bundle else {})
    except ImportError:
        raise ConfigError(f"{where} needs azure-identity: pip install 'pegasus-cloudio[azure]'",
                          operation="credentials") from None
    except ValueError as err:  # a missing tenant, client id or token file
        raise ConfigError(f"{where}: {_first_line(err)}", operation="credentials") from None

    def fetch() -> Tuple[str, float]:
        try:
            got = credential.get_token(SCOPE)
        except Exception as err:  # azure-identity's ClientAuthenticationError and kin
            raise ConfigError(f"{where} got no token for storage account {account}: {_first_line(err)}",
                              operation="credentials") from None
        return got.token, float(got.expires_on)
    return fetch


def _credential(mode: str, env: Mapping[str, str], transport: Mapping[str, Any]) -> Any:
    import azure.identity as identity  # the [azure] extra; only once an identity is asked for
    client_id = env.get("AZURE_CLIENT_ID", "").strip() or None
    if mode == "managed-identity":
        return identity.ManagedIdentityCredential(client_id=client_id, **transport)
    if mode == "workload-identity":
        authority = env.get("AZURE_AUTHORITY_HOST", "").strip() or None
        return identity.WorkloadIdentityCredential(
            tenant_id=env.get("AZURE_TENANT_ID", "").strip() or None, client_id=client_id,
            token_file_path=env.get("AZURE_FEDERATED_TOKEN_FILE", "").strip() or None,
            **({"authority": authority} if authority else {}), **transport)
    if mode == "cli":
        return identity.AzureCliCredential()
    return identity.DefaultAzureCredential(**transport)


def _quiet(names: Tuple[str, ...]) -> None:
    for name in names:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.ERROR)


def _first_line(err: BaseException) -> str:
    text = " ".join(str(err).split("\n", 1)[0].split())
    return text[:300] or type(err).__name__
