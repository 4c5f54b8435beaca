"""One contract, every backend: the same tests run against local files, S3 on MinIO and on
moto (a second, independent S3 implementation), GCS on fake-gcs-server, Azure on Azurite and SFTP."""

import io
import os
from dataclasses import dataclass

import pytest

from transfer import Session, Settings, parse_url
from transfer.backends.base import Backend
from transfer.errors import NotFound


@dataclass
class Store:
    session: Session
    base: str

    def url(self, key):
        return parse_url(f"{self.base}/{key}", site_label="minio")

    @property
    def backend(self) -> Backend:
        return self.session.backend(self.url("x"))


@pytest.fixture(params=["local", "s3", "s3moto", "gcs", "azure", "sftp"])
def store(request):
    """Each kind's fixture ``store_<kind>`` yields (env, base URL); the tests below are shared."""
    env, base = request.getfixturevalue(f"store_{request.param}")
    session = Session(Settings(threads=4), env)
    yield Store(session, base)
    session.close()


def put_bytes(store, tmp_path, key, data):
    src = tmp_path / "upload.tmp"
    src.write_bytes(data)
    return store.backend.put(str(src), store.url(key))


def test_backend_satisfies_the_protocol(store):
    assert isinstance(store.backend, Backend)


def test_put_then_get_and_stat(store, tmp_path):
    data = os.urandom(4096)
    store.backend.make_dirs(store.url("dir"))
    info = put_bytes(store, tmp_path, "dir/obj.bin", data)
    assert info.size == len(data)
    sink = io.BytesIO()
    got = store.backend.get(store.url("dir/obj.bin"), sink)
    assert sink.getvalue() == data
    assert got.size == len(data)
    stat = store.backend.stat(store.url("dir/obj.bin"))
    assert stat.size == len(data) and stat.version


def test_ranged_get_returns_the_slice(store, tmp_path):
    data = bytes(range(256)) * 16
    put_bytes(store, tmp_path, "r.bin", data)
    sink = io.BytesIO()
    store.backend.get(store.url("r.bin"), sink, byte_range=(100, 1100))
    assert sink.getvalue() == data[100:1100]


def test_missing_object_is_not_found(store):
    with pytest.raises(NotFound) as info:
        store.backend.get(store.url("absent"), io.BytesIO())
    assert "absent" in str(info.value)
    with pytest.raises(NotFound):
        store.backend.stat(store.url("absent"))


def test_list_is_recursive_and_respects_the_prefix_boundary(store, tmp_path):
    for key in ("d/a", "d/sub/b", "d2/c"):
        put_bytes(store, tmp_path, key, key.encode())
    listed = sorted(info.url.path.rsplit("/d/", 1)[1] for info in store.backend.list(store.url("d")))
    assert listed == ["a", "sub/b"]


def test_delete_removes_objects_and_missing_ones_succeed(store, tmp_path):
    put_bytes(store, tmp_path, "x/1", b"1")
    put_bytes(store, tmp_path, "x/2", b"2")
    errors = store.backend.delete([store.url("x/1"), store.url("x/2"), store.url("x/never")])
    assert errors == [None, None, None]
    assert list(store.backend.list(store.url("x"))) == []


def test_make_dirs_is_idempotent(store, tmp_path):
    """A second make_dirs neither fails nor disturbs what the first one's directory holds."""
    store.backend.make_dirs(store.url("m"))
    put_bytes(store, tmp_path, "m/kept", b"kept")
    store.backend.make_dirs(store.url("m"))
    sink = io.BytesIO()
    store.backend.get(store.url("m/kept"), sink)
    assert sink.getvalue() == b"kept"
    assert [info.url.path.rsplit("/m/", 1)[1] for info in store.backend.list(store.url("m"))] == ["kept"]
