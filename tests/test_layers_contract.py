"""The contract suite (:mod:`pegasus_cloudio_testbed.contract`) on the read stacks of
:mod:`transfer.layers` over S3 on MinIO: the bare store reader, the bundle layer over it, and
the node cache over each.
Each stack is built as the engine builds it (``Stacks``), with the layer below and plain values."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Tuple

import boto3
import pytest

from pegasus_cloudio_testbed import contract as c
from transfer import Session, Settings, parse_url
from transfer.layers import Reader
from transfer.layers.bundles import StagerSlot
from transfer.layers.stack import Stacks
from transfer.pacing import Pacer
from transfer.ranged import PartPool
from transfer.urls import Url
from p2p_support import new_cache


class MinioStack:
    """``stack(session, url, tmp_path)``: the reader under test, over the endpoint of ``url``."""

    __test__ = False

    @pytest.fixture
    def base_url(self, store_s3: Tuple[Dict[str, str], str]) -> str:
        return store_s3[1]

    @pytest.fixture
    def url_for(self, base_url: str) -> Callable[[str], Url]:
        return lambda key: parse_url(f"{base_url}/{key}", site_label="minio")

    @pytest.fixture
    def seed(self, minio: Any, base_url: str) -> Callable[[str, bytes], None]:
        client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                              aws_secret_access_key=minio.secret_key, region_name="us-east-1")
        bucket = base_url.split("/")[3]
        return lambda key, data: client.put_object(Bucket=bucket, Key=key, Body=data) and None

    @pytest.fixture
    def reader(self, store_s3: Tuple[Dict[str, str], str], url_for: Callable[[str], Url],
               tmp_path: Path) -> Iterator[Reader]:
        parts = PartPool(4)
        with Session(Settings(threads=4), store_s3[0]) as session:
            yield self.stacks(parts, tmp_path, session).reader(session.backend(url_for("x")))
        parts.shutdown()

    def stacks(self, parts: PartPool, tmp_path: Path, session: Session) -> Stacks:
        raise NotImplementedError


class TestStoreReader(MinioStack, c.ReadContract, c.LayerContract):
    __test__ = True

    def stacks(self, parts: PartPool, tmp_path: Path, session: Session) -> Stacks:
        return Stacks(session, parts, 64 * 1024, Pacer())


class TestCacheOverStore(MinioStack, c.ReadContract, c.LayerContract):
    __test__ = True

    def stacks(self, parts: PartPool, tmp_path: Path, session: Session) -> Stacks:
        return Stacks(session, parts, 64 * 1024, Pacer(), new_cache(tmp_path / "cache"))


class TestBundlesOverStore(MinioStack, c.ReadContract, c.LayerContract):
    """The bundle layer over the store, as a stack without a node cache has it (every read of
    a name the store lacks loads its directory's index: the NotFound cases list it)."""

    __test__ = True

    def stacks(self, parts: PartPool, tmp_path: Path, session: Session) -> Stacks:
        return Stacks(session, parts, 64 * 1024, Pacer(), bundles=StagerSlot(session))


class TestCacheOverBundles(MinioStack, c.ReadContract, c.LayerContract):
    """The engine's whole stack without peers: node cache -> bundles -> store."""

    __test__ = True

    def stacks(self, parts: PartPool, tmp_path: Path, session: Session) -> Stacks:
        return Stacks(session, parts, 64 * 1024, Pacer(), new_cache(tmp_path / "cache"), bundles=StagerSlot(session))
