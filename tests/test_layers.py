"""The read layers built by hand over a real store (MinIO behind a counting proxy): what the
contract suite of the test bed runs on each stack. A stack is built bottom up, each layer
given the one below and plain values (see transfer/layers/stack.py, which the engine uses)."""

from __future__ import annotations

import io
import os

import boto3
import pytest

from transfer import Session, Settings, parse_url
from transfer.backends.base import cache_keys
from transfer.errors import NotFound
from transfer.layers import Announces, Reader
from transfer.layers.cache import CacheLayer
from transfer.layers.stack import Stacks
from transfer.layers.store import StoreReader
from transfer.pacing import Pacer
from transfer.ranged import PartPool
from p2p_support import new_cache


@pytest.fixture
def stored(proxied, minio, bucket):
    """(proxy, session, url of a 300 kB object, its bytes)."""
    proxy, env = proxied
    body = os.urandom(300_000)
    boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                 aws_secret_access_key=minio.secret_key, region_name="us-east-1").put_object(
        Bucket=bucket, Key="in/x.dat", Body=body)
    with Session(Settings(threads=2), {**env, "AWS_EC2_METADATA_DISABLED": "true"}) as session:
        yield proxy, session, parse_url(f"s3://test@minio/{bucket}/in/x.dat", site_label="minio"), body


def test_the_store_reader_gets_stats_and_fetches_in_ranged_parts(stored, tmp_path):
    proxy, session, url, body = stored
    parts = PartPool(2)
    reader = StoreReader(session.backend(url), parts, 100_000, Pacer())
    assert isinstance(reader, Reader) and not isinstance(reader, Announces)
    assert reader.stat(url).size == len(body)
    sink = io.BytesIO()
    info = reader.get(url, sink, (10, 20))
    assert sink.getvalue() == body[10:20] and info.origin is None
    proxy.reset_counters()
    assert reader.fetch_to(url, str(tmp_path / "x"), mode=0o600) == len(body)
    parts.shutdown()
    assert (tmp_path / "x").read_bytes() == body and (tmp_path / "x").stat().st_mode & 0o777 == 0o600
    assert proxy.snapshot()["requests_by_method"]["GET"] == 3  # 300 kB in parts of 100 kB
    with pytest.raises(NotFound):
        reader.fetch_to(parse_url(str(url).replace("x.dat", "absent"), site_label="minio"), str(tmp_path / "y"))
    assert not (tmp_path / "y").exists()


def test_the_cache_layer_fills_once_then_serves_without_a_request(stored, tmp_path):
    proxy, session, url, body = stored
    backend = session.backend(url)
    keys = cache_keys(backend)
    assert keys is not None
    cache = new_cache(tmp_path / "cache")
    layer = CacheLayer(StoreReader(backend, PartPool(2), 100_000, Pacer()), cache, keys)
    proxy.reset_counters()
    assert layer.fetch_to(url, str(tmp_path / "a")) == len(body)
    assert layer.fetch_to(url, str(tmp_path / "b"), link=True) == len(body)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes() == body
    assert os.path.islink(tmp_path / "b")
    assert proxy.snapshot()["requests_by_method"] == {"GET": 1}
    assert cache.stats().hits == 1


def test_stacks_are_built_once_per_endpoint_and_only_with_what_is_on(stored, tmp_path):
    _, session, url, _ = stored
    backend = session.backend(url)
    bare = Stacks(session, PartPool(1), 1 << 20, Pacer())
    assert isinstance(bare.reader(backend), StoreReader)
    cached = Stacks(session, PartPool(1), 1 << 20, Pacer(), new_cache(tmp_path / "cache"))
    assert isinstance(cached.reader(backend), CacheLayer)
    assert cached.reader(backend) is cached.reader(backend)
