"""az:// with Microsoft Entra identities (the ``[azure]`` extra's azure-identity), on real parts:
Azurite over https checking bearer tokens (``--oauth basic``) and a loopback token server in
the roles of the App Service managed-identity endpoint and of Entra's token endpoint for
workload identity (:mod:`pegasus_cloudio_testbed.entra`). No packet leaves the machine: the
managed identity is reached through ``IDENTITY_ENDPOINT``, never the instance metadata
address, and workload identity through ``AZURE_AUTHORITY_HOST``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any, Dict, Iterator

import pytest
from azure.storage.blob import BlobServiceClient

from pegasus_cloudio_testbed.azurite import Azurite
from pegasus_cloudio_testbed.certs import TlsFiles, make_tls_files
from pegasus_cloudio_testbed.entra import TokenServer
from transfer.backends._azure_auth import resolve
from transfer.backends._azure_identity import CREDENTIAL_VAR, REFRESH_MARGIN_S, BearerTokens, identity_mode
from transfer.backends._azure_sign import X_MS_VERSION
from transfer.client import Client
from transfer.errors import AuthError, ConfigError, InvalidInput

DROPIN = [sys.executable, "-m", "pegasus_cloudio.dropin"]
WORKLOAD = {"AZURE_FEDERATED_TOKEN_FILE": "/var/run/secrets/token", "AZURE_CLIENT_ID": "c", "AZURE_TENANT_ID": "t"}


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def oauth_azurite(tls: TlsFiles) -> Iterator[Azurite]:
    with Azurite(tls=tls, oauth=True) as server:
        yield server


@pytest.fixture
def tokens(tls: TlsFiles) -> Iterator[TokenServer]:
    with TokenServer(tls) as server:
        yield server


@pytest.fixture
def sdk(oauth_azurite: Azurite, tls: TlsFiles) -> Iterator[Any]:
    """A new private container, through the reference client with the account key."""
    service = BlobServiceClient.from_connection_string(oauth_azurite.connection_string,
                                                       connection_verify=str(tls.ca_cert))
    container = service.create_container(f"t-{uuid.uuid4().hex[:16]}")
    with container:
        yield container


def _env(azurite: Azurite, tls: TlsFiles, tmp_path, **more: str) -> Dict[str, str]:
    """The endpoint only (no key, no SAS), our CA, and ``more``."""
    return {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull, "AWS_EC2_METADATA_DISABLED": "true",
            "AZURE_STORAGE_CONNECTION_STRING": f"BlobEndpoint={azurite.endpoint}",
            "PEGASUS_CLOUDIO_CA_BUNDLE": str(tls.ca_cert), **more}


def _dropin(entries: list, env: dict, cwd, *flags: str) -> subprocess.CompletedProcess:
    """The drop-in of the checkout under test (the runner's PYTHONPATH goes with it)."""
    path = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    return subprocess.run([*DROPIN, *flags], input=json.dumps(entries), cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=dict(env, PATH=os.environ["PATH"], **path))


def _transfer(src: str, dst: str, lfn: str, src_label: str = "local", dst_label: str = "azure") -> dict:
    return {"type": "transfer", "lfn": lfn, "id": 1, "src_urls": [{"site_label": src_label, "url": src}],
            "dest_urls": [{"site_label": dst_label, "url": dst}]}


# -- the setting, without servers ---------------------------------------------------------


def test_an_identity_is_used_only_when_asked_for_and_a_key_or_sas_comes_first() -> None:
    assert identity_mode({}) is None
    assert identity_mode({CREDENTIAL_VAR: "Managed-Identity"}) == "managed-identity"
    assert identity_mode(WORKLOAD) == "workload-identity"  # the AKS webhook's three variables
    assert identity_mode({k: v for k, v in WORKLOAD.items() if k != "AZURE_TENANT_ID"}) is None
    assert identity_mode({**WORKLOAD, CREDENTIAL_VAR: "none"}) is None
    assert identity_mode({**WORKLOAD, CREDENTIAL_VAR: "cli"}) == "cli"
    with pytest.raises(InvalidInput) as bad:
        identity_mode({CREDENTIAL_VAR: "msi"})
    assert CREDENTIAL_VAR in str(bad.value) and "\n" not in str(bad.value)
    keyed = {CREDENTIAL_VAR: "managed-identity", "AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_KEY": "a2V5"}
    assert resolve("acct", keyed).identity is None and resolve("acct", keyed).key == "a2V5"
    assert resolve("other", keyed).identity == "managed-identity"
    assert CREDENTIAL_VAR in resolve("other", keyed).where


def test_bearer_tokens_are_kept_and_renewed_before_they_expire() -> None:
    now = [1000.0]
    fetched = []

    def fetch():
        fetched.append(now[0])
        return f"token-{len(fetched)}", now[0] + 3600

    tokens = BearerTokens(fetch, clock=lambda: now[0])
    assert tokens.authorization() == "Bearer token-1"
    now[0] += 3600 - REFRESH_MARGIN_S - 1
    assert tokens.authorization() == "Bearer token-1" and len(fetched) == 1  # still well within its life
    now[0] += 2
    assert tokens.authorization() == "Bearer token-2"  # renewed before it expired
    assert "token" not in repr(tokens)


def test_a_bearer_token_is_never_sent_over_plain_http(tmp_path) -> None:
    env = {"HOME": str(tmp_path), CREDENTIAL_VAR: "managed-identity",
           "AZURE_STORAGE_CONNECTION_STRING": "BlobEndpoint=http://127.0.0.1:9/acct"}
    with Client(env=env) as client:
        with pytest.raises(ConfigError) as refused:
            client.read_bytes("az://acct/c/b")
    assert CREDENTIAL_VAR in str(refused.value) and "https only" in str(refused.value)
    assert X_MS_VERSION >= "2017-11-09"  # the oldest version the service takes OAuth with


# -- on Azurite with --oauth basic ----------------------------------------------------------


def test_managed_identity_reads_and_writes_with_one_token(oauth_azurite, tls, tokens, sdk, tmp_path,
                                                           monkeypatch) -> None:
    for name, value in tokens.managed_identity_env().items():  # azure-identity reads these itself
        monkeypatch.setenv(name, value)
    sdk.upload_blob("in/a.txt", b"from the service")
    env = _env(oauth_azurite, tls, tmp_path, **{CREDENTIAL_VAR: "managed-identity"})
    base = f"az://{oauth_azurite.account}/{sdk.container_name}"
    with Client(env=env, ca_bundle=str(tls.ca_cert)) as client:
        assert client.read_bytes(f"{base}/in/a.txt") == b"from the service"
        client.write_bytes(f"{base}/out/b.txt", b"written with a token")
        client.write_bytes(f"{base}/out/c.txt", b"and another")
        assert [e.url for e in client.list(f"{base}/out")] == [f"{base}/out/b.txt", f"{base}/out/c.txt"]
        assert sdk.get_blob_client("out/b.txt").download_blob().readall() == b"written with a token"
        client.remove(f"{base}/out", recursive=True)  # one Blob Batch, each sub-request with the token
    assert [b.name for b in sdk.list_blobs()] == ["in/a.txt"]
    assert tokens.requests == 1  # kept for every request of the run


def test_workload_identity_through_the_drop_in_reads_and_writes_and_never_shows_the_token(
        oauth_azurite, tls, tokens, sdk, tmp_path) -> None:
    # no setting: the AKS webhook's variables alone turn workload identity on
    env = _env(oauth_azurite, tls, tmp_path, **tokens.workload_identity_env(tmp_path / "federated"))
    base = f"az://{oauth_azurite.account}/{sdk.container_name}/wi"
    names = [f"f{n}.dat" for n in range(6)]
    for name in names:
        (tmp_path / name).write_bytes(os.urandom(900))
    up = _dropin([_transfer(f"file://{tmp_path}/{n}", f"{base}/{n}", n) for n in names], env, tmp_path, "-d")
    assert up.returncode == 0, up.stderr[-3000:]
    back = tmp_path / "back"
    down = _dropin([_transfer(f"{base}/{n}", f"file://{back}/{n}", n, "azure", "local") for n in names],
                   env, tmp_path, "-d")
    assert down.returncode == 0, down.stderr[-3000:]
    assert all((back / n).read_bytes() == (tmp_path / n).read_bytes() for n in names)
    assert sorted(b.name for b in sdk.list_blobs("wi/")) == sorted(f"wi/{n}" for n in names)
    assert tokens.issued  # the token server was asked: the requests did carry its tokens
    shown = up.stdout + up.stderr + down.stdout + down.stderr
    for secret in [*tokens.issued, tokens.federated_token]:
        assert secret not in shown
        assert secret.split(".")[-1] not in shown  # not even its signature


def test_a_token_the_service_refuses_fails_in_one_line_and_leaves_no_partial_file(oauth_azurite, tls, tokens,
                                                                                   sdk, tmp_path) -> None:
    sdk.upload_blob("refused.dat", os.urandom(5000))
    tokens.audience = "https://vault.azure.net"  # a token, but for another service
    env = _env(oauth_azurite, tls, tmp_path, **tokens.workload_identity_env(tmp_path / "federated"),
               **{CREDENTIAL_VAR: "workload-identity"})
    (tmp_path / "out").mkdir()
    url = f"az://{oauth_azurite.account}/{sdk.container_name}/refused.dat"
    done = _dropin([_transfer(url, f"file://{tmp_path}/out/refused.dat", "refused.dat", "azure", "local")],
                   env, tmp_path)
    assert done.returncode != 0
    assert os.listdir(tmp_path / "out") == []
    lines = [line for line in done.stderr.splitlines() if CREDENTIAL_VAR in line]
    assert lines and oauth_azurite.account in lines[0], done.stderr[-3000:]
    assert not any(token in done.stderr for token in tokens.issued)
    with Client(env=env, ca_bundle=str(tls.ca_cert)) as client:
        with pytest.raises(AuthError) as refused:
            client.read_bytes(url)
    assert CREDENTIAL_VAR in str(refused.value) and "\n" not in str(refused.value)


def test_an_identity_without_a_token_is_an_error_not_an_anonymous_read(oauth_azurite, tls, tokens, sdk, tmp_path,
                                                                         monkeypatch) -> None:
    sdk.set_container_access_policy(signed_identifiers={}, public_access="blob")
    sdk.upload_blob("public.txt", b"anyone may read this")
    env = _env(oauth_azurite, tls, tmp_path, **{CREDENTIAL_VAR: "managed-identity"})
    url = f"az://{oauth_azurite.account}/{sdk.container_name}/public.txt"
    anonymous = {k: v for k, v in env.items() if k != CREDENTIAL_VAR}
    with Client(env=anonymous, ca_bundle=str(tls.ca_cert)) as client:
        assert client.read_bytes(url) == b"anyone may read this"  # anonymous works: the blob is public
    monkeypatch.setenv("IDENTITY_ENDPOINT", tokens.managed_identity_env()["IDENTITY_ENDPOINT"])
    monkeypatch.setenv("IDENTITY_HEADER", "not-the-header")
    with Client(env=env, ca_bundle=str(tls.ca_cert)) as client:
        with pytest.raises(ConfigError) as failed:
            client.read_bytes(url)
    message = str(failed.value)
    assert f"{CREDENTIAL_VAR}=managed-identity" in message and "no token" in message and "\n" not in message
    assert tokens.requests >= 1


def test_a_missing_federated_token_file_is_one_line_naming_the_setting(oauth_azurite, tls, sdk, tmp_path) -> None:
    env = _env(oauth_azurite, tls, tmp_path, **{CREDENTIAL_VAR: "workload-identity"},
               **{**WORKLOAD, "AZURE_FEDERATED_TOKEN_FILE": str(tmp_path / "absent"),
                  "AZURE_AUTHORITY_HOST": "https://127.0.0.1:9"})
    (tmp_path / "out").mkdir()
    url = f"az://{oauth_azurite.account}/{sdk.container_name}/x"
    done = _dropin([_transfer(url, f"file://{tmp_path}/out/x", "x", "azure", "local")], env, tmp_path)
    assert done.returncode != 0 and os.listdir(tmp_path / "out") == []
    assert any(f"{CREDENTIAL_VAR}=workload-identity" in line for line in done.stderr.splitlines()), done.stderr


# -- what an anonymous or shared-key job imports ---------------------------------------------


def _imports(entries: list, env: dict, cwd) -> set:
    path = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    done = subprocess.run([sys.executable, "-X", "importtime", *DROPIN[1:]], input=json.dumps(entries), cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=dict(env, PATH=os.environ["PATH"], **path))
    assert done.returncode == 0, done.stderr[-3000:]
    return {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


def test_shared_key_and_anonymous_jobs_import_nothing_of_azure_identity(azurite, azure_env, azure_container,
                                                                         azure_sdk, oauth_azurite, tls, tokens, sdk,
                                                                         tmp_path) -> None:
    azure_sdk.upload_blob("k.txt", b"k")
    keyed = _imports([_transfer(f"az://{azurite.account}/{azure_container}/k.txt", f"file://{tmp_path}/k.txt",
                                "k.txt", "azure", "local")], azure_env, tmp_path)
    sdk.set_container_access_policy(signed_identifiers={}, public_access="blob")
    sdk.upload_blob("p.txt", b"p")
    url = f"az://{oauth_azurite.account}/{sdk.container_name}/p.txt"
    anonymous = _imports([_transfer(url, f"file://{tmp_path}/p.txt", "p.txt", "azure", "local")],
                         _env(oauth_azurite, tls, tmp_path), tmp_path)
    identity = _imports([_transfer(url, f"file://{tmp_path}/q.txt", "q.txt", "azure", "local")],
                        _env(oauth_azurite, tls, tmp_path, **tokens.workload_identity_env(tmp_path / "fed")),
                        tmp_path)
    for found in (keyed, anonymous):
        assert "transfer.backends.azure" in found  # the backend did load
        assert not {name for name in found if name.split(".")[0] in ("azure", "msal", "jwt", "requests")}
    assert "azure.identity" in identity  # the probe can tell
