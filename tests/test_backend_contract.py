"""One contract, every backend: :mod:`pegasus_cloudio_testbed.contract` (the importable suite)
on local files, S3 on MinIO and on moto (a second, independent S3), GCS on fake-gcs-server,
Azure on Azurite, SFTP on OpenSSH's sshd, and HTTP and HTTPS on a real file server. Each class lists the
mix-ins of the capabilities its backend claims; the suite's own guard fails a class that
lists one too few or too many."""

from __future__ import annotations

import os
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import boto3
import pytest

from pegasus_cloudio_testbed import contract as c
from pegasus_cloudio_testbed.certs import make_tls_files
from pegasus_cloudio_testbed.fakegcs import FakeGcsServer
from pegasus_cloudio_testbed.fileserver import serve_files
from pegasus_cloudio_testbed.proxy import Fault, TcpProxy
from transfer import Session, Settings, parse_url
from transfer.backends.base import Backend
from transfer.urls import Url


def open_reader(env: Dict[str, str], url: Url, **settings: Any) -> Iterator[Backend]:
    session = Session(Settings(threads=4, **settings), env)
    try:
        yield session.backend(url)
    finally:
        session.close()


def write_file(root: str) -> Callable[[str, bytes], None]:
    """A seed that writes files under ``root`` (the directory a local, SFTP or HTTP URL names)."""
    def seed(key: str, data: bytes) -> None:
        path = os.path.join(root, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.seed"
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    return seed


# --------------------------------------------------------------------------- local files


class TestLocal(c.ReadContract, c.ClosesContract, c.UploadsContract, c.NamespaceContract,
                c.TreeRemovalContract, c.TouchesContract):
    @pytest.fixture
    def base_url(self, tmp_path: Path) -> str:
        (tmp_path / "store").mkdir()
        return f"file://{tmp_path}/store"

    @pytest.fixture
    def reader(self, tmp_path: Path, base_url: str) -> Iterator[Backend]:
        yield from open_reader({"HOME": str(tmp_path)}, parse_url(base_url))

    @pytest.fixture
    def seed(self, tmp_path: Path) -> Callable[[str, bytes], None]:
        return write_file(str(tmp_path / "store"))


# --------------------------------------------------------------------------- S3


def put_object(server: Any, base_url: str) -> Callable[[str, bytes], None]:
    """A seed through boto3 (PutObject) into the bucket of ``s3://USER@SITE/BUCKET``."""
    client = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=server.access_key,
                          aws_secret_access_key=server.secret_key, region_name="us-east-1")
    bucket = base_url.split("/")[3]

    def seed(key: str, data: bytes) -> None:
        client.put_object(Bucket=bucket, Key=key, Body=data)
    return seed


class S3Classes(c.ReadContract, c.ClosesContract, c.UploadsContract, c.NamespaceContract,
                c.DirectoryListingContract, c.PagedListingContract, c.TouchesContract, c.BucketsContract,
                c.BucketRemovalContract,
                c.BatchWritesContract, c.MultipartUploadsContract,
                c.PendingUploadsContract, c.ExclusiveCreateContract, c.ConditionalPutsContract,
                c.AttributedPutsContract, c.ServerSideCopyContract, c.RangedReadsContract,
                c.BatchReadsContract, c.DialsAheadContract, c.CacheKeysContract, c.PeerScopesContract,
                c.PresignsContract):
    """Every S3 server: ``store`` is the (env, base URL) fixture of conftest, ``server`` its server."""

    __test__ = False
    site = ""

    @pytest.fixture
    def url_for(self, base_url: str) -> Callable[[str], Url]:
        return lambda key: parse_url(f"{base_url}/{key}", site_label=self.site)

    @pytest.fixture
    def reader(self, store: Tuple[Dict[str, str], str], url_for: Callable[[str], Url]) -> Iterator[Backend]:
        yield from open_reader(store[0], url_for("x"))

    @pytest.fixture
    def base_url(self, store: Tuple[Dict[str, str], str]) -> str:
        return store[1]

    @pytest.fixture
    def seed(self, server: Any, base_url: str) -> Callable[[str, bytes], None]:
        return put_object(server, base_url)


class TestS3MinIO(S3Classes):
    __test__ = True
    site = "minio"

    @pytest.fixture
    def store(self, store_s3: Tuple[Dict[str, str], str]) -> Tuple[Dict[str, str], str]:
        return store_s3

    @pytest.fixture
    def server(self, minio: Any) -> Any:
        return minio


MOTO_PRESIGN = ("moto in server mode answers HTTP 500 to every pre-signed URL (boto3's own generate_presigned_url "
                "too), so the store, not our signature, fails these")


class TestS3Moto(S3Classes):
    __test__ = True
    site = "moto"
    test_a_presigned_get_reads_the_object = c.known_defect(
        c.PresignsContract.test_a_presigned_get_reads_the_object, MOTO_PRESIGN)
    test_a_presigned_put_stores_one = c.known_defect(c.PresignsContract.test_a_presigned_put_stores_one, MOTO_PRESIGN)
    test_a_tampered_signature_is_refused = c.known_defect(
        c.PresignsContract.test_a_tampered_signature_is_refused, MOTO_PRESIGN)

    @pytest.fixture
    def store(self, store_s3moto: Tuple[Dict[str, str], str]) -> Tuple[Dict[str, str], str]:
        return store_s3moto

    @pytest.fixture
    def server(self, moto: Any) -> Any:
        return moto


# --------------------------------------------------------------------------- GCS


def gcs_media_upload(server: FakeGcsServer, bucket: str) -> Callable[[str, bytes], None]:
    """A seed through the JSON API's media upload (the emulator's own front door)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def seed(key: str, data: bytes) -> None:
        name = urllib.parse.quote(key, safe="")
        target = f"{server.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"
        request = urllib.request.Request(target, data=data, method="POST",
                                         headers={"Content-Type": "application/octet-stream"})
        with opener.open(request, timeout=30) as answer:
            assert answer.status == 200
    return seed


class TestGcs(c.ReadContract, c.ClosesContract, c.UploadsContract, c.NamespaceContract, c.BucketsContract,
              c.BucketRemovalContract,
              c.CacheKeysContract, c.ServerSideCopyContract, c.PresignsContract):
    @pytest.fixture
    def base_url(self, store_gcs: Tuple[Dict[str, str], str]) -> str:
        return store_gcs[1]

    @pytest.fixture
    def reader(self, store_gcs: Tuple[Dict[str, str], str], gcs_key: Any, base_url: str) -> Iterator[Backend]:
        # with a service-account key (whose token endpoint runs here), so presign has one to sign with
        env = {**store_gcs[0], "GOOGLE_APPLICATION_CREDENTIALS": str(gcs_key.path)}
        yield from open_reader(env, parse_url(base_url))

    @pytest.fixture
    def seed(self, gcs_server: FakeGcsServer, gcs_bucket: str) -> Callable[[str, bytes], None]:
        return gcs_media_upload(gcs_server, gcs_bucket)


# --------------------------------------------------------------------------- Azure


def azure_put_blob(connection_string: str, container: str) -> Callable[[str, bytes], None]:
    """A seed through azure-storage-blob (the reference client) into ``container``."""
    from azure.storage.blob import BlobServiceClient

    client = BlobServiceClient.from_connection_string(connection_string).get_container_client(container)

    def seed(key: str, data: bytes) -> None:
        client.upload_blob(key, data, overwrite=True)
    return seed


class TestAzure(c.ReadContract, c.ClosesContract, c.UploadsContract, c.NamespaceContract,
                c.DirectoryListingContract, c.BucketsContract, c.MultipartUploadsContract,
                c.ServerSideCopyContract, c.RangedReadsContract, c.BatchReadsContract, c.CacheKeysContract,
                c.PeerScopesContract, c.TouchesContract):
    @pytest.fixture
    def base_url(self, store_azure: Tuple[Dict[str, str], str]) -> str:
        return store_azure[1]

    @pytest.fixture
    def reader(self, store_azure: Tuple[Dict[str, str], str], base_url: str) -> Iterator[Backend]:
        yield from open_reader(store_azure[0], parse_url(base_url))

    @pytest.fixture
    def seed(self, azurite: Any, azure_container: str) -> Callable[[str, bytes], None]:
        return azure_put_blob(azurite.connection_string, azure_container)

    @pytest.fixture(autouse=True)
    def _missing_container(self, azurite: Any) -> None:
        # az://ACCOUNT/CONTAINER/BLOB names the account first, as s3://USER@SITE/BUCKET does its site
        self.missing_bucket_url = f"az://{azurite.account}/no-such-container-{os.urandom(6).hex()}/k"


# --------------------------------------------------------------------------- SFTP


class TestSftp(c.ReadContract, c.ClosesContract, c.UploadsContract, c.NamespaceContract, c.TreeRemovalContract,
               c.TempUploadsContract):
    @pytest.fixture
    def base_url(self, ssh_base: str) -> str:
        return ssh_base

    @pytest.fixture
    def reader(self, ssh_env: Dict[str, str], base_url: str) -> Iterator[Backend]:
        yield from open_reader(ssh_env, parse_url(base_url))

    @pytest.fixture
    def seed(self, ssh_remote_dir: str) -> Callable[[str, bytes], None]:
        return write_file(ssh_remote_dir)  # sshd serves this machine's files


# --------------------------------------------------------------------------- HTTP(S)


class HttpClasses(c.ReadContract, c.ClosesContract, c.CacheKeysContract):
    """A read-only source: plain ``http://`` and verified ``https://`` (the test CA)."""

    __test__ = False
    tls = False

    @pytest.fixture
    def served(self, tmp_path: Path) -> Iterator[Tuple[str, Dict[str, Any]]]:
        root = tmp_path / "www"
        root.mkdir()
        tls = make_tls_files(tmp_path / "tls") if self.tls else None
        server = serve_files(root, tls)
        try:
            scheme = "https" if tls else "http"
            yield (f"{scheme}://127.0.0.1:{server.server_address[1]}",
                   {"ca_bundle": str(tls.ca_cert)} if tls else {})
        finally:
            server.shutdown()
            server.server_close()

    @pytest.fixture
    def base_url(self, served: Tuple[str, Dict[str, Any]]) -> str:
        return served[0]

    @pytest.fixture
    def url_for(self, base_url: str) -> Callable[[str], Url]:
        return lambda key: parse_url(f"{base_url}/{urllib.parse.quote(key)}")

    @pytest.fixture
    def reader(self, tmp_path: Path, served: Tuple[str, Dict[str, Any]]) -> Iterator[Backend]:
        env = {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull}
        yield from open_reader(env, parse_url(served[0] + "/"), **served[1])

    @pytest.fixture
    def seed(self, tmp_path: Path) -> Callable[[str, bytes], None]:
        return write_file(str(tmp_path / "www"))


class TestHttp(HttpClasses):
    __test__ = True


class TestHttps(HttpClasses):
    __test__ = True
    tls = True


# --------------------------------------------------------------------------- bodies cut by a relay


def cutter(proxy: TcpProxy) -> Callable[[Optional[int]], None]:
    def cut_bodies(after: Optional[int]) -> None:
        if after is None:
            proxy.clear_faults()
        else:
            proxy.set_faults([Fault.truncate(after, times=1000, method="GET")])
    return cut_bodies


class TestS3CutBodies(c.CutBodiesContract):
    """MinIO through the fault proxy (conftest's ``proxied``)."""

    @pytest.fixture
    def base_url(self, bucket: str) -> str:
        return f"s3://test@minio/{bucket}"

    @pytest.fixture
    def url_for(self, base_url: str) -> Callable[[str], Url]:
        return lambda key: parse_url(f"{base_url}/{key}", site_label="minio")

    @pytest.fixture
    def reader(self, proxied: Tuple[TcpProxy, Dict[str, str]], url_for: Callable[[str], Url]) -> Iterator[Backend]:
        yield from open_reader({**proxied[1], "AWS_EC2_METADATA_DISABLED": "true"}, url_for("x"))

    @pytest.fixture
    def seed(self, minio: Any, base_url: str) -> Callable[[str, bytes], None]:
        return put_object(minio, base_url)

    @pytest.fixture
    def cut_bodies(self, proxied: Tuple[TcpProxy, Dict[str, str]]) -> Callable[[Optional[int]], None]:
        return cutter(proxied[0])


class TestGcsCutBodies(c.CutBodiesContract):
    """fake-gcs-server through the fault proxy (``gcs_proxied``)."""

    @pytest.fixture
    def base_url(self, gcs_bucket: str) -> str:
        return f"gs://{gcs_bucket}"

    @pytest.fixture
    def reader(self, gcs_proxied: Tuple[TcpProxy, Dict[str, str]], base_url: str) -> Iterator[Backend]:
        yield from open_reader(gcs_proxied[1], parse_url(base_url))

    @pytest.fixture
    def seed(self, gcs_server: FakeGcsServer, gcs_bucket: str) -> Callable[[str, bytes], None]:
        return gcs_media_upload(gcs_server, gcs_bucket)

    @pytest.fixture
    def cut_bodies(self, gcs_proxied: Tuple[TcpProxy, Dict[str, str]]) -> Callable[[Optional[int]], None]:
        return cutter(gcs_proxied[0])


class TestAzureCutBodies(c.CutBodiesContract):
    """Azurite through the fault proxy (``azure_proxied``)."""

    @pytest.fixture
    def base_url(self, azurite: Any, azure_container: str) -> str:
        return f"az://{azurite.account}/{azure_container}"

    @pytest.fixture
    def reader(self, azure_proxied: Tuple[TcpProxy, Dict[str, str]], base_url: str) -> Iterator[Backend]:
        yield from open_reader(azure_proxied[1], parse_url(base_url))

    @pytest.fixture
    def seed(self, azurite: Any, azure_container: str) -> Callable[[str, bytes], None]:
        return azure_put_blob(azurite.connection_string, azure_container)

    @pytest.fixture
    def cut_bodies(self, azure_proxied: Tuple[TcpProxy, Dict[str, str]]) -> Callable[[Optional[int]], None]:
        return cutter(azure_proxied[0])


class TestHttpCutBodies(c.CutBodiesContract):
    """The file server through the fault proxy."""

    @pytest.fixture
    def relay(self, tmp_path: Path) -> Iterator[TcpProxy]:
        (tmp_path / "www").mkdir()
        server = serve_files(tmp_path / "www")
        try:
            with TcpProxy(("127.0.0.1", server.server_address[1])) as proxy:
                yield proxy
        finally:
            server.shutdown()
            server.server_close()

    @pytest.fixture
    def base_url(self, relay: TcpProxy) -> str:
        return relay.url()

    @pytest.fixture
    def reader(self, tmp_path: Path, base_url: str) -> Iterator[Backend]:
        yield from open_reader({"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull}, parse_url(base_url + "/"))

    @pytest.fixture
    def seed(self, tmp_path: Path) -> Callable[[str, bytes], None]:
        return write_file(str(tmp_path / "www"))

    @pytest.fixture
    def cut_bodies(self, relay: TcpProxy) -> Callable[[Optional[int]], None]:
        return cutter(relay)


# --------------------------------------------------------------------------- a reader that is no backend


class ReadView:
    """Only ``stat`` and ``get`` of the reader below it (no ``close``: the session closes the
    backend): the read contract needs no backend class, and a reader claiming no capability
    runs no mix-in. The layers of ``transfer.layers`` run it with ``LayerContract``."""

    def __init__(self, below: Backend) -> None:
        self._below = below

    def stat(self, url: Url) -> Any:
        return self._below.stat(url)

    def get(self, url: Url, sink: Any, byte_range: Any = None) -> Any:
        return self._below.get(url, sink, byte_range)


class TestReadViewOnS3(c.ReadContract):
    @pytest.fixture
    def url_for(self, base_url: str) -> Callable[[str], Url]:
        return lambda key: parse_url(f"{base_url}/{key}", site_label="minio")

    @pytest.fixture
    def base_url(self, store_s3: Tuple[Dict[str, str], str]) -> str:
        return store_s3[1]

    @pytest.fixture
    def reader(self, store_s3: Tuple[Dict[str, str], str], url_for: Callable[[str], Url]) -> Iterator[ReadView]:
        for backend in open_reader(store_s3[0], url_for("x")):
            yield ReadView(backend)

    @pytest.fixture
    def seed(self, minio: Any, base_url: str) -> Callable[[str, bytes], None]:
        return put_object(minio, base_url)


# --------------------------------------------------------------------------- the suite itself


def test_every_claimed_protocol_has_a_mixin() -> None:
    """Every capability protocol of transfer.backends.base has its mix-in in the suite's table."""
    import transfer.backends.base as base
    protocols = {name for name, value in vars(base).items()
                 if isinstance(value, type) and value.__dict__.get("_is_protocol")
                 and value.__module__ == base.__name__}
    covered = {m.capability.__name__ for m in c.MIXINS}  # type: ignore[attr-defined]
    not_capabilities = {"Backend", "Store", "RunningCheck", "ObjectStream"}  # ReadContract+Closes, a union, parts
    assert protocols - not_capabilities - covered == set()


def test_contract_for_picks_the_mixins_by_isinstance(tmp_path: Path) -> None:
    from transfer.backends.local import LocalBackend
    cls = c.contract_for(LocalBackend())
    assert set(cls.__mro__) >= {c.ReadContract, c.ClosesContract, c.UploadsContract, c.NamespaceContract,
                                c.TreeRemovalContract, c.TouchesContract}
    assert not issubclass(cls, c.MultipartUploadsContract)


def test_the_guard_fails_a_class_that_skips_a_claimed_capability() -> None:
    from transfer.backends.local import LocalBackend

    class Partial(c.ReadContract, c.ClosesContract):
        pass
    with pytest.raises(AssertionError, match="UploadsContract.*NamespaceContract"):
        Partial().test_claimed_capabilities_run_their_cases(LocalBackend())


def test_the_guard_fails_a_class_that_runs_an_unclaimed_capability() -> None:
    from transfer.backends.local import LocalBackend

    class TooMany(c.contract_for(LocalBackend()), c.ServerSideCopyContract):
        pass
    with pytest.raises(AssertionError, match="ServerSideCopyContract"):
        TooMany().test_claimed_capabilities_run_their_cases(LocalBackend())
    c.contract_for(LocalBackend())().test_claimed_capabilities_run_their_cases(LocalBackend())
