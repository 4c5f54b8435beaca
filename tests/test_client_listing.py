"""The plain library API's listings (transfer.client): lazy pages, markers, missing and empty
buckets, and removing listed keys in one request, on MinIO and fake-gcs-server."""

from __future__ import annotations

import gc
import uuid

import pytest

from local_files import files
from pegasus_cloudio_testbed.proxy import TcpProxy
from transfer.backends._s3_xml import Node
from transfer.backends.base import ObjectInfo
from transfer.client import Client
from transfer.errors import InvalidInput, NotFound, RemoteError
from transfer.listing import Entry


def test_find_skips_the_directory_markers_of_s3_consoles(client, where, minio, tmp_path):
    """find() listed zero-byte 'dir/' keys (S3 consoles' folders) as files: a directory()
    retrieval through it (Snakemake's) wrote a file where the directory goes, and glob
    patterns matched a file named ''."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                      aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    bucket = where[len("s3://"):]
    for key in ("run/", "run/a", "run/sub/", "run/sub/b", "empty/"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"" if key.endswith("/") else b"data")
    assert [e.url for e in client.find(f"{where}/")] == [f"{where}/run/a", f"{where}/run/sub/b"]
    assert [e.url for e in client.find(f"{where}/run")] == [f"{where}/run/a", f"{where}/run/sub/b"]
    assert client.find(f"{where}/empty/") == []




@pytest.fixture(params=["s3", "gs"])
def store_client(request):
    """(Client, an existing empty bucket's URL) on MinIO, and on fake-gcs-server (gs:// URLs
    reach it through the environment the Client is given)."""
    if request.param == "s3":
        made = request.getfixturevalue("client")
        yield made, request.getfixturevalue("where")
        return
    with Client(env=request.getfixturevalue("gcs_env")) as made:
        yield made, f"gs://{request.getfixturevalue('gcs_bucket')}"


def test_a_bucket_that_does_not_exist_is_not_found_everywhere(store_client):
    """Issue 33's wrong answer: exists("s3://no-such-bucket") was True, info() a directory and
    list() [], so a misspelt bucket read as "no inputs"; only find() raised."""
    client, empty = store_client
    missing = f"{empty.split('://')[0]}://no-such-{uuid.uuid4().hex[:12]}"
    for url in (missing, missing + "/", f"{missing}/key", f"{missing}/dir/"):
        assert not client.exists(url), url
        for call in (client.info, client.list, client.find):
            with pytest.raises(NotFound) as caught:
                call(url)
            assert missing in str(caught.value), (call, str(caught.value))
    with pytest.raises(NotFound, match=missing):
        client.read_bytes(f"{missing}/key")
    # an empty bucket that exists is an empty directory, not an error
    assert client.exists(empty) and client.info(empty).is_dir
    assert client.list(empty) == [] and client.list(empty + "/") == [] and client.find(empty) == []


def test_an_empty_bucket_is_removed_and_a_full_one_refused(store_client):
    """Issue 33: remove_bucket deletes an empty bucket (MinIO and fake-gcs-server); one with an
    object in it is refused (409) and kept; a missing one is NotFound; a key is no bucket."""
    client, bucket = store_client
    client.write_bytes(f"{bucket}/k", b"inside")
    with pytest.raises(RemoteError) as caught:
        client.remove_bucket(bucket)
    assert caught.value.status in (409, 412) and bucket in str(caught.value)  # fake-gcs-server: 412, GCS 409
    assert client.read_bytes(f"{bucket}/k") == b"inside"
    with pytest.raises(InvalidInput, match="not a bucket"):
        client.remove_bucket(f"{bucket}/k")
    client.remove(f"{bucket}/k")
    client.remove_bucket(bucket)
    assert not client.exists(bucket)
    with pytest.raises(NotFound, match=bucket):
        client.remove_bucket(bucket)


@pytest.fixture
def counted_client(minio):
    with TcpProxy((minio.host, minio.port)) as proxy:
        with Client(endpoint=proxy.url(), access_key=minio.access_key, secret_key=minio.secret_key,
                    env={}) as made:
            where = f"s3://d-{uuid.uuid4().hex[:12]}"
            made.mkdir(where)
            yield made, proxy, where


def test_removing_1000_listed_keys_is_one_listing_and_one_delete_objects(counted_client, tmp_path):
    """Issue 33: a list of keys cost a HEAD per key (1,000 keys: 1,000 HEADs and 1 POST)."""
    client, proxy, where = counted_client
    sources = files(tmp_path / "src", 1000, size=10)
    client.copy([(str(p), f"{where}/d/") for p in sources])
    client.write_bytes(f"{where}/d/sub/kept", b"k")
    listed = [e.url for e in client.list(f"{where}/d") if not e.is_dir]
    assert len(listed) == 1000
    proxy.reset_counters()
    with pytest.raises(NotFound, match=f"{where}/d/absent"):  # looked up before anything is removed
        client.remove(listed + [f"{where}/d/absent"])
    with pytest.raises(InvalidInput, match=f"{where}/d/sub"):
        client.remove(listed + [f"{where}/d/sub"])
    assert "POST" not in proxy.requests_by_method and len(client.list(f"{where}/d")) == 1001
    proxy.reset_counters()
    client.remove(listed)
    assert proxy.requests <= 2 and proxy.requests_by_method.get("POST") == 1, proxy.requests_by_method
    assert "HEAD" not in proxy.requests_by_method
    assert [e.url for e in client.find(f"{where}/")] == [f"{where}/d/sub/kept"]



def test_iter_find_and_iter_list_give_pages_one_request_each_as_they_are_taken(counted_client, tmp_path):
    """Issue 33: list() and find() were built whole, with no iterator and no pages."""
    client, proxy, where = counted_client
    sources = files(tmp_path / "src", 1200, size=10)
    client.copy([(str(p), f"{where}/d/") for p in sources])
    client.write_bytes(f"{where}/d/sub/x", b"x")
    proxy.reset_counters()
    pages = client.iter_find(f"{where}/d")
    assert proxy.requests == 0  # nothing asked before the first page is taken
    first = next(pages)
    assert len(first) == 1000 and proxy.requests == 1
    rest = [entry for page in pages for entry in page]
    assert proxy.requests == 2 and len(first) + len(rest) == 1201
    assert sorted(e.url for e in first + rest) == [e.url for e in client.find(f"{where}/d")]
    proxy.reset_counters()
    levels = client.iter_list(f"{where}/d")
    top = next(levels)
    assert len(top) == 1000 and proxy.requests == 1 and top == sorted(top, key=lambda e: e.name)
    names = [e.name for e in top] + [e.name for page in levels for e in page]
    assert names == [e.name for e in client.list(f"{where}/d")] and names[-1] == "sub"
    with pytest.raises(NotFound):
        next(client.iter_find(f"s3://no-such-{uuid.uuid4().hex[:12]}/d"))
    assert [[e.name for e in page] for page in client.iter_list(f"{where}/d/sub/x")] == [["x"]]


def test_a_page_taken_and_dropped_is_not_held_while_the_next_is_asked_for(counted_client, tmp_path, monkeypatch):
    """Issue 33, memory flat: iter_find and iter_list held the page before (its entries, their
    ObjectInfos and the XML answer) while the next ListObjectsV2 was sent, two pages at a time."""
    client, _, where = counted_client
    client.copy([(str(p), f"{where}/d/") for p in files(tmp_path / "src", 1001, size=1)])
    router = client.session.backend(client.url(where))._router
    send, held = router.send, []

    def counting(*args, **kwargs):  # the listing objects alive as each request goes out
        gc.collect()
        held.append(sum(isinstance(o, (Entry, ObjectInfo, Node)) for o in gc.get_objects()))
        return send(*args, **kwargs)

    monkeypatch.setattr(router, "send", counting)
    for lazily in (client.iter_find, client.iter_list):
        held.clear()
        pages = lazily(f"{where}/d")
        first = next(pages)
        assert len(first) == 1000
        del first
        assert len(next(pages)) == 1 and len(held) == 2
        assert held[1] - held[0] < 100, (lazily.__name__, held)  # a page is 1,000 entries and ~7,000 nodes
