"""The Azure backend against a real Azurite: reads, writes, ranges, listing pages, deletes, copies,
blocked uploads, errors, credentials and SAS tokens. azure-storage-blob (the reference
client) checks what our writes stored and stores what our reads must find."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

import pytest
from azure.storage.blob import ContainerSasPermissions, ContentSettings, generate_container_sas

from pegasus_cloudio_testbed.azurite import Azurite
from pegasus_cloudio_testbed.faults import Fault
from pegasus_cloudio_testbed.proxy import TcpProxy
from transfer import Settings
from transfer.client import Client
from transfer.backends._azure_auth import AzureAccess, resolve
from transfer.backends.azure import AzureBackend
from transfer.backends.base import MultipartUploads, RangedReads, ServerSideCopy, Store, Touches
from transfer.context import Context
from transfer.errors import AuthError, ChecksumMismatch, ConfigError, InvalidInput, NotFound, RemoteError, Throttled, TransientError
from transfer.http.pool import ConnectionPool, PoolStats
from transfer.session import Session
from transfer.urls import parse_url

SERVER_BUSY = (b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
               b"<Message>The server is busy.\nRequestId:1</Message></Error>")


@pytest.fixture
def session(azure_env: dict) -> Iterator[Session]:
    with Session(Settings(), azure_env) as opened:
        yield opened


def _url(azurite: Azurite, container: str, blob: str = "") -> Any:
    return parse_url(f"az://{azurite.account}/{container}" + (f"/{blob}" if blob else ""))


def test_backend_has_the_capabilities_azure_can_honour(session, azurite, azure_container) -> None:
    backend = session.backend(_url(azurite, azure_container, "x"))
    assert isinstance(backend, Store) and isinstance(backend, RangedReads)
    assert isinstance(backend, MultipartUploads) and isinstance(backend, ServerSideCopy)


def test_put_stat_get_round_trip_with_a_unicode_name(session, azurite, azure_container, azure_sdk, tmp_path) -> None:
    data = os.urandom(300_000)
    (tmp_path / "f").write_bytes(data)
    url = _url(azurite, azure_container, "dir/sub dir/é 日本 #1.dat")
    backend = session.backend(url)
    stored = backend.put(str(tmp_path / "f"), url)
    assert stored.size == len(data)
    blob = azure_sdk.get_blob_client("dir/sub dir/é 日本 #1.dat")
    assert blob.download_blob().readall() == data
    assert bytes(blob.get_blob_properties().content_settings.content_md5) == hashlib.md5(data).digest()
    info = backend.stat(url)
    assert (info.size, info.version) == (len(data), stored.version)
    sink = io.BytesIO()
    assert backend.get(url, sink).size == len(data) and sink.getvalue() == data


def test_ranged_reads_and_a_range_pinned_to_an_old_etag(session, azurite, azure_container, azure_sdk) -> None:
    data = os.urandom(100_000)
    azure_sdk.upload_blob("r.dat", data)
    url = _url(azurite, azure_container, "r.dat")
    backend = session.backend(url)
    sink = io.BytesIO()
    assert backend.get(url, sink, (10, 5000)).size == 100000 and sink.getvalue() == data[10:5000]
    version = backend.stat(url).version
    parts: list = []
    assert backend.get_range(url, (99_000, 100_000), version, len(data), parts.append) == 1000
    assert b"".join(parts) == data[99_000:]
    azure_sdk.upload_blob("r.dat", os.urandom(100_000), overwrite=True)
    with pytest.raises(RemoteError, match="changed"):
        backend.get_range(url, (0, 10), version, len(data), parts.append)


def test_a_download_whose_bytes_differ_from_the_stored_md5_is_refused(session, azurite, azure_container,
                                                                      azure_sdk) -> None:
    from azure.storage.blob import ContentSettings
    azure_sdk.upload_blob("m.dat", b"right bytes")  # then its stored MD5 is set to another's (Set Blob Properties)
    azure_sdk.get_blob_client("m.dat").set_http_headers(
        ContentSettings(content_md5=bytearray(hashlib.md5(b"other").digest())))
    url = _url(azurite, azure_container, "m.dat")
    with pytest.raises(ChecksumMismatch, match="MD5"):
        session.backend(url).get(url, io.BytesIO())


def test_listing_recursive_one_level_and_in_marker_pages(azurite, azure_env, azure_container, azure_sdk) -> None:
    names = ["a/1", "a/2", "a/b/3", "a/b/c/4", "a/z", "other/5"]
    for name in names:
        azure_sdk.upload_blob(name, name.encode())
    stats = PoolStats()
    pool = ConnectionPool(f"http://{azurite.host}:{azurite.port}", max_idle=2, stats=stats)
    backend = AzureBackend(pool, resolve(azurite.account, azure_env), Settings(), path_prefix=f"/{azurite.account}",
                           page_size=2)
    try:
        url = _url(azurite, azure_container, "a")
        listed = [(info.url.path, info.size) for info in backend.list(url)]
        assert listed == [(f"/{azure_container}/{n}", len(n)) for n in names[:5]]
        assert stats.requests_sent == 3  # five blobs, two a page
        objects, prefixes = backend.list_dir(url)
        assert [o.url.path for o in objects] == [f"/{azure_container}/a/1", f"/{azure_container}/a/2",
                                                 f"/{azure_container}/a/z"]
        assert [p.path for p in prefixes] == [f"/{azure_container}/a/b/"]
    finally:
        backend.close()


def test_delete_copy_and_not_found(session, azurite, azure_container, azure_sdk) -> None:
    azure_sdk.upload_blob("src", b"copied bytes")
    src, dst = _url(azurite, azure_container, "src"), _url(azurite, azure_container, "deep/dst")
    backend = session.backend(src)
    assert backend.copy(src, dst).size == 12
    assert azure_sdk.get_blob_client("deep/dst").download_blob().readall() == b"copied bytes"
    assert backend.delete([src, _url(azurite, azure_container, "never-there")]) == [None, None]
    with pytest.raises(NotFound, match="BlobNotFound"):
        backend.stat(src)
    with pytest.raises(NotFound, match="ContainerNotFound"):
        backend.get(_url(azurite, "no-such-container", "x"), io.BytesIO())


def test_touch_renews_last_modified_and_keeps_bytes_metadata_and_headers(session, azurite, azure_container,
                                                                          azure_sdk) -> None:
    """Found by Snakemake's TestStorageBase (touch = True) on Azure: the backend had no Touches."""
    azure_sdk.upload_blob("t", b"kept bytes", metadata={"owner": "me"},
                          content_settings=ContentSettings(content_type="text/x-kept"))
    before = azure_sdk.get_blob_client("t").get_blob_properties()
    while datetime.now(timezone.utc) < before.last_modified + timedelta(seconds=1):  # the header counts seconds
        time.sleep(0.05)
    backend = session.backend(_url(azurite, azure_container, "t"))
    assert isinstance(backend, Touches)
    touched = backend.touch(_url(azurite, azure_container, "t"))
    after = azure_sdk.get_blob_client("t").get_blob_properties()
    assert after.last_modified > before.last_modified and touched.size == 10
    assert after.metadata == {"owner": "me"} and after.content_settings.content_type == "text/x-kept"
    assert azure_sdk.get_blob_client("t").download_blob().readall() == b"kept bytes"
    with pytest.raises(NotFound):
        backend.touch(_url(azurite, azure_container, "never-there"))


def test_make_dirs_creates_the_container_once(session, azurite) -> None:
    url = _url(azurite, "made-here", "a/b")
    backend = session.backend(url)
    assert not backend.bucket_exists(url)
    backend.make_dirs(url)
    backend.make_dirs(url)
    assert backend.bucket_exists(url)


def test_large_file_goes_up_in_parallel_blocks_with_one_block_list(azurite, azure_env, azure_container,
                                                                  azure_sdk, tmp_path) -> None:
    data = os.urandom(23 << 20)
    (tmp_path / "big").write_bytes(data)
    settings = Settings(threads=4, multipart_threshold=8 << 20, multipart_part_size=5 << 20)
    with Client(settings=settings, env=azure_env) as client:
        client.copy([(str(tmp_path / "big"), f"az://{azurite.account}/{azure_container}/big")])
        assert client.read_bytes(f"az://{azurite.account}/{azure_container}/big", 7, 1 << 20) == data[7:1 << 20]
    blocks, uncommitted = azure_sdk.get_blob_client("big").get_block_list("all")
    assert [b.size for b in blocks] == [5 << 20] * 4 + [3 << 20] and not uncommitted
    assert azure_sdk.get_blob_client("big").download_blob().readall() == data


def test_a_wrong_key_is_one_auth_error_naming_the_account_and_never_the_key(azurite, azure_container,
                                                                           tmp_path) -> None:
    wrong = base64.b64encode(b"w" * 64).decode()
    env = {"HOME": str(tmp_path), "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string.replace(
        azurite.key, wrong)}
    with Session(Settings(), env) as session:
        url = _url(azurite, azure_container, "x")
        with pytest.raises(AuthError) as refused:
            session.backend(url).stat(url)
    text = str(refused.value)
    assert azurite.account in text and "AZURE_STORAGE_CONNECTION_STRING" in text and "\n" not in text
    assert wrong not in text and azurite.key not in text


def _counting_backend(azurite: Azurite, env: dict) -> Any:
    stats = PoolStats()
    pool = ConnectionPool(f"http://{azurite.host}:{azurite.port}", max_idle=2, stats=stats)
    return AzureBackend(pool, resolve(azurite.account, env), Settings(), path_prefix=f"/{azurite.account}"), stats


def test_deletes_go_in_blob_batches_of_256_per_container_each_blob_answered(azurite, azure_env, azure_container,
                                                                            azure_sdk) -> None:
    """Blob Batch (Azurite serves it): 300 blobs of one container in 2 requests, a missing blob
    counts as removed, and so do the blobs of a missing container (as for one Delete Blob)."""
    names = [f"del/{n:03d}" for n in range(300)]
    for name in names:
        azure_sdk.upload_blob(name, b"x")
    keep = _url(azurite, azure_container, "kept")
    azure_sdk.upload_blob("kept", b"k")
    backend, stats = _counting_backend(azurite, azure_env)
    try:
        urls = [_url(azurite, azure_container, n) for n in names] + [_url(azurite, azure_container, "never-there")]
        outcomes = backend.delete(urls)
        assert outcomes == [None] * len(urls)
        assert stats.requests_sent == 2  # 256 + 45 sub-requests
        assert list(azure_sdk.list_blobs("del/")) == []
        azure_sdk.upload_blob("del/again", b"y")
        before = stats.requests_sent
        mixed = [_url(azurite, "no-such-container", "x"), _url(azurite, azure_container, "del/again"),
                 _url(azurite, "no-such-container", "y")]
        assert backend.delete(mixed) == [None, None, None]
        assert stats.requests_sent == before + 2  # one request per container: a batch, and a lone Delete Blob
        assert list(azure_sdk.list_blobs("del/")) == [] and backend.stat(keep).size == 1
    finally:
        backend.close()


def test_a_batch_of_deletes_through_a_sas_signs_no_sub_request(azurite, azure_container, azure_sdk, tmp_path) -> None:
    sas = generate_container_sas(azurite.account, azure_container, account_key=azurite.key,
                                 permission=ContainerSasPermissions(read=True, delete=True, list=True),
                                 expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    for n in range(5):
        azure_sdk.upload_blob(f"s/{n}", b"z")
    backend, stats = _counting_backend(azurite, {"AZURE_STORAGE_CONNECTION_STRING": f"BlobEndpoint={azurite.endpoint}"})
    try:
        urls = [parse_url(f"az://{azurite.account}/{azure_container}/s/{n}?{sas}") for n in range(5)]
        assert backend.delete(urls) == [None] * 5 and stats.requests_sent == 1
        assert list(azure_sdk.list_blobs("s/")) == []
    finally:
        backend.close()


def _sas(azurite: Azurite, container: str) -> str:
    return generate_container_sas(azurite.account, container, account_key=azurite.key,
                                  permission=ContainerSasPermissions(read=True, write=True, list=True, create=True),
                                  expiry=datetime.now(timezone.utc) + timedelta(hours=1))


def test_a_sas_on_the_url_reads_writes_and_lists_and_is_never_shown(azurite, azure_container, azure_sdk,
                                                                    tmp_path) -> None:
    sas = _sas(azurite, azure_container)
    signature = [part for part in sas.split("&") if part.startswith("sig=")][0]
    # the endpoint only: no key anywhere
    env = {"HOME": str(tmp_path), "AZURE_STORAGE_CONNECTION_STRING": f"BlobEndpoint={azurite.endpoint}"}
    (tmp_path / "f").write_bytes(b"via sas")
    with Session(Settings(), env) as session:
        url = parse_url(f"az://{azurite.account}/{azure_container}/s/f.txt?{sas}")
        backend = session.backend(url)
        backend.put(str(tmp_path / "f"), url)
        listed = list(backend.list(parse_url(f"az://{azurite.account}/{azure_container}/s?{sas}")))
        assert [info.url.path.partition("?")[0] for info in listed] == [f"/{azure_container}/s/f.txt"]
        sink = io.BytesIO()
        backend.get(listed[0].url, sink)  # a listed URL keeps the SAS
        assert sink.getvalue() == b"via sas"
        missing = parse_url(f"az://{azurite.account}/{azure_container}/s/none?{sas}")
        with pytest.raises(NotFound) as refused:
            backend.stat(missing)
    for shown in (str(refused.value), str(url), repr(url), str(listed[0].url), repr(listed[0])):
        assert signature not in shown and signature.partition("=")[2] not in shown
    assert azure_sdk.get_blob_client("s/f.txt").download_blob().readall() == b"via sas"


def test_server_busy_is_a_throttle_answer_and_operation_timed_out_transient(azurite, azure_container,
                                                                           azure_sdk, tmp_path) -> None:
    azure_sdk.upload_blob("busy", b"x")
    with TcpProxy((azurite.host, azurite.port)) as proxy:
        env = {"HOME": str(tmp_path), "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string.replace(
            azurite.endpoint, f"{proxy.url()}/{azurite.account}")}
        with Session(Settings(), env) as session:
            url = _url(azurite, azure_container, "busy")
            backend = session.backend(url)
            proxy.set_faults([Fault.status(503, SERVER_BUSY, {"x-ms-error-code": "ServerBusy", "Retry-After": "2"})])
            with pytest.raises(Throttled) as busy:
                backend.stat(url)
            assert busy.value.retry_after == 2.0 and "ServerBusy" in str(busy.value)
            proxy.set_faults([Fault.status(500, b"", {"x-ms-error-code": "OperationTimedOut"})])
            with pytest.raises(TransientError) as timed_out:
                backend.stat(url)
            assert not isinstance(timed_out.value, Throttled) and "OperationTimedOut" in str(timed_out.value)
            assert backend.stat(url).size == 1  # the faults are spent: the same backend goes on


def test_the_engine_retries_a_throttled_read_to_success(azurite, azure_container, azure_sdk, tmp_path) -> None:
    azure_sdk.upload_blob("retried", b"after busy")
    with TcpProxy((azurite.host, azurite.port)) as proxy:
        env = {"HOME": str(tmp_path), "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string.replace(
            azurite.endpoint, f"{proxy.url()}/{azurite.account}")}
        proxy.set_faults([Fault.status(503, SERVER_BUSY, {"x-ms-error-code": "ServerBusy"}, times=2)])
        with Client(settings=Settings(retry_base_delay=0.01), env=env) as client:
            assert client.read_bytes(f"az://{azurite.account}/{azure_container}/retried") == b"after busy"
        assert proxy.pending_faults() == 0


# -- credentials, from the Azure CLI's names (no server) ----------------------------------


def test_credentials_are_used_only_for_the_account_they_name() -> None:
    key = base64.b64encode(b"k" * 32).decode()
    env = {"AZURE_STORAGE_ACCOUNT": "mine", "AZURE_STORAGE_KEY": key}
    assert resolve("mine", env).key == key
    other = resolve("theirs", env)
    assert other.key is None and other.sas is None and other.endpoint == "https://theirs.blob.core.windows.net"
    sas_env = {"AZURE_STORAGE_ACCOUNT": "mine", "AZURE_STORAGE_SAS_TOKEN": "?sv=1&sig=abc"}
    assert resolve("mine", sas_env).sas == "sv=1&sig=abc" and resolve("theirs", sas_env).sas is None
    string = f"DefaultEndpointsProtocol=https;AccountName=mine;AccountKey={key};EndpointSuffix=core.chinacloudapi.cn"
    found = resolve("mine", {"AZURE_STORAGE_CONNECTION_STRING": string})
    assert (found.endpoint, found.key) == ("https://mine.blob.core.chinacloudapi.cn", key)
    assert resolve("theirs", {"AZURE_STORAGE_CONNECTION_STRING": string}).key is None
    dev = resolve("devstoreaccount1", {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"})
    assert dev.endpoint == "http://127.0.0.1:10000/devstoreaccount1" and dev.key
    assert key not in repr(found) and key not in repr(resolve("mine", env))


def test_bad_configuration_is_one_line_naming_the_variable_not_its_value(tmp_path) -> None:
    with pytest.raises(ConfigError) as refused:
        resolve("mine", {"AZURE_STORAGE_CONNECTION_STRING": "AccountName=mine;secretvalue"})
    assert "AZURE_STORAGE_CONNECTION_STRING" in str(refused.value) and "secretvalue" not in str(refused.value)
    with pytest.raises(InvalidInput, match="storage account name"):
        with Session(Settings(), {"HOME": str(tmp_path)}) as session:
            session.backend(parse_url("az://Bad_Account/c01/x"))
    with Session(Settings(), {"HOME": str(tmp_path)}) as session:
        url = parse_url("az://fine123/c/x")
        with pytest.raises(InvalidInput, match="container name"):
            session.backend(url).stat(url)


def test_an_anonymous_backend_sends_no_authorization(azurite, azure_container, azure_sdk, tmp_path) -> None:
    azure_sdk.upload_blob("private", b"p")
    access = AzureAccess(azurite.account, azurite.endpoint)
    context = Context(Settings(), {"HOME": str(tmp_path)})
    backend = AzureBackend(ConnectionPool(f"http://{azurite.host}:{azurite.port}", max_idle=1, stats=context.stats),
                           access, Settings(), path_prefix=f"/{azurite.account}")
    try:
        with pytest.raises((AuthError, NotFound)):  # a private container refuses, or hides, the blob
            backend.stat(_url(azurite, azure_container, "private"))
    finally:
        backend.close()


def test_the_https_form_azure_tools_print_is_the_az_url(azurite, azure_env, azure_container, azure_sdk) -> None:
    azure_sdk.upload_blob("h/x.txt", b"by https")
    url = parse_url(f"https://{azurite.account}.blob.core.windows.net/{azure_container}/h/x.txt?sv=1&sig=SECRET")
    assert (url.scheme, url.host, str(url)) == ("az", azurite.account,
                                                 f"az://{azurite.account}/{azure_container}/h/x.txt?<query hidden>")
    for other in ("https://a.b.blob.core.windows.net/c/x", "http://acct.blob.core.windows.net/c/x",
                  "https://example.org/acct/c/x"):
        assert parse_url(other).scheme in ("http", "https")
    # the connection string names this account's endpoint (Azurite): no request leaves the machine
    with Client(env=azure_env) as client:
        assert client.read_bytes(f"https://{azurite.account}.blob.core.windows.net/{azure_container}/h/x.txt") \
            == b"by https"


def test_cut_bodies_resume_and_unanswered_reads_are_sent_again(azurite, azure_container, azure_sdk, tmp_path) -> None:
    data = os.urandom(600_000)
    azure_sdk.upload_blob("cut.dat", data)
    with TcpProxy((azurite.host, azurite.port)) as proxy:
        env = {"HOME": str(tmp_path), "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string.replace(
            azurite.endpoint, f"{proxy.url()}/{azurite.account}")}
        with Session(Settings(), env) as session:
            url = _url(azurite, azure_container, "cut.dat")
            backend = session.backend(url)
            for fault in (Fault.truncate(after_bytes=200_000, method="GET"),
                          Fault.reset(after_bytes=100_000, method="GET"),
                          Fault.reset(after_bytes=0, method="GET")):
                proxy.set_faults([fault])
                before = proxy.requests
                sink = io.BytesIO()
                assert backend.get(url, sink).size == len(data) and sink.getvalue() == data
                assert proxy.pending_faults() == 0 and proxy.requests == before + 2  # the cut one and its rest


def test_a_throttling_front_answering_server_busy_slows_the_drop_in_without_failures(azurite, azure_container,
                                                                                     azure_sdk, tmp_path) -> None:
    import json
    import subprocess
    import sys

    from pegasus_cloudio_testbed.throttle import ThrottleFront
    names = [f"t{n:03d}" for n in range(120)]
    for name in names:
        azure_sdk.upload_blob(f"thr/{name}", name.encode())
    with ThrottleFront(azurite.host, azurite.port, rate=40, burst=10, shape="azure", depth=2) as front:
        env = {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull, "PATH": os.environ["PATH"],
               "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string.replace(
                   azurite.endpoint, f"{front.endpoint}/{azurite.account}")}
        entries = [{"type": "transfer", "lfn": n, "id": i,
                    "src_urls": [{"site_label": "azure", "url": f"az://{azurite.account}/{azure_container}/thr/{n}"}],
                    "dest_urls": [{"site_label": "local", "url": f"file://{tmp_path}/out/{n}"}]}
                   for i, n in enumerate(names)]
        done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.dropin", "--threads", "8"],
                              input=json.dumps(entries), env=env, capture_output=True, text=True, timeout=600)
        stats = front.stats()
    assert done.returncode == 0, done.stderr[-2000:]
    assert all((tmp_path / "out" / n).read_bytes() == n.encode() for n in names)
    assert stats["throttled"] > 0  # the front did say ServerBusy, and every file arrived all the same


def test_cache_keys_name_the_blob_and_peer_scopes_follow_the_key(azurite, azure_env, azure_container,
                                                                 tmp_path) -> None:
    url = _url(azurite, azure_container, "k/x")
    with Session(Settings(), azure_env) as one, Session(Settings(), dict(azure_env, HOME=str(tmp_path))) as two:
        first, second = one.backend(url), two.backend(url)
        assert first.cache_key(url) == second.cache_key(url) == \
            f"http://{azurite.host}:{azurite.port}/{azurite.account}/{azure_container}/k/x"
        assert first.cache_key(url) != first.cache_key(_url(azurite, azure_container, "k/y"))
        scope = first.peer_scope(url)
        assert scope is not None and scope == second.peer_scope(url)
        assert first.peer_scope(_url(azurite, "other-container", "k/x")) != scope
        assert first.peer_scope(parse_url(f"az://{azurite.account}/{azure_container}/k/x?sv=1&sig=s")) is None
    other_key = azure_env["AZURE_STORAGE_CONNECTION_STRING"].replace(azurite.key, base64.b64encode(b"o" * 64).decode())
    with Session(Settings(), dict(azure_env, AZURE_STORAGE_CONNECTION_STRING=other_key)) as three:
        assert three.backend(url).peer_scope(url) != scope


def test_a_ranged_read_is_one_request_and_a_range_past_the_end_is_cut_there(azurite, azure_container, azure_sdk,
                                                                            tmp_path) -> None:
    data = os.urandom(5000)
    azure_sdk.upload_blob("one.dat", data)
    with TcpProxy((azurite.host, azurite.port)) as proxy:
        env = {"HOME": str(tmp_path), "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string.replace(
            azurite.endpoint, f"{proxy.url()}/{azurite.account}")}
        with Session(Settings(), env) as session:
            url = _url(azurite, azure_container, "one.dat")
            backend = session.backend(url)
            before, sink = proxy.requests, io.BytesIO()
            assert backend.get(url, sink, (4000, 9000)).size == 5000 and sink.getvalue() == data[4000:]
            assert proxy.requests == before + 1
