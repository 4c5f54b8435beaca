"""fsspec's asynchronous face of ``cloudio``: ``fsspec.filesystem("cloudio-async", ...)``, an
``AsyncFileSystem`` (``async_impl``) for engines that await fsspec calls (zarr 3, s3fs-style
code using ``_cat_file``, ``_pipe_file``, ``_info``, ``_ls``, ``_find``, ``_get``...).

How it runs: our HTTP layer is blocking, so each coroutine runs the same method of a
:class:`~transfer.fsspec_fs.CloudioFileSystem` (made from the same arguments) on a worker
thread and is awaited as a future; the event loop never blocks on the network. The wrapping is
fsspec's own (:class:`fsspec.implementations.asyn_wrapper.AsyncFileSystemWrapper`), not a
second bridge of ours: ``_get``/``_put``/``_copy``/``_rm`` are the synchronous filesystem's
bulk calls, so a bulk call is still ONE engine batch on one thread (the engine's own threads do
the files), where fsspec's generic async bulk calls would send a coroutine per file.
``_walk`` and ``_glob`` are fsspec's, over ``_ls``. The threads are the loop's default
executor (``asyncio.to_thread``); a cancelled coroutine abandons its result while the call on
its thread runs to its end. ``open`` returns the synchronous filesystem's file (read-ahead and
streamed multipart writes as there); ``open_async`` is not offered.

Needs fsspec's ``AsyncFileSystemWrapper`` as of 2025 (``asynchronous`` optional, generators
left to fsspec); tested with the pinned fsspec (``requirements/fsspec.txt``).

The synchronous ``cloudio`` stays synchronous: a sync caller never pays the hop through
fsspec's event-loop thread that an ``async_impl`` filesystem's sync methods take.
"""

from __future__ import annotations

from typing import Any

from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper

from transfer.fsspec_fs import CloudioFileSystem

__all__ = ["AsyncCloudioFileSystem"]


class AsyncCloudioFileSystem(AsyncFileSystemWrapper):  # type: ignore[misc]  # fsspec is untyped
    """:class:`~transfer.fsspec_fs.CloudioFileSystem` with awaitable methods (see the module
    doc); ``asynchronous=True`` when made inside a running loop, as fsspec's async filesystems."""

    protocol = ("cloudio-async",)
    cachable = True  # one instance per arguments, as the synchronous cloudio (fsspec's default)

    def __init__(self, *args: Any, asynchronous: Any = None, loop: Any = None, **kwargs: Any) -> None:
        super().__init__(CloudioFileSystem(*args, skip_instance_cache=True, **kwargs), asynchronous=asynchronous,
                         loop=loop)

    @property
    def client(self) -> Any:
        """The :class:`~transfer.client.Client` every call runs through."""
        return self.sync_fs.client

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        return self.sync_fs._open(path, mode, **kwargs)
