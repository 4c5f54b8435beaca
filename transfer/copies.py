"""What one attempt of a transfer does with one of its sources, by the kinds of its two ends:
a read down the source's read stack (:mod:`transfer.layers`), an upload (:class:`~transfer.writes.Writes`),
a local copy, link or move (:mod:`transfer.local_copies`), a server-side copy within one
endpoint, or a two-hop copy through a local temp file between endpoints. The engine's retries,
pacing and results wrap each call; nothing here calls the engine.
"""

from __future__ import annotations

import os
import time

from transfer import _threads
from transfer.atomic import scratch_file
from transfer.backends.base import ServerSideCopy, TempUploads, uploads
from transfer.ops import LinkMode

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, List, Optional

    from transfer.layers.stack import Stacks
    from transfer.ops import Transfer
    from transfer.session import Session
    from transfer.urls import Url
    from transfer.writes import Writes

__all__ = ["Copies", "WritesSlot"]


class WritesSlot:
    """An engine's one :class:`~transfer.writes.Writes`, made (and its module imported) at the
    first upload: a stage-in makes none. ``args`` are what ``Writes`` takes."""

    def __init__(self, *args: Any) -> None:
        self._args = args
        self._lock = _threads.Lock()
        self.made: Optional[Writes] = None

    def get(self) -> Writes:
        if self.made is None:
            from transfer.writes import Writes
            with self._lock:
                if self.made is None:
                    self.made = Writes(*self._args)
        return self.made

    def abort(self, seconds: float, backends: Iterable[object]) -> List[str]:
        """For signal handlers: abort every multipart upload in flight, giving up after
        ``seconds``, and remove the server-side temp files of other uploads in flight
        (:class:`~transfer.backends.base.TempUploads`) of ``backends`` in what is left of it;
        returns the URLs of multipart uploads that could not be aborted in time."""
        deadline = time.monotonic() + seconds
        stuck = self.made.abort_all(seconds) if self.made is not None else []
        for backend in backends:
            if isinstance(backend, TempUploads):
                backend.discard_in_flight(max(0.5, deadline - time.monotonic()))
        return stuck


class Copies:
    """One attempt's copy over ``session``'s backends, reading through ``stacks`` and writing
    through ``writes``. Thread-safe."""

    def __init__(self, session: Session, stacks: Stacks, writes: WritesSlot) -> None:
        self._session = session
        self._stacks = stacks
        self._writes = writes

    def copy(self, source: Url, op: Transfer, draw: Optional[Callable[[], None]] = None) -> int:
        """``source`` (one of ``op``'s) to ``op.dest``; the bytes copied. ``draw`` takes a token
        of the prefix's pace for each request after the first of a server-side copy
        (:class:`~transfer.backends.base.ServerSideCopy`)."""
        dest = op.dest
        if dest.is_local:
            if source.is_local:
                from transfer.local_copies import local_copy
                return local_copy(source, op, lambda path, mode: self.download(source, path, mode=mode))
            return self.download(source, dest.path, symlink=op.link is LinkMode.SYMLINK or dest.scheme == "symlink")
        if source.is_local:
            return self._writes.get().upload(source.path, dest)
        return self._between(source, dest, draw)

    def fetch(self, op: Transfer) -> int:
        """``op``'s first source, remote, at its local destination down the read stack: what
        :meth:`copy` does for such a transfer, for the engine's downloads of bodies read ahead
        (a few calls less per small file)."""
        source, dest = op.sources[0], op.dest
        return self._stacks.reader_of(source).fetch_to(
            source, dest.path, op.link is LinkMode.SYMLINK or dest.scheme == "symlink", 0o666)

    def download(self, source: Url, path: str, symlink: bool = False, mode: int = 0o666) -> int:
        """A remote object at ``path`` down its endpoint's read stack (node cache, peers, bundle
        members, the store). ``symlink`` links ``path`` to the cache entry (Pegasus
        ``--symlink``); ``mode`` is the new file's permission bits before the umask."""
        return self._stacks.reader_of(source).fetch_to(source, path, symlink, mode)

    def _between(self, source: Url, dest: Url, draw: Optional[Callable[[], None]]) -> int:
        """One object to another: server-side within one endpoint that copies, else two hops."""
        source_backend, dest_backend = self._session.backend(source), self._session.backend(dest)
        if source_backend is dest_backend and isinstance(source_backend, ServerSideCopy):
            try:
                return source_backend.copy(source, dest, draw).size
            finally:
                self._writes.get().write_through(dest, None, None)
        uploads(dest_backend, dest, "put")  # a read-only destination is refused before any GET
        fd, temp = scratch_file("pegasus-cloudio-", ".data")
        os.close(fd)
        try:
            self.download(source, temp)
            return self._writes.get().upload(temp, dest)
        finally:
            try:
                os.unlink(temp)
            except OSError:
                pass
