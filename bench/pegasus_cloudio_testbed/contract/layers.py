"""Cases of what backends and layers do beyond reading into a sink: ``close`` (every
backend), and ``fetch_to`` and ``prepare`` (every layer of ``transfer.layers`` and its bottom
reader; ``docs/architecture.md``, "Reads as stacked layers"). The protocols are written here
structurally, as ``isinstance`` checks them, so the suite needs no layer module to run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Generator, List, Optional, Sequence, Tuple

import pytest

from pegasus_cloudio_testbed.contract.base import ContractBase, Seed, UrlFor
from transfer.errors import NotFound
from transfer.lean import Protocol, runtime_checkable
from transfer.urls import Url


@runtime_checkable
class Closes(Protocol):
    """Readers that hold connections and release them (every backend)."""

    def close(self) -> None:
        """Release connections; a second call does nothing."""


@runtime_checkable
class FetchesTo(Protocol):
    """The layers' additions to the read protocol (``transfer.layers.Reader``)."""

    def fetch_to(self, url: Url, path: str, link: bool = False, mode: int = 0o666) -> int:
        """The object at the new name ``path``; its size. Nothing at ``path`` on error."""

    def prepare(self, batch: Sequence[Url], cancel: Any = None) -> Generator[List[Url], None, List[Url]]:
        """Plan a batch of reads before any is made: yields lists of URLs whose bodies are now
        held, and returns the URLs the store answered 404 to before any body."""

    def take(self, url: Url) -> Optional[Tuple[bytes, Any]]:
        """A body read ahead, handed over once."""


def planned(reader: Any, batch: Sequence[Url]) -> Tuple[List[Url], List[Url]]:
    """``reader.prepare(batch)`` run through: (every URL held, the URLs it returned absent)."""
    plan = reader.prepare(batch)
    held: List[Url] = []
    while True:
        try:
            held += next(plan)
        except StopIteration as end:
            return held, end.value


class ClosesContract(ContractBase):
    """``close`` after reads, twice, raises nothing."""

    capability: ClassVar[type] = Closes

    def test_close_twice_is_harmless(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        seed("c.bin", b"c")
        assert self.read(reader, url_for("c.bin")) == b"c"
        reader.close()
        reader.close()


class LayerContract(ContractBase):
    """``fetch_to``: the object's bytes at a new name with the asked mode (under the umask),
    nothing left behind on error; ``locate`` and ``prepare``: planning that never fails a batch
    by itself."""

    capability: ClassVar[type] = FetchesTo

    def test_fetch_to_writes_a_new_file(self, reader: Any, seed: Seed, url_for: UrlFor, tmp_path: Path) -> None:
        data = os.urandom(123_457)
        seed("ft/obj.bin", data)
        path = tmp_path / "fetched.bin"
        assert reader.fetch_to(url_for("ft/obj.bin"), str(path)) == len(data)
        assert path.read_bytes() == data

    def test_fetch_to_gives_the_asked_mode(self, reader: Any, seed: Seed, url_for: UrlFor, tmp_path: Path) -> None:
        """A mode asked for is the file's, on a first read and a second (a layer with entries: a
        miss, then a hit), and the file is one of its own: a later read's file, made the
        layer's own way (the default mode: a link of an entry, say), is another inode."""
        seed("ft/mode.bin", b"mode")
        first, second, own = tmp_path / "moded.bin", tmp_path / "moded2.bin", tmp_path / "own.bin"
        reader.fetch_to(url_for("ft/mode.bin"), str(first), False, 0o640)
        reader.fetch_to(url_for("ft/mode.bin"), str(second), False, 0o600)
        reader.fetch_to(url_for("ft/mode.bin"), str(own))
        umask = os.umask(0)  # read the umask back: os has no getter
        os.umask(umask)
        assert (os.stat(first).st_mode & 0o777, os.stat(second).st_mode & 0o777) == (0o640 & ~umask, 0o600 & ~umask)
        assert os.stat(own).st_ino not in (os.stat(first).st_ino, os.stat(second).st_ino)
        assert first.read_bytes() == second.read_bytes() == own.read_bytes() == b"mode"

    def test_fetch_to_of_an_empty_object(self, reader: Any, seed: Seed, url_for: UrlFor, tmp_path: Path) -> None:
        seed("ft/empty", b"")
        assert reader.fetch_to(url_for("ft/empty"), str(tmp_path / "e")) == 0
        assert (tmp_path / "e").read_bytes() == b""

    def test_fetch_to_a_link_gives_the_bytes(self, reader: Any, seed: Seed, url_for: UrlFor, tmp_path: Path) -> None:
        """``link``: a layer with entries may symlink the new name to one; the bytes are the same."""
        seed("ft/linked.bin", b"linked bytes")
        assert reader.fetch_to(url_for("ft/linked.bin"), str(tmp_path / "l"), True) == 12
        assert (tmp_path / "l").read_bytes() == b"linked bytes"

    def test_fetch_to_of_a_missing_object_leaves_nothing(self, reader: Any, url_for: UrlFor, tmp_path: Path) -> None:
        with pytest.raises(NotFound):
            reader.fetch_to(url_for("ft/absent"), str(tmp_path / "absent"))
        assert not os.path.lexists(tmp_path / "absent")

    def test_locate_never_fails_the_batch(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        """``locate`` raises nothing (an empty batch, a missing object) and answers False where
        no URL of the batch may be kept under a key of its own (a plain object keeps its own)."""
        seed("lo/a", b"lo/a")
        assert reader.locate([]) is False
        batch = [url_for("lo/a"), url_for("lo/absent")]
        if reader.locate(batch) is False:
            assert [reader.kept_under(url) for url in batch] == [None, None]
        assert self.read(reader, url_for("lo/a")) == b"lo/a"

    def test_prepare_then_read(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        """A batch planned with a missing member: the plan raises nothing, each read reports its
        own; a body held ahead is the object's, and is handed out once (a second read reads it
        again)."""
        for key in ("pr/a", "pr/b"):
            seed(key, key.encode())
        assert planned(reader, []) == ([], [])
        batch = [url_for("pr/a"), url_for("pr/b"), url_for("pr/absent")]
        held, absent = planned(reader, batch)
        assert all(any(url is b for b in batch) for url in held) and url_for("pr/absent") not in held
        assert all(url == url_for("pr/absent") for url in absent)
        assert self.read(reader, url_for("pr/a")) == b"pr/a"
        assert self.read(reader, url_for("pr/a")) == b"pr/a"
        assert self.read(reader, url_for("pr/b")) == b"pr/b"
        assert reader.take(url_for("pr/a")) is None and reader.take(url_for("pr/b")) is None
        with pytest.raises(NotFound):
            reader.stat(url_for("pr/absent"))

    def test_a_body_held_ahead_is_taken_once(self, reader: Any, seed: Seed, url_for: UrlFor, tmp_path: Path) -> None:
        """What ``prepare`` holds comes out of ``take`` or ``fetch_to`` once, as the object's bytes."""
        for key in ("ta/a", "ta/b"):
            seed(key, key.encode() * 10)
        held, absent = planned(reader, [url_for("ta/a"), url_for("ta/b")])
        assert absent == []
        for url in held:
            assert url_for("ta/a") == url or url_for("ta/b") == url
        first = reader.take(url_for("ta/a"))
        assert first is None or (first[0] == b"ta/a" * 10 and first[1].size == 40)
        assert reader.take(url_for("ta/a")) is None
        assert reader.fetch_to(url_for("ta/b"), str(tmp_path / "b")) == 40
        assert (tmp_path / "b").read_bytes() == b"ta/b" * 10 and reader.take(url_for("ta/b")) is None

    def test_a_body_held_ahead_is_written_with_the_asked_mode(self, reader: Any, seed: Seed, url_for: UrlFor,
                                                              tmp_path: Path) -> None:
        """``fetch_to`` of a body ``prepare`` held gives the mode asked for, as a read made then does."""
        for key in ("tm/a", "tm/b"):
            seed(key, key.encode() * 3)
        planned(reader, [url_for("tm/a"), url_for("tm/b")])
        umask = os.umask(0)
        os.umask(umask)
        assert reader.fetch_to(url_for("tm/a"), str(tmp_path / "a"), False, 0o640) == 12
        assert (tmp_path / "a").read_bytes() == b"tm/a" * 3
        assert os.stat(tmp_path / "a").st_mode & 0o777 == 0o640 & ~umask
