"""The ``cloudio`` fsspec filesystem: fsspec's own abstract test suite, unmodified, against a
real MinIO and a real Azurite (their fixture classes subclassed as fsspec documents for
implementers, each class run on both stores), plus what the suite does not cover: the entry
point, one engine batch per bulk call, bundle members as files, and Dask reading many small
objects through it."""

from __future__ import annotations

import os
import time
import uuid

import fsspec
import pytest
from azure.core.exceptions import ResourceExistsError
from azure.storage.blob import BlobServiceClient
from fsspec.tests.abstract import AbstractFixtures
from fsspec.tests.abstract.copy import AbstractCopyTests
from fsspec.tests.abstract.get import AbstractGetTests
from fsspec.tests.abstract.put import AbstractPutTests

from pegasus_cloudio_testbed.proxy import TcpProxy
from transfer.client import Client
from transfer.errors import TransferError
from transfer.fsspec_fs import CloudioFileSystem

try:  # newer fsspec releases add these suites; run every one the pinned release ships
    from fsspec.tests.abstract.open import AbstractOpenTests
except ImportError:  # pragma: no cover - depends on the pinned fsspec
    AbstractOpenTests = None
try:
    from fsspec.tests.abstract.pipe import AbstractPipeTests
except ImportError:  # pragma: no cover
    AbstractPipeTests = None


def _options(minio, endpoint=None) -> dict:
    return {"endpoint": endpoint or minio.endpoint, "access_key": minio.access_key,
            "secret_key": minio.secret_key, "env": {}}


def _minio_root(minio, tmp_path_factory, name: str, protocol: str = "cloudio"):
    """(filesystem, path) on MinIO: through the registry (the entry point), paths ``BUCKET/...``."""
    made = fsspec.filesystem(protocol, **_options(minio))
    made.mkdir(name)
    return made, name


def _azurite_root(azurite, tmp_path_factory, name: str, protocol: str = "cloudio"):
    """(filesystem, path) on Azurite: ``scheme="az"``, paths ``ACCOUNT/CONTAINER/...``; the container
    is made with azure-storage-blob."""
    try:
        BlobServiceClient.from_connection_string(azurite.connection_string).create_container(name)
    except ResourceExistsError:
        pass
    env = {"HOME": str(tmp_path_factory.mktemp("home")), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
           "AWS_EC2_METADATA_DISABLED": "true", "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    return fsspec.filesystem(protocol, scheme="az", env=env, skip_instance_cache=True), f"{azurite.account}/{name}"


STORES = {"s3": ("minio", _minio_root), "az": ("azurite", _azurite_root)}


class CloudioFixtures(AbstractFixtures):
    """fsspec's fixtures on each store in ``STORES``: every class of the suite runs on all of them."""

    # one bucket (container) for all the classes of a store
    root_name = f"fsspec-{uuid.uuid4().hex[:12]}"
    protocol = "cloudio"  # the fsspec protocol the filesystem is made by (through the registry)

    @pytest.fixture(scope="class", params=sorted(STORES))
    @classmethod
    def store_root(cls, request, tmp_path_factory):
        server, make = STORES[request.param]
        return make(request.getfixturevalue(server), tmp_path_factory, cls.root_name, cls.protocol)

    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, store_root):
        return store_root[0]

    @pytest.fixture
    def fs_join(self):
        return lambda *parts: "/".join(parts)

    @pytest.fixture
    def fs_path(self, store_root):
        return store_root[1]

    @pytest.fixture
    def supports_empty_directories(self):
        return False


class TestCloudioCopy(AbstractCopyTests, CloudioFixtures):
    pass


class TestCloudioGet(AbstractGetTests, CloudioFixtures):
    pass


class TestCloudioPut(AbstractPutTests, CloudioFixtures):
    pass


if AbstractOpenTests is not None:
    class TestCloudioOpen(AbstractOpenTests, CloudioFixtures):
        pass

if AbstractPipeTests is not None:
    class TestCloudioPipe(AbstractPipeTests, CloudioFixtures):
        pass


def test_the_entry_point_names_our_class():
    assert fsspec.get_filesystem_class("cloudio") is CloudioFileSystem


@pytest.fixture
def counted(minio):
    with TcpProxy((minio.host, minio.port)) as proxy:
        fs = CloudioFileSystem(skip_instance_cache=True, **_options(minio, proxy.url()))
        bucket = f"fb-{uuid.uuid4().hex[:12]}"
        fs.mkdir(bucket)
        yield fs, proxy, bucket
        fs.client.close()


def test_bulk_put_and_get_run_as_one_batch_with_one_request_per_file(counted, tmp_path):
    fs, proxy, bucket = counted
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"f{i:02d}").write_bytes(os.urandom(200))
    proxy.reset_counters()
    fs.put(str(src), f"{bucket}/d", recursive=True)
    assert proxy.requests_by_method.get("PUT") == 40
    out = tmp_path / "out"
    proxy.reset_counters()
    fs.get([f"{bucket}/d/f{i:02d}" for i in range(40)], [str(out / f"f{i:02d}") for i in range(40)])
    assert proxy.requests == 40  # no HEAD or listing per file
    assert all((out / n).read_bytes() == (src / n).read_bytes() for n in os.listdir(src))


def test_bundle_members_are_files_to_ls_info_open_and_cat(minio, tmp_path):
    fs = CloudioFileSystem(skip_instance_cache=True, bundles=True, **_options(minio))
    bucket = f"fm-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"m{i:02d}").write_bytes(b"%d" % i * 10)
    fs.put([str(src / f"m{i:02d}") for i in range(12)], [f"{bucket}/d/m{i:02d}" for i in range(12)])
    assert fs.ls(f"{bucket}/d", detail=False) == [f"{bucket}/d/m{i:02d}" for i in range(12)]
    assert fs.info(f"{bucket}/d/m03") == {**fs.info(f"{bucket}/d/m03"), "size": 10, "type": "file"}
    with fs.open(f"{bucket}/d/m05", "rb") as fh:
        assert fh.read() == b"5" * 10
    assert fs.cat(f"{bucket}/d/m11") == b"11" * 10
    fs.client.close()


def test_dask_reads_many_small_objects(minio):
    import dask.bag as dask_bag
    from dask.distributed import Client as DaskClient, LocalCluster

    fs = fsspec.filesystem("cloudio", **_options(minio))
    bucket = f"dask-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    fs.pipe({f"{bucket}/lines/{i:03d}.txt": f"{i}\n".encode() for i in range(200)})
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster, \
            DaskClient(cluster):
        bag = dask_bag.read_text(f"cloudio://{bucket}/lines/*.txt", storage_options=_options(minio))
        total = bag.map(int).sum().compute()
    assert total == sum(range(200))


# --------------------------------------------------------------------------- what users of fsspec rely on


@pytest.fixture
def cfs(minio):
    fs = CloudioFileSystem(skip_instance_cache=True, **_options(minio))
    bucket = f"fx-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    yield fs, bucket
    fs.client.close()


def test_cat_file_of_a_range_past_the_end_is_empty(cfs):
    fs, bucket = cfs
    fs.pipe_file(f"{bucket}/ten", b"0123456789")
    fs.pipe_file(f"{bucket}/empty", b"")
    assert fs.cat_file(f"{bucket}/ten", 20, 30) == b""
    assert fs.cat_file(f"{bucket}/ten", 8, 30) == b"89"
    assert fs.cat_file(f"{bucket}/empty", 0, 10) == b""


def test_append_mode_adds_to_the_stored_bytes(cfs):
    """open(path, "ab") stored only the appended bytes: the object's earlier content was lost."""
    fs, bucket = cfs
    fs.pipe_file(f"{bucket}/log", b"first\n")
    with fs.open(f"{bucket}/log", "ab") as fh:
        assert fh.tell() == 6  # as a local file opened for appending
        fh.write(b"second\n")
    assert fs.cat_file(f"{bucket}/log") == b"first\nsecond\n"
    with fs.open(f"{bucket}/new", "ab") as fh:  # absent: created
        fh.write(b"only\n")
    assert fs.cat_file(f"{bucket}/new") == b"only\n"


def test_a_file_replaced_while_open_for_reading_fails_instead_of_mixing_versions(cfs, minio):
    """Each block of an open file was a plain ranged GET: an object replaced between two reads
    gave the old bytes up to there and the new ones after, silently."""
    fs, bucket = cfs
    fs.pipe_file(f"{bucket}/data", b"a" * 100)
    with Client(**_options(minio)) as other:
        with fs.open(f"{bucket}/data", "rb", block_size=10, cache_type="none") as fh:
            assert fh.read(10) == b"a" * 10
            other.write_bytes(f"s3://{bucket}/data", b"b" * 100)
            with pytest.raises(TransferError, match="changed while being read"):
                fh.read()
    with fs.open(f"{bucket}/data", "rb", block_size=10, cache_type="none") as fh:  # opened afresh: the new bytes
        assert fh.read() == b"b" * 100


def test_a_transaction_stores_its_files_when_it_ends_and_none_when_it_fails(cfs):
    """Files written in ``with fs.transaction:`` were stored at close, and discarding them on an
    exception raised FileNotFoundError: a failed transaction left its partial outputs."""
    fs, bucket = cfs
    with pytest.raises(RuntimeError, match="boom"):
        with fs.transaction:
            with fs.open(f"{bucket}/tx/a", "wb") as fh:
                fh.write(b"partial")
            raise RuntimeError("boom")
    assert not fs.client.exists(f"s3://{bucket}/tx/a")
    with fs.transaction:
        with fs.open(f"{bucket}/tx/b", "wb") as fh:
            fh.write(b"whole")
        assert not fs.client.exists(f"s3://{bucket}/tx/b")  # not before the transaction ends
    assert fs.cat_file(f"{bucket}/tx/b") == b"whole"


def test_names_ending_in_blanks_are_their_own_objects_and_files(cfs, tmp_path):
    """URLs were stripped of surrounding blanks (pegasus-transfer's rule for its input files):
    ``bucket/x `` read and overwrote ``bucket/x``, a local ``y `` was written as ``y``."""
    fs, bucket = cfs
    fs.pipe_file(f"{bucket}/x", b"plain")
    fs.pipe_file(f"{bucket}/x ", b"spaced")
    assert fs.cat_file(f"{bucket}/x") == b"plain"
    assert fs.cat_file(f"{bucket}/x ") == b"spaced"
    assert sorted(fs.ls(bucket, detail=False)) == [f"{bucket}/x", f"{bucket}/x "]
    fs.get_file(f"{bucket}/x ", str(tmp_path / "y "))
    assert os.listdir(tmp_path) == ["y "] and (tmp_path / "y ").read_bytes() == b"spaced"
    fs.put_file(str(tmp_path / "y "), f"{bucket}/z  ")
    assert fs.cat_file(f"{bucket}/z  ") == b"spaced" and not fs.exists(f"{bucket}/z")


def test_opening_a_directory_for_reading_is_an_error_not_an_empty_file(cfs):
    """open(prefix).read() returned b"" (a directory's info has size 0): a reader took a
    directory for an empty file, where a local one raises IsADirectoryError."""
    fs, bucket = cfs
    fs.pipe_file(f"{bucket}/d/a", b"1")
    for path in (f"{bucket}/d", f"{bucket}/d/", bucket):
        with pytest.raises(IsADirectoryError, match=path.rstrip("/")):
            fs.open(path, "rb")
    fs.ls(bucket)  # the answer from the listing cache is the same
    with pytest.raises(IsADirectoryError):
        fs.open(f"{bucket}/d", "rb")


def test_every_client_keyword_reaches_the_client(minio, tmp_path):
    """The filesystem's keywords are the Client's (docs/library.md), but a list of them kept
    by hand lacked ``cache_bytes``: the cap given was dropped silently and the node cache grew
    to the 10 GiB default."""
    fs = CloudioFileSystem(skip_instance_cache=True, cache_dir=str(tmp_path / "cache"), cache_bytes=1 << 20,
                           **_options(minio))
    assert fs.client._cache is not None and fs.client._cache.config.max_bytes == 1 << 20
    fs.client.close()


def test_a_range_from_the_end_counts_from_the_stored_object_not_a_listing(cfs, minio):
    """cat_file(path, -n) took the size from the listing cache: after another writer replaced
    the object with a longer one, it returned n bytes from its middle, not its last n."""
    fs, bucket = cfs
    fs.pipe_file(f"{bucket}/grow", b"0123456789")
    assert fs.ls(bucket, detail=False) == [f"{bucket}/grow"]  # the listing cache holds size 10
    with Client(**_options(minio)) as other:
        other.write_bytes(f"s3://{bucket}/grow", b"0123456789abcdef")
    assert fs.cat_file(f"{bucket}/grow", -3) == b"def"
    assert fs.cat_file(f"{bucket}/grow", 4, -3) == b"456789abc"


def test_relative_local_paths_with_a_colon_are_local_files(cfs, tmp_path, monkeypatch):
    """get_file/put_file handed relative local paths to the URL parser: 'file:g.txt' wrote
    g.txt (a file: URL), 'a:b.txt' failed as an unparsable URL."""
    fs, bucket = cfs
    fs.pipe_file(f"{bucket}/k", b"data")
    monkeypatch.chdir(tmp_path)
    fs.get_file(f"{bucket}/k", "file:g.txt")
    fs.get_file(f"{bucket}/k", "a:b.txt")
    assert sorted(os.listdir(tmp_path)) == ["a:b.txt", "file:g.txt"]
    fs.put_file("a:b.txt", f"{bucket}/up")
    assert fs.cat_file(f"{bucket}/up") == b"data"


def test_pipe_in_a_failed_transaction_stores_nothing(cfs):
    """pipe_file wrote at once even inside ``with fs.transaction:``: a failed transaction left
    the piped objects behind (files opened for writing already waited for its end)."""
    fs, bucket = cfs
    with pytest.raises(RuntimeError, match="boom"):
        with fs.transaction:
            fs.pipe({f"{bucket}/tx/p1": b"1", f"{bucket}/tx/p2": b"2"})
            raise RuntimeError("boom")
    assert fs.client.find(f"s3://{bucket}/") == []
    with fs.transaction:
        fs.pipe_file(f"{bucket}/tx/p3", b"3")
    assert fs.cat_file(f"{bucket}/tx/p3") == b"3"


def test_exclusive_create_fails_if_the_object_appears_before_it_is_stored(cfs, minio):
    """"xb" checked only at open: an object another writer stored before close was silently
    replaced. The store itself now refuses (a PUT with If-None-Match: *)."""
    fs, bucket = cfs
    with Client(**_options(minio)) as other:
        fh = fs.open(f"{bucket}/claim", "xb")
        fh.write(b"mine")
        other.write_bytes(f"s3://{bucket}/claim", b"theirs")
        with pytest.raises(FileExistsError):
            fh.close()
    assert fs.cat_file(f"{bucket}/claim") == b"theirs"
    with fs.open(f"{bucket}/fresh", "xb") as fh:
        fh.write(b"new")
    assert fs.cat_file(f"{bucket}/fresh") == b"new"
    with pytest.raises(FileExistsError):
        fs.open(f"{bucket}/fresh", "xb")
    with pytest.raises(FileExistsError):
        with fs.transaction:
            with fs.open(f"{bucket}/late", "xb") as fh:
                fh.write(b"mine")
            fs.client.write_bytes(f"s3://{bucket}/late", b"theirs")
    assert fs.cat_file(f"{bucket}/late") == b"theirs"



def test_an_exclusive_create_over_a_removed_name_is_read_back_past_the_node_cache(minio, tmp_path):
    """'xb' / mode='create' stores through the backend's put_new, outside the engine, whose
    uploads drop this node's cache entry of the name. After another process removed the object,
    a create of the same name was read back as the removed object's bytes, from the entry the
    first read left."""
    fs = CloudioFileSystem(skip_instance_cache=True, cache_dir=str(tmp_path / "cache"), **_options(minio))
    bucket = f"fx-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    path = f"{bucket}/f"
    try:
        for new in (b"piped", b"opened"):
            fs.pipe_file(path, b"old")
            fs.get_file(path, str(tmp_path / "first"))
            assert (tmp_path / "first").read_bytes() == b"old" and len(fs.client._cache.entries()) == 1
            with Client(**_options(minio)) as other:  # another process: this node's entry stays
                other.remove(f"s3://{path}")
            fs.invalidate_cache()
            if new == b"piped":
                fs.pipe_file(path, new, mode="create")
            else:
                with fs.open(path, "xb") as fh:
                    fh.write(new)
            fs.get_file(path, str(tmp_path / "second"))
            assert (tmp_path / "second").read_bytes() == new and fs.cat_file(path) == new
            fs.rm(path)
    finally:
        fs.client.close()


def test_a_bucket_that_does_not_exist_is_no_empty_directory(cfs):
    """Issue 33: ``exists("no-such-bucket")`` was True and ``ls`` gave [], so a misspelt bucket
    read as "no inputs"."""
    fs, bucket = cfs
    missing = f"no-such-{uuid.uuid4().hex[:12]}"
    for path in (missing, f"cloudio://{missing}", f"{missing}/key", f"{missing}/dir/"):
        assert not fs.exists(path) and not fs.isdir(path), path
        for call in (fs.info, fs.ls):
            with pytest.raises(FileNotFoundError, match=missing):
                call(path)
        assert fs.find(path) == []  # as fsspec's find answers for any missing path
    assert fs.exists(bucket) and fs.isdir(bucket) and fs.ls(bucket) == [] and fs.find(bucket) == []


def test_the_filesystem_takes_endpoint_url_key_and_secret_as_s3fs_does(minio, tmp_path):
    fs = fsspec.filesystem("cloudio", skip_instance_cache=True, endpoint_url=minio.endpoint, key=minio.access_key,
                           secret=minio.secret_key, env={})
    bucket = f"fn-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    fs.pipe_file(f"{bucket}/k", b"named")
    assert fs.cat_file(f"cloudio://{bucket}/k") == b"named"
    fs.client.close()


def test_a_large_write_streams_its_parts_as_they_fill_with_memory_and_disk_bounded(counted, tmp_path, monkeypatch):
    """Issue 33: open("wb") spooled the whole object to a local file and uploaded it only at
    close. Now each 5 MiB block is a part sent from memory when it fills: while 16 MiB have
    been written, three parts are stored; no local file is made at all (the temp directory does
    not exist, so one would fail the write); traced memory stays near one block."""
    import tempfile
    import tracemalloc

    fs, proxy, bucket = counted
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "absent"))  # where a spool or a part's file would be
    block = os.urandom(1 << 20)
    proxy.reset_counters()
    tracemalloc.start()
    try:
        with fs.open(f"{bucket}/big", "wb") as fh:
            for i in range(100):
                fh.write(block)
                if i == 15:  # three parts sent while the writer goes on (parts travel in the background)
                    _wait_for(lambda: proxy.requests_by_method.get("PUT") == 3, "three parts stored")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    monkeypatch.undo()
    assert peak < 16 * (5 << 20), peak  # the block being filled, its copy, and up to 12 parts in flight: not 100 MiB
    assert proxy.requests_by_method.get("POST") == 2  # multipart: started and completed
    assert proxy.requests_by_method.get("PUT") == 20  # 100 MiB in 5 MiB parts
    assert fs.cat_file(f"{bucket}/big") == block * 100
    with fs.open(f"{bucket}/small", "wb") as fh:  # one block: one plain PUT at close
        fh.write(b"small")
    assert fs.cat_file(f"{bucket}/small") == b"small"


def _wait_for(predicate, what, timeout=60.0):
    """Poll ``predicate`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_sequential_read_holds_a_few_blocks_and_a_seek_fetches_only_its_block(counted):
    """open("rb") reads ahead two blocks (5 MiB each) in the background with ranged GETs pinned
    to the version opened, and drops the blocks behind the reader: memory stays near three
    blocks however large the object (60 MiB here), every block fetched once. A read after a
    seek elsewhere fetches its block alone (no read-ahead until reads are sequential again)."""
    import tracemalloc

    fs, proxy, bucket = counted
    block = os.urandom(1 << 20)
    with fs.open(f"{bucket}/big", "wb") as fh:
        for _ in range(60):
            fh.write(block)
    proxy.reset_counters()
    tracemalloc.start()
    try:
        with fs.open(f"{bucket}/big", "rb") as fh:
            while True:
                piece = fh.read(1 << 20)
                if not piece:
                    break
                assert piece == block
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 * (5 << 20), peak  # not 60 MiB
    assert proxy.requests_by_method.get("GET") == 12, proxy.requests_by_method  # 60 MiB: 12 blocks, each once
    proxy.reset_counters()
    with fs.open(f"{bucket}/big", "rb") as fh:
        fh.seek(31 << 20)
        assert fh.read(1 << 20) == block
    assert proxy.requests_by_method.get("GET") == 1, proxy.requests_by_method


def test_rm_of_a_bucket_recursively_removes_the_bucket(minio):
    """Issue 33: fsspec's rm(bucket, recursive=True) removes what is in it and then the bucket
    (as s3fs does); rmdir of an empty bucket removes it; rm of a prefix leaves the bucket."""
    fs = fsspec.filesystem("cloudio", skip_instance_cache=True, endpoint_url=minio.endpoint, key=minio.access_key,
                           secret=minio.secret_key, env={})
    bucket = f"rm-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    fs.pipe({f"{bucket}/a": b"a", f"{bucket}/d/b": b"b"})
    fs.rm(f"{bucket}/d", recursive=True)
    assert fs.exists(bucket) and fs.ls(bucket, detail=False) == [f"{bucket}/a"]
    fs.rm(bucket, recursive=True)
    assert not fs.exists(bucket)
    fs.mkdir(bucket)
    fs.rmdir(bucket)
    assert not fs.exists(bucket)
    fs.client.close()


def test_a_read_whose_block_failed_fetches_it_again_when_read_again(counted):
    """A block's GET refused once (403: not retried) fails the read that needs it; the same
    read again fetches the block again and returns the bytes (the failure is not kept)."""
    from pegasus_cloudio_testbed.proxy import Fault

    fs, proxy, bucket = counted
    data = os.urandom(12 << 20)
    fs.pipe_file(f"{bucket}/flaky", data)
    with fs.open(f"{bucket}/flaky", "rb", cache_options={"ahead": 0}) as fh:  # no read-ahead: block 0's GET is the first
        proxy.set_faults([Fault.status(403, body=b"", method="GET", path=f"/{bucket}/flaky")])
        with pytest.raises(PermissionError):
            fh.read(1 << 20)
        assert proxy.pending_faults() == 0
        fh.seek(0)
        assert fh.read() == data
