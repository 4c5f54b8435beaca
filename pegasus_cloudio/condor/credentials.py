"""Credentials on the execute node: bearer tokens and naming the source a URL used.

Ways credentials reach the plugin (docs/condor.md has the submit-file side):

* ``s3://USER@SITE/BUCKET/KEY`` (Pegasus style): section ``[USER@SITE]`` of the Pegasus
  credentials file chosen by ``PEGASUS_CREDENTIALS_<SITE>``, then ``PEGASUS_CREDENTIALS``,
  then ``~/.pegasus/credentials.conf`` (each may come from the node file, the plugin's
  environment or the job's ``<PLUGIN>_*`` variables; see :mod:`.environment`).
* ``s3://BUCKET/KEY`` (AWS style): the AWS chain of the plugin's environment.
* ``gs://BUCKET/KEY``: the JSON key named by ``GOOGLE_PKCS12`` or
  ``GOOGLE_APPLICATION_CREDENTIALS`` (anonymous for an emulator).
* ``https://...?X-Amz-Signature=...``: URLs HTCondor pre-signed from the job's key files;
  the URL is the credential.
* ``<name>+https://...``: an OAuth/SciTokens bearer token from ``$_CONDOR_CREDS/<name>.use``
  (dots in ``<name>`` become underscores), re-read before every request because the starter
  refreshes it.

Descriptions name files, sections and variables, never a secret.
"""

from __future__ import annotations

import json
import os
from typing import Mapping, Optional
from urllib.parse import parse_qs, urlsplit

from pegasus_cloudio.condor.environment import PluginEnvironment
from transfer import schemes
from transfer.credentials import pegasus_credentials_path, read_private, site_env_suffix
from transfer.errors import ConfigError, InvalidInput
from transfer.urls import Url

_SIGNATURE_PARAMS = ("x-amz-signature", "x-goog-signature", "signature")


def token_path(name: str, env: Mapping[str, str]) -> str:
    """``$_CONDOR_CREDS/<name with . as _>.use``; InvalidInput for unsafe names."""
    if not name or "/" in name or name.startswith("."):
        raise InvalidInput(f"invalid credential name '{name}' in URL prefix", operation="credentials")
    creds_dir = env.get("_CONDOR_CREDS")
    if not creds_dir:
        raise ConfigError(f"URL asks for credential '{name}' but the job has no credentials "
                          "directory ($_CONDOR_CREDS is not set; see use_oauth_services)",
                          operation="credentials")
    return os.path.join(creds_dir, name.replace(".", "_") + ".use")


def read_token(name: str, env: Mapping[str, str]) -> str:
    """The access token in ``$_CONDOR_CREDS/<name>.use`` (JSON ``access_token`` or a bare line)."""
    path = token_path(name, env)
    text = read_private(path, "token file").decode("utf-8", "replace")
    token = _token_from_text(text)
    if not token:
        raise ConfigError("token file holds no access_token", url=path, operation="credentials")
    return token


def _token_from_text(text: str) -> Optional[str]:
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        value = data.get("access_token")
        return value.strip() if isinstance(value, str) and value.strip() else None
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line
    return None


def is_presigned(url_text: str) -> bool:
    """True for URLs carrying a query-string signature (S3 SigV2/V4, GCS V2/V4, Azure SAS)."""
    query = parse_qs(urlsplit(url_text).query)
    return any(key.lower() in _SIGNATURE_PARAMS for key in query)


def may_add_headers(url_text: str) -> bool:
    """Whether a request to ``url_text`` may carry headers its signature does not cover.

    V4 signatures (``X-Amz-Signature``, ``X-Goog-Signature``; HTCondor signs this way) list
    their signed headers, so an extra ``Content-MD5`` is fine; V2-style signatures cover
    ``Content-MD5`` whether sent or not, so adding one breaks them.
    """
    keys = {key.lower() for key in parse_qs(urlsplit(url_text).query)}
    return not is_presigned(url_text) or bool(keys & {"x-amz-signature", "x-goog-signature"})


def describe_source(url: Url, credential: Optional[str], penv: PluginEnvironment, presigned: bool) -> str:
    """Which credentials a transfer of ``url`` used, for error messages (never the secret)."""
    env = penv.env
    if credential:
        return f"bearer token file {_safe_token_path(credential, env)} (from the URL prefix '{credential}+')"
    if presigned:
        return ("the URL's own signature (HTCondor pre-signs s3:// and gs:// URLs with the job's "
                "key files; such URLs expire after one hour)")
    if url.scheme in schemes.S3 and "@" in url.host:
        return _pegasus_source(url, penv)
    if url.scheme in schemes.S3:
        return _aws_source(env, penv)
    if url.scheme == "gs":
        return _gcs_source(penv)
    return "no credentials (anonymous access), or header.* values of the Pegasus credentials file"


def _safe_token_path(name: str, env: Mapping[str, str]) -> str:
    try:
        return token_path(name, env)
    except (ConfigError, InvalidInput):
        return f"$_CONDOR_CREDS/{name.replace('.', '_')}.use"


def _pegasus_source(url: Url, penv: PluginEnvironment) -> str:
    env = penv.env
    path = pegasus_credentials_path(url.site_label, env)
    suffix = site_env_suffix(url.site_label)
    variable = next((v for v in (f"PEGASUS_CREDENTIALS_{suffix}" if suffix else "", "PEGASUS_CREDENTIALS")
                     if v and env.get(v)), None)
    named = f"named by {variable}, set by {penv.origin(variable)}" if variable else "the default location"
    return f"section [{url.host}] of Pegasus credentials file {path} ({named})"


def _gcs_source(penv: PluginEnvironment) -> str:
    for chosen in ("GOOGLE_PKCS12", "GOOGLE_APPLICATION_CREDENTIALS"):
        if penv.env.get(chosen):
            return f"GCS key file {penv.env[chosen]} (from {chosen}, set by {penv.origin(chosen)})"
    return "no GCS key (anonymous access: emulator or PEGASUS_CLOUDIO_GCS_ANONYMOUS)"


def _aws_source(env: Mapping[str, str], penv: PluginEnvironment) -> str:
    if env.get("AWS_ACCESS_KEY_ID"):
        return "the keys in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY of the plugin's environment"
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    shared = env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials"
    return f"AWS profile '{profile}' of {shared} (AWS credential chain of the plugin's environment)"
