"""Which endpoint and which credentials a ``gs://`` URL uses; pure Python, no Google imports.

Endpoint: ``PEGASUS_CLOUDIO_GCS_ENDPOINT`` (:attr:`Settings.gcs_endpoint`), else the standard
``STORAGE_EMULATOR_HOST`` (``http://`` is assumed when it has no scheme, as the other Google
clients do), else ``https://storage.googleapis.com``. Plain HTTP only when the endpoint says so.

Credentials, first match wins (``<site>`` is the URL's site label with ``-`` as ``_``):

1. ``GOOGLE_PKCS12_<site>``, then ``GOOGLE_PKCS12``: the key file a Pegasus site profile
   hands to the job (Pegasus's own tests pass a JSON key this way);
2. ``GOOGLE_APPLICATION_CREDENTIALS``;
3. anonymous access, when the endpoint came from ``STORAGE_EMULATOR_HOST`` or
   ``PEGASUS_CLOUDIO_GCS_ANONYMOUS=1``.

Key files must be JSON (service account, or an authorized-user file) and readable by their
owner only; a PKCS#12 (``.p12``) key is refused with a message saying how to get a JSON key.
All environment is read from the mapping passed in, never from ``os.environ``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from transfer.config import Settings, parse_flag
from transfer.credentials import read_private, site_env_suffix
from transfer.errors import ConfigError, InvalidInput
from transfer.knobs import origin_of

ANONYMOUS_VAR = "PEGASUS_CLOUDIO_GCS_ANONYMOUS"

DEFAULT_ENDPOINT = "https://storage.googleapis.com"
EMULATOR_PROJECT = "pegasus-cloudio-emulator"  # emulators ignore it, bucket create needs one
_KEY_TYPES = ("service_account", "authorized_user")


@dataclass(frozen=True)
class GcsSource:
    """Where requests go and what signs them. ``key_path`` None means anonymous."""

    endpoint: str
    emulator: bool
    key_path: Optional[str]

    @property
    def anonymous(self) -> bool:
        return self.key_path is None


def resolve(site_label: Optional[str], env: Mapping[str, str], settings: Settings) -> GcsSource:
    """The endpoint and credentials for a URL of ``site_label``; ConfigError when there are none."""
    endpoint, emulator = _endpoint(env, settings)
    key = _key_path(site_label, env)
    if key is not None:
        return GcsSource(endpoint, emulator, key)
    if emulator or _anonymous(env):
        return GcsSource(endpoint, emulator, None)
    suffix = site_env_suffix(site_label)
    names = (f"GOOGLE_PKCS12_{suffix}, " if suffix else "") + "GOOGLE_PKCS12, GOOGLE_APPLICATION_CREDENTIALS"
    raise ConfigError(f"no GCS credentials: set one of {names} to a JSON service-account key, "
                      "or PEGASUS_CLOUDIO_GCS_ANONYMOUS=1 for public buckets", operation="credentials")


def _anonymous(env: Mapping[str, str]) -> bool:
    """``PEGASUS_CLOUDIO_GCS_ANONYMOUS`` as every flag reads (unset: off); InvalidInput naming it."""
    raw = env.get(ANONYMOUS_VAR, "").strip()
    try:
        return parse_flag(raw) if raw else False
    except ValueError:
        raise InvalidInput(f"{ANONYMOUS_VAR}{origin_of(env, ANONYMOUS_VAR)} must be 1 or 0 (got {raw!r})",
                           operation="credentials") from None


def _endpoint(env: Mapping[str, str], settings: Settings) -> Tuple[str, bool]:
    configured = (settings.gcs_endpoint or "").strip()
    if configured:
        if not configured.startswith(("http://", "https://")):
            raise ConfigError("PEGASUS_CLOUDIO_GCS_ENDPOINT must start with http:// or https://",
                              url=configured, operation="connect")
        return configured.rstrip("/"), False
    emulator = env.get("STORAGE_EMULATOR_HOST", "").strip()
    if emulator:
        if "://" not in emulator:
            emulator = "http://" + emulator
        return emulator.rstrip("/"), True
    return DEFAULT_ENDPOINT, False


def _key_path(site_label: Optional[str], env: Mapping[str, str]) -> Optional[str]:
    suffix = site_env_suffix(site_label)
    names = ([f"GOOGLE_PKCS12_{suffix}"] if suffix else []) + ["GOOGLE_PKCS12", "GOOGLE_APPLICATION_CREDENTIALS"]
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return os.path.abspath(os.path.expanduser(value))
    return None


def load_key(path: str) -> Dict[str, Any]:
    """The parsed JSON key at ``path``, checked to be private and of a supported type.

    Messages name the file and the fix, never the key material.
    """
    raw = read_private(path, "key file")
    if path.lower().endswith((".p12", ".pfx")) or raw[:1] == b"\x30":  # DER SEQUENCE: PKCS#12
        raise ConfigError("PKCS#12 (.p12) keys are not supported; only JSON service-account keys "
                          "are: create one with 'gcloud iam service-accounts keys create KEY.json "
                          "--iam-account=ACCOUNT' and point GOOGLE_PKCS12 (or "
                          "GOOGLE_APPLICATION_CREDENTIALS) at it", url=path, operation="credentials")
    try:
        info = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ConfigError("not a JSON key file (only JSON service-account keys are supported)",
                          url=path, operation="credentials") from None
    if not isinstance(info, dict) or info.get("type") not in _KEY_TYPES:
        found = info.get("type") if isinstance(info, dict) else None
        raise ConfigError(f"unsupported key type {found!r} (expected a JSON service-account key)",
                          url=path, operation="credentials")
    return info


def project_for(source: GcsSource, info: Optional[Mapping[str, Any]], env: Mapping[str, str]) -> Optional[str]:
    """Project that owns new buckets: the key's, ``GOOGLE_CLOUD_PROJECT``, or a placeholder for emulators."""
    from_key = str(info.get("project_id") or info.get("quota_project_id") or "") if info else ""
    chosen = from_key or env.get("GOOGLE_CLOUD_PROJECT", "").strip()
    if chosen:
        return chosen
    return EMULATOR_PROJECT if source.emulator or source.anonymous else None
