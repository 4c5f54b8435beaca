"""The AWS credential chain for ``s3://BUCKET/KEY`` URLs, in botocore's order:

1. environment: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (+ ``AWS_SESSION_TOKEN``);
2. web identity (EKS): ``AWS_WEB_IDENTITY_TOKEN_FILE`` + ``AWS_ROLE_ARN`` (or the profile's
   ``web_identity_token_file``/``role_arn``), exchanged at STS by AssumeRoleWithWebIdentity;
   the token file is read again at every refresh (EKS rotates it);
3. shared files: ``~/.aws/credentials`` then ``~/.aws/config`` for ``AWS_PROFILE``;
   profiles using SSO, ``credential_process`` or ``role_arn`` go to botocore (``[aws]`` extra);
4. container (ECS/EKS Pod Identity): ``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`` (from
   169.254.170.2) or ``..._FULL_URI``, with ``AWS_CONTAINER_AUTHORIZATION_TOKEN[_FILE]``;
5. EC2 instance role through IMDSv2: PUT a session token, then GET the role and its keys
   (``AWS_EC2_METADATA_SERVICE_ENDPOINT``; skipped when ``AWS_EC2_METADATA_DISABLED=true``).
   Without ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` the link is tried only on a machine whose
   firmware says it is an EC2 instance (:func:`on_ec2`): elsewhere 169.254.169.254 is
   nobody's, and a library must not send packets to it.

Links 2, 4 and 5 hand out expiring credentials: :class:`RefreshingCredentials` renews them
before they expire (with a margin of 5 minutes, or half their lifetime if shorter), in one
thread while the others wait, and keeps using still-valid keys if a renewal fails. When no
link gives credentials, :class:`~transfer.errors.ConfigError` names every link and why it
gave none. Secrets are never part of a message. STS is asked through the proxy the environment
names for it, as botocore's STS client does (:func:`~transfer.http.proxy.boto_proxy_for`); the
container and instance metadata endpoints directly.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlencode, urlsplit
from xml.etree import ElementTree as ET

from transfer.backends._s3_wire import iso8601_epoch
from transfer.credentials import CredentialSource, Credentials, S3SiteConfig, read_credentials_file, read_ini
from transfer.errors import ConfigError, TransferError
from transfer.http.connection import Timeouts
from transfer.http.pool import ConnectionPool
from transfer.http.proxy import boto_proxy_for

Fetched = Tuple[Credentials, Optional[float]]  # keys and their expiry (epoch seconds) if any
_IMDS = "http://169.254.169.254"
_ECS = "http://169.254.170.2"
_TIMEOUTS = Timeouts(connect=1.0, read=2.0)
_MARGIN = 300.0


class RefreshingCredentials:
    """A credential source that renews expiring keys once, before they expire, under threads."""

    def __init__(self, fetch: Callable[[], Fetched], link: str, clock: Callable[[], float] = time.time) -> None:
        self.link = link
        self._fetch = fetch
        self._clock = clock
        self._lock = threading.Lock()
        self._current, self._refresh_at, self._expiry = self._renew()

    def _renew(self) -> Tuple[Credentials, float, float]:
        now = self._clock()
        credentials, expiry = self._fetch()
        if expiry is None:
            return credentials, float("inf"), float("inf")
        return credentials, expiry - min(_MARGIN, max(0.0, expiry - now) / 2), expiry

    def __call__(self) -> Credentials:
        if self._clock() < self._refresh_at:
            return self._current
        with self._lock:
            if self._clock() >= self._refresh_at:
                try:
                    self._current, self._refresh_at, self._expiry = self._renew()
                except TransferError:
                    if self._clock() >= self._expiry:
                        raise
            return self._current


def aws_s3_config(env: Mapping[str, str], clock: Callable[[], float] = time.time) -> S3SiteConfig:
    """Endpoint, region and credential source of ``s3://BUCKET/KEY`` URLs (see the module doc)."""
    profile, config = _profile(env)
    home = env.get("HOME") or os.path.expanduser("~")
    shared = read_ini(env.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"))
    endpoint, region = _place(env, config)
    source = resolve_credentials(env, profile, shared, config, clock)
    return S3SiteConfig(endpoint=endpoint, region=region, credentials=source() if source else None, source=source,
                        where=f"AWS settings (environment, profile '{profile}')")


def aws_endpoint_and_region(env: Mapping[str, str]) -> Tuple[Optional[str], Optional[str]]:
    """The endpoint and region the AWS settings name, for keys that came from elsewhere (no
    credential source runs)."""
    return _place(env, _profile(env)[1])


def _profile(env: Mapping[str, str]) -> Tuple[str, Dict[str, str]]:
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    home = env.get("HOME") or os.path.expanduser("~")
    config_file = read_ini(env.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"))
    return profile, config_file.get(profile if profile == "default" else f"profile {profile}", {})


def _place(env: Mapping[str, str], config: Dict[str, str]) -> Tuple[Optional[str], Optional[str]]:
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or config.get("region")
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or config.get("endpoint_url")
    return (endpoint.rstrip("/") if endpoint else None), region


def resolve_credentials(env: Mapping[str, str], profile: str, shared: Dict[str, Dict[str, str]],
                        config: Dict[str, str], clock: Callable[[], float] = time.time
                        ) -> Optional[CredentialSource]:
    """The first link of the chain that has credentials; ConfigError naming each link if none.

    ``shared`` is the parsed credentials file, ``config`` the profile's section of the config
    file. Returns None only when ``AWS_NO_SIGN_REQUEST`` asks for anonymous requests.
    """
    if env.get("AWS_NO_SIGN_REQUEST", "").lower() in ("1", "true", "yes"):
        return None
    reasons: List[str] = []
    for link in (_environment, _web_identity, _shared_files, _container, _instance_metadata):
        found = link(env, profile, shared, config, clock, reasons)
        if found is not None:
            return found
    raise ConfigError("no AWS credentials for s3://BUCKET URLs: " + "; ".join(reasons), operation="credentials")


def _fixed(credentials: Credentials) -> CredentialSource:
    return lambda: credentials


def _environment(env: Mapping[str, str], _profile: str, _shared: Dict[str, Dict[str, str]], _config: Dict[str, str],
                 _clock: Callable[[], float], reasons: List[str]) -> Optional[CredentialSource]:
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return _fixed(Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"],
                                  env.get("AWS_SESSION_TOKEN") or None))
    reasons.append("environment: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY not set")
    return None


def _shared_files(env: Mapping[str, str], profile: str, shared: Dict[str, Dict[str, str]], config: Dict[str, str],
                  _clock: Callable[[], float], reasons: List[str]) -> Optional[CredentialSource]:
    for section in (shared.get(profile, {}), config):
        if section.get("aws_access_key_id") and section.get("aws_secret_access_key"):
            return _fixed(Credentials(section["aws_access_key_id"], section["aws_secret_access_key"],
                                      section.get("aws_session_token") or None))
    delegated = sorted(k for k in ("sso_session", "sso_start_url", "credential_process", "role_arn")
                       if k in config and not (k == "role_arn" and "web_identity_token_file" in config))
    if delegated:
        return _botocore(profile, delegated)
    reasons.append(f"shared files: no keys for profile '{profile}'")
    return None


def _botocore(profile: str, settings: Sequence[str]) -> CredentialSource:
    """SSO, credential_process and assumed roles, resolved (and refreshed) by botocore."""
    link = f"profile '{profile}' ({', '.join(settings)})"
    try:
        import botocore.session  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        raise ConfigError(f"{link} needs botocore: pip install 'pegasus-cloudio[aws]'",
                          operation="credentials") from None
    found = botocore.session.Session(profile=None if profile == "default" else profile).get_credentials()
    if found is None:
        raise ConfigError(f"{link}: botocore found no credentials", operation="credentials")

    def current() -> Credentials:
        frozen = found.get_frozen_credentials()  # refreshes when botocore's own margin says so
        return Credentials(frozen.access_key, frozen.secret_key, frozen.token)
    return current


def _web_identity(env: Mapping[str, str], _profile: str, _shared: Dict[str, Dict[str, str]], config: Dict[str, str],
                  clock: Callable[[], float], reasons: List[str]) -> Optional[CredentialSource]:
    token_file = env.get("AWS_WEB_IDENTITY_TOKEN_FILE") or config.get("web_identity_token_file")
    role = env.get("AWS_ROLE_ARN") or config.get("role_arn")
    if not token_file or not role:
        reasons.append("web identity: AWS_WEB_IDENTITY_TOKEN_FILE/AWS_ROLE_ARN not set")
        return None
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or config.get("region")
    sts = env.get("AWS_ENDPOINT_URL_STS") or (f"https://sts.{region}.amazonaws.com" if region
                                              else "https://sts.amazonaws.com")
    session = env.get("AWS_ROLE_SESSION_NAME") or f"pegasus-cloudio-{uuid.uuid4().hex[:12]}"
    link = f"web identity ({sts})"

    def fetch() -> Fetched:
        token = read_credentials_file(token_file, f"{link} token file").decode("utf-8", "replace").strip()
        form = urlencode({"Action": "AssumeRoleWithWebIdentity", "Version": "2011-06-15", "RoleArn": role,
                          "RoleSessionName": session, "WebIdentityToken": token}).encode()
        body = _http(link, "POST", sts + "/", [("Content-Type", "application/x-www-form-urlencoded")], form, env)
        return _sts_credentials(link, body)
    return RefreshingCredentials(fetch, link, clock)


def _container(env: Mapping[str, str], _profile: str, _shared: Dict[str, Dict[str, str]], _config: Dict[str, str],
               clock: Callable[[], float], reasons: List[str]) -> Optional[CredentialSource]:
    relative = env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
    full = env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI")
    if not relative and not full:
        reasons.append("container: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI/FULL_URI not set")
        return None
    url = _ECS + relative if relative else str(full)
    link = f"container credentials ({url})"

    def fetch() -> Fetched:
        headers = []
        token = env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN")
        token_file = env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")
        if token_file:
            what = f"{link} AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"
            token = read_credentials_file(token_file, what).decode("utf-8", "replace").strip()
        if token:
            headers.append(("Authorization", token))
        return _json_credentials(link, _http(link, "GET", url, headers))
    return RefreshingCredentials(fetch, link, clock)


def _instance_metadata(env: Mapping[str, str], _profile: str, _shared: Dict[str, Dict[str, str]],
                       _config: Dict[str, str], clock: Callable[[], float], reasons: List[str]
                       ) -> Optional[CredentialSource]:
    if env.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true":
        reasons.append("instance metadata: AWS_EC2_METADATA_DISABLED=true")
        return None
    named = env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "").strip()
    if not named and not on_ec2():
        reasons.append("instance metadata: not asked, this machine is not an EC2 instance "
                       "(set AWS_EC2_METADATA_SERVICE_ENDPOINT to ask an endpoint anyway)")
        return None
    base = (named or _IMDS).rstrip("/")
    link = f"instance metadata ({base})"

    def fetch() -> Fetched:
        token = _http(link, "PUT", base + "/latest/api/token",
                      [("X-aws-ec2-metadata-token-ttl-seconds", "21600")]).decode().strip()
        auth = [("X-aws-ec2-metadata-token", token)]
        roles = _http(link, "GET", base + "/latest/meta-data/iam/security-credentials/", auth).decode().split()
        if not roles:
            raise ConfigError(f"{link}: the instance has no IAM role", operation="credentials")
        return _json_credentials(link, _http(link, "GET", f"{base}/latest/meta-data/iam/security-credentials/"
                                                          f"{roles[0]}", auth))
    try:
        return RefreshingCredentials(fetch, link, clock)
    except TransferError as err:
        reasons.append(f"{link}: {err.message}")
        return None


_EC2_MARKERS = (("/sys/devices/virtual/dmi/id/sys_vendor", "amazon ec2"),  # Nitro instances
                ("/sys/devices/virtual/dmi/id/bios_vendor", "amazon ec2"),
                ("/sys/hypervisor/uuid", "ec2"),                          # Xen instances
                ("/sys/devices/virtual/dmi/id/product_uuid", "ec2"))


def on_ec2(markers: Sequence[Tuple[str, str]] = _EC2_MARKERS) -> bool:
    """Whether the firmware says this is an EC2 instance (files as cloud-init's ds-identify reads)."""
    for path, start in markers:
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                if fh.read(64).strip().lower().startswith(start):
                    return True
        except OSError:
            continue
    return False


# --------------------------------------------------------------------------- wire


def _http(link: str, method: str, url: str, headers: List[Tuple[str, str]], body: Optional[bytes] = None,
          proxies: Optional[Mapping[str, str]] = None) -> bytes:
    """One request on a short-lived connection; ConfigError naming ``link`` unless 200.
    ``proxies``: the environment whose proxy botocore would take for ``url`` (its STS client
    does), or None to go direct (the link-local metadata endpoints: no proxy reaches them)."""
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}"
    proxy = boto_proxy_for(parts.scheme, origin, proxies) if proxies is not None else None
    pool = ConnectionPool(origin, max_idle=1, timeouts=_TIMEOUTS, proxy=proxy)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        with pool.request(method, target, headers, body if body is not None else (b"" if method != "GET" else None)) \
                as response:
            data = response.read()
    except TransferError as err:
        raise ConfigError(f"{link}: {err.message}", operation="credentials") from err
    finally:
        pool.close()
    if response.status != 200:
        raise ConfigError(f"{link}: HTTP {response.status}", operation="credentials")
    return data


def _json_credentials(link: str, body: bytes) -> Fetched:
    try:
        found = json.loads(body)
        credentials = Credentials(found["AccessKeyId"], found["SecretAccessKey"], found.get("Token") or None)
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{link}: answer is not a credentials document", operation="credentials") from None
    return credentials, iso8601_epoch(found.get("Expiration"))


def _sts_credentials(link: str, body: bytes) -> Fetched:
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        raise ConfigError(f"{link}: malformed STS answer", operation="credentials") from None
    values = {el.tag.rpartition("}")[2]: (el.text or "") for el in root.iter()}
    if not values.get("AccessKeyId") or not values.get("SecretAccessKey"):
        raise ConfigError(f"{link}: STS answer has no credentials", operation="credentials")
    return (Credentials(values["AccessKeyId"], values["SecretAccessKey"], values.get("SessionToken") or None),
            iso8601_epoch(values.get("Expiration")))
