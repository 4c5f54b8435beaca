"""The async face (transfer.aio.AsyncClient) on a real MinIO: calls are awaitable and run on
worker threads, so the event loop keeps turning while a request is on the wire; many at once
share one Client; pages come as an async iterator; errors are the library's."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from pegasus_cloudio_testbed.proxy import TcpProxy
from transfer.aio import AsyncClient
from transfer.errors import NotFound


def _options(minio, endpoint=None) -> dict:
    return {"endpoint_url": endpoint or minio.endpoint, "key": minio.access_key, "secret": minio.secret_key,
            "env": {}}


def test_reads_writes_lists_info_removes_and_copies_are_awaitable(minio, tmp_path) -> None:
    async def main() -> None:
        async with AsyncClient(**_options(minio)) as client:
            where = f"s3://a-{uuid.uuid4().hex[:12]}"
            await client.mkdir(where)
            await asyncio.gather(*(client.write_bytes(f"{where}/d/f{i:02d}", bytes([i]) * i) for i in range(40)))
            read = await asyncio.gather(*(client.read_bytes(f"{where}/d/f{i:02d}") for i in range(40)))
            assert read == [bytes([i]) * i for i in range(40)]
            assert [e.name for e in await client.list(f"{where}/d")] == [f"f{i:02d}" for i in range(40)]
            assert (await client.info(f"{where}/d/f07")).size == 7 and await client.exists(f"{where}/d/f07")
            pages = [page async for page in client.iter_find(f"{where}/d")]
            assert sum(len(page) for page in pages) == 40
            await client.copy([(f"{where}/d/f05", str(tmp_path / "f05"))])
            assert (tmp_path / "f05").read_bytes() == bytes([5]) * 5
            await client.remove([f"{where}/d/f{i:02d}" for i in range(40)])
            assert await client.find(where) == []
            with pytest.raises(NotFound, match=f"{where}/absent"):
                await client.read_bytes(f"{where}/absent")
            with pytest.raises(NotFound):
                await client.list(f"s3://no-such-{uuid.uuid4().hex[:12]}")

    asyncio.run(main())


def test_the_event_loop_turns_while_a_request_is_on_the_wire(minio) -> None:
    """A call made on the loop itself would block it until the answer came: the ticker would
    not run once before the read finished."""
    with TcpProxy((minio.host, minio.port), delay_ms=150) as slow:
        async def main() -> int:
            async with AsyncClient(**_options(minio, slow.url())) as client:
                where = f"s3://t-{uuid.uuid4().hex[:12]}"
                await client.mkdir(where)
                await client.write_bytes(f"{where}/k", b"slow")
                read = asyncio.ensure_future(client.read_bytes(f"{where}/k"))
                await asyncio.sleep(0)  # the read starts (were it blocking, it would also end) here
                ticks = 0
                while not read.done():
                    ticks += 1
                    await asyncio.sleep(0.01)
                assert await read == b"slow"
                return ticks

        assert asyncio.run(main()) > 0
