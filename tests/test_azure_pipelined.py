"""Azure's pipelined small reads (``BatchReads``, ``transfer/backends/_azure_pipelined.py``) on
Azurite, behind the counting and faulting proxy: many blobs over one connection, each answer
taken only when it is its request's (the echoed ``x-ms-client-request-id``), whole and the
blob's (its stored ``Content-MD5``); everything else handed back to the per-file path."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from pegasus_cloudio_testbed.azurite import Azurite
from pegasus_cloudio_testbed.faults import Fault
from pegasus_cloudio_testbed.proxy import TcpProxy
from transfer import Settings
from transfer.backends._azure_pipelined import TAG, verified
from transfer.backends.base import BatchReads, ObjectInfo
from transfer.session import Session
from transfer.urls import Url, parse_url

SERVER_BUSY = (b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
               b"<Message>The server is busy.</Message></Error>")


@pytest.fixture
def proxy(azurite: Azurite) -> Iterator[TcpProxy]:
    with TcpProxy((azurite.host, azurite.port)) as started:
        yield started


def _env(azurite: Azurite, proxy: TcpProxy, home: str, key: str = "") -> Dict[str, str]:
    through = azurite.connection_string.replace(azurite.endpoint, f"{proxy.url()}/{azurite.account}")
    if key:
        through = through.replace(azurite.key, key)
    return {"HOME": home, "PEGASUS_CLOUDIO_CONFIG": os.devnull, "AZURE_STORAGE_CONNECTION_STRING": through}


def _urls(azurite: Azurite, container: str, names: List[str]) -> List[Url]:
    return [parse_url(f"az://{azurite.account}/{container}/{n}") for n in names]


def _read(backend: Any, urls: List[Url], **kwargs: Any) -> Tuple[Dict[int, bytes], List[int], List[float]]:
    taken: Dict[int, bytes] = {}
    throttled: List[float] = []

    def take(index: int, body: bytes, info: ObjectInfo, sent: float) -> bool:
        taken[index] = bytes(body)
        return True
    rest = backend.read_small(urls, take, throttled=throttled.append, **kwargs)
    return taken, rest, throttled


def test_forty_blobs_come_over_one_connection_in_forty_requests(azurite, azure_container, azure_sdk, proxy,
                                                                 tmp_path) -> None:
    bodies = {f"p/{i:02d}": os.urandom(300) for i in range(40)}
    for name, body in bodies.items():
        azure_sdk.upload_blob(name, body)
    with Session(Settings(), _env(azurite, proxy, str(tmp_path))) as session:
        urls = _urls(azurite, azure_container, list(bodies))
        backend = session.backend(urls[0])
        assert isinstance(backend, BatchReads)
        before = (proxy.requests, proxy.connections)
        taken, rest, _ = _read(backend, urls, connections=1, eager=True)
    assert rest == [] and [taken[i] for i in range(40)] == list(bodies.values())
    assert (proxy.requests - before[0], proxy.connections - before[1]) == (40, 1)


def test_a_missing_blob_is_handed_back_and_the_rest_taken(azurite, azure_container, azure_sdk, proxy,
                                                          tmp_path) -> None:
    """Azurite answers errors with a chunked body, which the pipelined reader does not read: the
    404 is then left over without ``missing`` being told (the contract allows both)."""
    azure_sdk.upload_blob("m/plain", b"has an md5")
    with Session(Settings(), _env(azurite, proxy, str(tmp_path))) as session:
        urls = _urls(azurite, azure_container, ["m/plain", "m/absent", "m/plain"])
        missing: List[int] = []
        taken, rest, _ = _read(session.backend(urls[0]), urls, connections=1,
                               missing=lambda i: missing.append(i) is not None)
    assert taken == {0: b"has an md5", 2: b"has an md5"} and rest == [1] and missing in ([], [1])


def test_a_sas_url_is_pipelined_too(azurite, azure_container, azure_sdk, proxy, tmp_path) -> None:
    from datetime import datetime, timedelta, timezone

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas
    azure_sdk.upload_blob("s/a", b"through a sas")
    sas = generate_container_sas(azurite.account, azure_container, account_key=azurite.key,
                                 permission=ContainerSasPermissions(read=True),
                                 expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    env = _env(azurite, proxy, str(tmp_path), key=base64.b64encode(b"w" * 64).decode())  # a wrong key: unused
    with Session(Settings(), env) as session:
        urls = [parse_url(f"az://{azurite.account}/{azure_container}/s/a?{sas}")]
        taken, rest, _ = _read(session.backend(urls[0]), urls, connections=1)
    assert (taken, rest) == ({0: b"through a sas"}, [])


def test_a_refused_key_ends_the_pass_after_the_first_answer(azurite, azure_container, azure_sdk, proxy,
                                                            tmp_path) -> None:
    names = [f"k/{i}" for i in range(30)]
    for name in names:
        azure_sdk.upload_blob(name, name.encode())
    env = _env(azurite, proxy, str(tmp_path), key=base64.b64encode(b"w" * 64).decode())
    with Session(Settings(), env) as session:
        urls = _urls(azurite, azure_container, names)
        before = proxy.requests
        taken, rest, _ = _read(session.backend(urls[0]), urls, connections=2)
    assert taken == {} and rest == list(range(30))
    assert proxy.requests - before <= 2 * 8  # at most one connection's depth each, never all 30


def test_server_busy_ends_the_pass_and_is_told_to_the_rate_control(azurite, azure_container, azure_sdk, proxy,
                                                                   tmp_path) -> None:
    names = [f"b/{i}" for i in range(10)]
    for name in names:
        azure_sdk.upload_blob(name, name.encode())
    proxy.set_faults([Fault.status(503, SERVER_BUSY, {"x-ms-error-code": "ServerBusy"}, method="GET")])
    with Session(Settings(), _env(azurite, proxy, str(tmp_path))) as session:
        urls = _urls(azurite, azure_container, names)
        taken, rest, throttled = _read(session.backend(urls[0]), urls, connections=1)
    assert proxy.pending_faults() == 0 and len(throttled) == 1
    assert sorted(rest + list(taken)) == list(range(10)) and 0 in rest


def test_cut_and_reset_connections_leave_no_blob_half_taken(azurite, azure_container, azure_sdk, proxy,
                                                            tmp_path) -> None:
    bodies = {f"c/{i:02d}": os.urandom(2000) for i in range(24)}
    for name, body in bodies.items():
        azure_sdk.upload_blob(name, body)
    proxy.set_faults([Fault.truncate(after_bytes=9000, method="GET"), Fault.reset(after_bytes=5000, method="GET")])
    with Session(Settings(), _env(azurite, proxy, str(tmp_path))) as session:
        urls = _urls(azurite, azure_container, list(bodies))
        taken, rest, _ = _read(session.backend(urls[0]), urls, connections=2, eager=True)
    assert proxy.pending_faults() == 0
    assert all(taken[i] == body for i, body in enumerate(bodies.values()) if i in taken)
    assert sorted(rest + list(taken)) == list(range(24)) and len(taken) >= 20  # sent again on a new connection


def test_an_answer_is_taken_only_when_it_is_its_requests_whole_and_the_blobs() -> None:
    body = b"the blob's bytes"
    url = parse_url("az://acct/cont/x")
    headers = {"x-ms-client-request-id": f"{TAG}7", "content-length": str(len(body)), "etag": '"0x1"',
               "content-md5": base64.b64encode(hashlib.md5(body).digest()).decode()}
    assert verified(url, 200, headers, body, f"{TAG}7") is not None
    assert verified(url, 200, headers, body, f"{TAG}8") is None  # another request's answer
    assert verified(url, 206, headers, body, f"{TAG}7") is None
    assert verified(url, 200, headers, body[:-1], f"{TAG}7") is None  # not its Content-Length
    assert verified(url, 200, dict(headers, **{"content-md5": base64.b64encode(b"0" * 16).decode()}), body,
                    f"{TAG}7") is None  # not the blob's bytes
    assert verified(url, 200, {k: v for k, v in headers.items() if k != "content-md5"}, body, f"{TAG}7") is None


def test_the_drop_in_stages_in_sixty_blobs_in_sixty_requests_on_few_connections(azurite, azure_container,
                                                                               azure_sdk, proxy, tmp_path) -> None:
    names = [f"d{n:02d}" for n in range(60)]
    for name in names:
        azure_sdk.upload_blob(f"d/{name}", name.encode() * 10)
    entries = [{"type": "transfer", "lfn": n, "id": i,
                "src_urls": [{"site_label": "azure", "url": f"az://{azurite.account}/{azure_container}/d/{n}"}],
                "dest_urls": [{"site_label": "local", "url": f"file://{tmp_path}/out/{n}"}]}
               for i, n in enumerate(names)]
    before = (proxy.requests, proxy.connections)
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.dropin", "--threads", "4"],
                          input=json.dumps(entries), capture_output=True, text=True, timeout=300,
                          env=dict(_env(azurite, proxy, str(tmp_path)), PATH=os.environ["PATH"]))
    assert done.returncode == 0, done.stderr[-2000:]
    assert all((tmp_path / "out" / n).read_bytes() == n.encode() * 10 for n in names)
    assert proxy.requests - before[0] == 60 and proxy.connections - before[1] <= 4 + 2


def test_each_request_draws_its_token_before_it_goes_out(azurite, azure_container, azure_sdk, proxy,
                                                         tmp_path) -> None:
    """``draw`` (the rate control's token of a paced prefix) is called once per request sent."""
    names = [f"t/{i}" for i in range(12)]
    for name in names:
        azure_sdk.upload_blob(name, name.encode())
    drawn: List[int] = []
    with Session(Settings(), _env(azurite, proxy, str(tmp_path))) as session:
        urls = _urls(azurite, azure_container, names)
        before = proxy.requests
        taken, rest, _ = _read(session.backend(urls[0]), urls, connections=1, draw=lambda: drawn.append(1))
    assert rest == [] and len(taken) == 12 and len(drawn) == proxy.requests - before == 12
