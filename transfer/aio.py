"""The plain API for asyncio code: :class:`AsyncClient`, the :class:`~transfer.client.Client`
with every call awaitable.

::

    from transfer.aio import AsyncClient

    async with AsyncClient(endpoint_url="http://127.0.0.1:9000", key="minio", secret="minio123") as client:
        await client.write_bytes("s3://run1/a.txt", b"hello")
        data, listed = await asyncio.gather(client.read_bytes("s3://run1/a.txt"), client.list("s3://run1/"))

How it runs: our HTTP layer is blocking, so each call runs the Client's method on a worker
thread of this object's own pool (``workers`` threads, default the Client's ``threads``) and
is awaited as a future; the event loop never blocks on the network. At most ``workers`` calls
run at once (more wait their turn), and every call of one AsyncClient shares one Client: one
warm connection pool, one engine. Cancelling a ``copy`` cancels its batch (the engine stops
at each file's next step); cancelling another call abandons its result, and the request in
flight on its thread ends on its own (one request, or one listing page). ``iter_find`` and
``iter_list`` are async iterators whose pages are each fetched on a worker thread when asked.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

from transfer.client import Client, Entry
from transfer.ops import Result

TYPE_CHECKING = False
if TYPE_CHECKING:
    from transfer.client import UrlLike

__all__ = ["AsyncClient"]

T = TypeVar("T")


class AsyncClient:
    """A :class:`~transfer.client.Client` (made from the same keyword arguments) behind a
    thread pool; see the module doc. Close it with ``await aclose()`` or ``async with``."""

    def __init__(self, *, workers: Optional[int] = None, **client_args: Any) -> None:
        self.client = Client(**client_args)
        self._pool = ThreadPoolExecutor(workers or self.client.session.settings.threads,
                                        thread_name_prefix="pegasus-cloudio-aio")

    async def _run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(call, *args, **kwargs))

    # -- lifecycle ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Wait for the calls running, then close the Client (connections, threads)."""
        await asyncio.get_running_loop().run_in_executor(None, self._close)

    def _close(self) -> None:
        try:
            self._pool.shutdown(wait=True)
        finally:
            self.client.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- calls ----------------------------------------------------------------------------

    async def copy(self, pairs: Sequence[Tuple[UrlLike, UrlLike]], *, check: bool = True) -> List[Result]:
        """:meth:`Client.copy`; cancelling the awaiting task cancels the batch."""
        cancel = threading.Event()
        future = asyncio.get_running_loop().run_in_executor(
            self._pool, functools.partial(self.client.copy, list(pairs), check=check, cancel=cancel))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            cancel.set()
            raise

    async def read_bytes(self, url: UrlLike, start: Optional[int] = None, end: Optional[int] = None) -> bytes:
        return await self._run(self.client.read_bytes, url, start, end)

    async def write_bytes(self, url: UrlLike, data: bytes, **options: Any) -> None:
        """:meth:`Client.write_bytes`, with its keyword options (conditions, attributes)."""
        await self._run(self.client.write_bytes, url, data, **options)

    async def info(self, url: UrlLike) -> Entry:
        return await self._run(self.client.info, url)

    async def exists(self, url: UrlLike) -> bool:
        return await self._run(self.client.exists, url)

    async def list(self, url: UrlLike) -> List[Entry]:
        return await self._run(self.client.list, url)

    async def find(self, url: UrlLike) -> List[Entry]:
        return await self._run(self.client.find, url)

    async def remove(self, urls: Union[UrlLike, Sequence[UrlLike]], *, recursive: bool = False) -> None:
        await self._run(self.client.remove, urls, recursive=recursive)

    async def mkdir(self, url: UrlLike) -> None:
        await self._run(self.client.mkdir, url)

    async def touch(self, url: UrlLike) -> Entry:
        return await self._run(self.client.touch, url)

    async def presign(self, url: UrlLike, method: str = "GET", expires: int = 3600) -> str:
        """:meth:`Client.presign` (no request: run here, on the loop)."""
        return self.client.presign(url, method, expires)

    async def iter_find(self, url: UrlLike) -> AsyncIterator[List[Entry]]:
        """:meth:`Client.iter_find`'s pages, each fetched on a worker thread when asked."""
        async for page in self._pages(self.client.iter_find, url):
            yield page

    async def iter_list(self, url: UrlLike) -> AsyncIterator[List[Entry]]:
        """:meth:`Client.iter_list`'s pages, each fetched on a worker thread when asked."""
        async for page in self._pages(self.client.iter_list, url):
            yield page

    async def _pages(self, start: Callable[[UrlLike], Iterator[List[Entry]]], url: UrlLike) -> AsyncIterator[List[Entry]]:
        pages = await self._run(start, url)
        while True:
            page = await self._run(next, pages, None)
            if page is None:
                return
            yield page
