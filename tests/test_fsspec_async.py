"""``cloudio-async``, the ``async_impl`` face of the fsspec filesystem: fsspec's own abstract
suite, unmodified, through its synchronous methods (each a coroutine on fsspec's loop thread),
and its coroutines awaited on a loop of ours, against a real MinIO."""

from __future__ import annotations

import asyncio
import os
import uuid

import fsspec
import pytest
from fsspec.asyn import AsyncFileSystem
from fsspec.tests.abstract.copy import AbstractCopyTests
from fsspec.tests.abstract.get import AbstractGetTests
from fsspec.tests.abstract.put import AbstractPutTests
from test_fsspec import AbstractOpenTests, AbstractPipeTests, CloudioFixtures, _options

from pegasus_cloudio_testbed.proxy import TcpProxy
from transfer.fsspec_async import AsyncCloudioFileSystem


class AsyncFixtures(CloudioFixtures):
    """The synchronous suite's fixtures on every store, the filesystem made as ``cloudio-async``."""

    root_name = f"fsspec-async-{uuid.uuid4().hex[:12]}"
    protocol = "cloudio-async"


class TestAsyncCopy(AbstractCopyTests, AsyncFixtures):
    pass


class TestAsyncGet(AbstractGetTests, AsyncFixtures):
    pass


class TestAsyncPut(AbstractPutTests, AsyncFixtures):
    pass


if AbstractOpenTests is not None:
    class TestAsyncOpen(AbstractOpenTests, AsyncFixtures):
        pass

if AbstractPipeTests is not None:
    class TestAsyncPipe(AbstractPipeTests, AsyncFixtures):
        pass


def test_the_entry_point_names_an_async_implementation():
    made = fsspec.get_filesystem_class("cloudio-async")
    assert made is AsyncCloudioFileSystem and made.async_impl and issubclass(made, AsyncFileSystem)


def test_coroutines_read_write_list_and_remove_on_the_callers_loop(minio):
    bucket = f"fa-{uuid.uuid4().hex[:12]}"

    async def main():
        fs = AsyncCloudioFileSystem(asynchronous=True, skip_instance_cache=True, **_options(minio))
        await fs._mkdir(bucket)
        await asyncio.gather(*(fs._pipe_file(f"{bucket}/d/f{i}", b"%d" % i * 3) for i in range(20)))
        read = await asyncio.gather(*(fs._cat_file(f"cloudio-async://{bucket}/d/f{i}") for i in range(20)))
        assert read == [b"%d" % i * 3 for i in range(20)]
        assert await fs._cat_file(f"{bucket}/d/f7", start=1, end=2) == b"7"
        info = await fs._info(f"{bucket}/d/f12")
        assert info["size"] == 6 and info["type"] == "file"
        assert sorted(await fs._ls(f"{bucket}/d", detail=False)) == sorted(f"{bucket}/d/f{i}" for i in range(20))
        assert len(await fs._find(bucket)) == 20
        await fs._rm(f"{bucket}/d", recursive=True)
        assert not await fs._exists(f"{bucket}/d/f1")
        with pytest.raises(FileNotFoundError):
            await fs._info(f"no-such-bucket-{uuid.uuid4().hex[:8]}")
        fs.client.close()

    asyncio.run(main())


def test_a_bulk_get_is_one_engine_batch_with_one_request_per_file(minio, tmp_path):
    """``_get`` is the synchronous filesystem's bulk call on one thread, not a coroutine (and
    a listing or HEAD) per file."""
    with TcpProxy((minio.host, minio.port)) as proxy:
        bucket = f"fab-{uuid.uuid4().hex[:12]}"

        async def main():
            fs = AsyncCloudioFileSystem(asynchronous=True, skip_instance_cache=True,
                                        **_options(minio, proxy.url()))
            await fs._mkdir(bucket)
            await fs._pipe({f"{bucket}/d/f{i:02d}": os.urandom(100) for i in range(30)})
            proxy.reset_counters()
            await fs._get([f"{bucket}/d/f{i:02d}" for i in range(30)], [str(tmp_path / f"f{i:02d}") for i in range(30)])
            fs.client.close()

        asyncio.run(main())
        assert proxy.requests == 30
    assert len(os.listdir(tmp_path)) == 30
