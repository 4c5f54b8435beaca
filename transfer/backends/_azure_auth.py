"""Which endpoint and credentials reach an Azure storage account, from the Azure CLI's names.

For ``az://ACCOUNT/...`` the first of these that is about ``ACCOUNT`` decides (credentials
only where the user pointed them: a key set for another account is never sent):

1. ``AZURE_STORAGE_CONNECTION_STRING`` whose ``AccountName`` (or, without one, the account of
   its ``BlobEndpoint``) is ``ACCOUNT``: its ``AccountKey`` or ``SharedAccessSignature``, and
   its endpoint (``BlobEndpoint``, else ``DefaultEndpointsProtocol`` and ``EndpointSuffix``).
   ``UseDevelopmentStorage=true`` is the emulator's documented account on 127.0.0.1:10000.
2. ``AZURE_STORAGE_ACCOUNT`` equal to ``ACCOUNT``: ``AZURE_STORAGE_KEY`` (or
   ``AZURE_STORAGE_ACCESS_KEY``), else ``AZURE_STORAGE_SAS_TOKEN``; endpoint
   ``https://ACCOUNT.blob.core.windows.net``.
3. An Entra identity (:mod:`._azure_identity`: ``PEGASUS_CLOUDIO_AZURE_CREDENTIAL``, or the
   AKS workload-identity variables) when 1 and 2 gave no key or SAS, at the endpoint they
   named (else the default one): requests then carry a bearer token, over https only.
4. Otherwise anonymous (public containers), at that endpoint.

A SAS in the URL itself (``az://ACCOUNT/C/B?sv=...&sig=...``) is used for that URL instead of
the account's credentials. Plain http only where a connection string asks for it. Errors
name the variable, never its value.
"""

from __future__ import annotations

from transfer.backends._azure_identity import describe, identity_mode
from transfer.errors import ConfigError, InvalidInput
from transfer.lean import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Mapping, Optional

CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"
DEFAULT_SUFFIX = "core.windows.net"
# The emulator's account and key, published in Azure's documentation (not a secret).
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_ACCOUNT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


@record(frozen=True)
class AzureAccess:
    """How to reach one account: ``endpoint`` (``scheme://host[:port][/path]``, no trailing
    ``/``: a path-style emulator's ends with the account), a Shared Key ``key`` (base64) or a
    ``sas`` (without ``?``), or an Entra ``identity`` (a mode of :mod:`._azure_identity`), or
    none (anonymous); ``where`` names the source for messages."""

    account: str
    endpoint: str
    key: Optional[str] = None
    sas: Optional[str] = None
    where: str = "no credentials (anonymous)"
    identity: Optional[str] = None

    def __repr__(self) -> str:  # never the key or the SAS
        return f"AzureAccess(account={self.account!r}, endpoint={self.endpoint!r}, where={self.where!r})"


def check_account(account: str, url: str) -> None:
    """InvalidInput naming ``url`` unless ``account`` is a storage account name (3-24 of a-z, 0-9)."""
    if not 3 <= len(account) <= 24 or not _ACCOUNT_CHARS.issuperset(account):
        raise InvalidInput(f"{account!r} is no storage account name (3 to 24 lower-case letters and digits): "
                           "expected az://ACCOUNT/CONTAINER/BLOB", url=url, operation="parse")


def default_endpoint(account: str, suffix: str = DEFAULT_SUFFIX, protocol: str = "https") -> str:
    return f"{protocol}://{account}.blob.{suffix}"


def resolve(account: str, env: Mapping[str, str]) -> AzureAccess:
    """The access to ``account`` the environment gives (see the module docstring)."""
    found = _from_names(account, env)
    if found.key or found.sas:
        return found
    mode = identity_mode(env)
    if mode is None:
        return found
    return AzureAccess(account, found.endpoint, identity=mode, where=describe(mode, env))


def _from_names(account: str, env: Mapping[str, str]) -> AzureAccess:
    """Steps 1 to 3 of the module docstring: a key, a SAS, or an endpoint alone."""
    text = env.get(CONNECTION_STRING, "").strip()
    if text:
        found = _from_connection_string(parse_connection_string(text), account)
        if found is not None:
            return found
    if env.get("AZURE_STORAGE_ACCOUNT", "").strip() == account:
        key = (env.get("AZURE_STORAGE_KEY") or env.get("AZURE_STORAGE_ACCESS_KEY") or "").strip()
        if key:
            return AzureAccess(account, default_endpoint(account), key=key, where="AZURE_STORAGE_KEY")
        sas = env.get("AZURE_STORAGE_SAS_TOKEN", "").strip().lstrip("?")
        if sas:
            return AzureAccess(account, default_endpoint(account), sas=sas, where="AZURE_STORAGE_SAS_TOKEN")
    return AzureAccess(account, default_endpoint(account))


def parse_connection_string(text: str) -> Dict[str, str]:
    """``Name=value;...`` (a value may hold ``=``: keys and SAS tokens do), names as written;
    ConfigError naming the variable, not the text, when a part has no ``=``."""
    fields: Dict[str, str] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"{CONNECTION_STRING} is not a connection string (Name=value;... expected)",
                              operation="credentials")
        fields[name.strip()] = value.strip()
    return fields


def _from_connection_string(fields: Mapping[str, str], account: str) -> Optional[AzureAccess]:
    if fields.get("UseDevelopmentStorage", "").lower() == "true":
        fields = {"AccountName": DEV_ACCOUNT, "AccountKey": DEV_KEY,
                  "BlobEndpoint": f"http://127.0.0.1:10000/{DEV_ACCOUNT}", **fields}
    endpoint = fields.get("BlobEndpoint", "").rstrip("/")
    named = fields.get("AccountName") or _account_of(endpoint)
    if named != account:
        return None
    if not endpoint:
        protocol = fields.get("DefaultEndpointsProtocol", "https").lower()
        if protocol not in ("http", "https"):
            raise ConfigError(f"{CONNECTION_STRING}: DefaultEndpointsProtocol must be http or https",
                              operation="credentials")
        endpoint = default_endpoint(account, fields.get("EndpointSuffix") or DEFAULT_SUFFIX, protocol)
    elif not endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"{CONNECTION_STRING}: BlobEndpoint must start with http:// or https://",
                          operation="credentials")
    key = fields.get("AccountKey") or None
    sas = (fields.get("SharedAccessSignature") or "").lstrip("?") or None
    return AzureAccess(account, endpoint, key=key, sas=None if key else sas, where=CONNECTION_STRING)


def _account_of(endpoint: str) -> str:
    """The account an endpoint names: the first label of ``ACCOUNT.blob.SUFFIX``, else the first
    path segment (a path-style emulator, ``http://127.0.0.1:10000/ACCOUNT``)."""
    rest = endpoint.partition("://")[2]
    host, _, path = rest.partition("/")
    label, dot, tail = host.partition(".")
    if dot and tail.startswith("blob."):
        return label
    return path.split("/", 1)[0]
