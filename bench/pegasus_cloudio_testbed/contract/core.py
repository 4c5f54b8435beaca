"""The read contract every backend and every layer meets, and :func:`contract_for`, which adds
the cases of the capabilities a reader claims (:mod:`.select`) to it."""

from __future__ import annotations

import io
import os
from typing import Type

import pytest

from pegasus_cloudio_testbed.contract.base import AWKWARD_KEYS, ContractBase, Seed, UrlFor
from pegasus_cloudio_testbed.contract.select import mixins_for, unclaimed_mixins
from transfer.backends.base import Backend, ObjectInfo
from transfer.errors import NotFound, TransferError


class ReadContract(ContractBase):
    """stat and get (whole and ranged), NotFound, awkward keys, many threads: what every
    backend and every layer does; and the rule that a reader claiming a capability runs that
    capability's cases (``close`` is one: every backend has it, layers need not)."""

    def test_reader_has_the_read_protocol(self, reader: Backend) -> None:
        missing = [name for name in ("stat", "get") if not callable(getattr(reader, name, None))]
        assert not missing, f"{type(reader).__name__} lacks {missing}"

    def test_claimed_capabilities_run_their_cases(self, reader: Backend) -> None:
        """A reader that claims a capability (``isinstance``) cannot skip its cases, and a
        class cannot run a capability's cases against a reader that does not claim it."""
        missing = [m.__name__ for m in mixins_for(reader) if not isinstance(self, m)]
        assert not missing, f"{type(reader).__name__} claims capabilities whose cases this class lacks: {missing}"
        extra = [m.__name__ for m in unclaimed_mixins(type(self), reader)]
        assert not extra, f"{type(reader).__name__} does not claim the capabilities of {extra}"

    def test_stat_gives_size_and_version(self, reader: Backend, seed: Seed, url_for: UrlFor) -> None:
        data = os.urandom(3000)
        seed("stat/obj.bin", data)
        info = reader.stat(url_for("stat/obj.bin"))
        assert isinstance(info, ObjectInfo)
        assert info.size == len(data)
        assert info.version, "stat gave no version (ETag, generation or mtime-size)"

    def test_get_writes_the_whole_object(self, reader: Backend, seed: Seed, url_for: UrlFor) -> None:
        data = os.urandom((1 << 20) + 7)
        seed("get/large.bin", data)
        sink = io.BytesIO()
        info = reader.get(url_for("get/large.bin"), sink)
        assert sink.getvalue() == data
        assert info.size == len(data)
        assert info.version == reader.stat(url_for("get/large.bin")).version

    def test_get_of_an_empty_object(self, reader: Backend, seed: Seed, url_for: UrlFor) -> None:
        seed("empty", b"")
        assert reader.stat(url_for("empty")).size == 0
        assert self.read(reader, url_for("empty")) == b""

    @pytest.mark.parametrize("start,end", [(0, 1), (100, 1100), (4000, 4096), (0, 4096)])
    def test_ranged_get_writes_the_slice(self, reader: Backend, seed: Seed, url_for: UrlFor,
                                         start: int, end: int) -> None:
        data = bytes(range(256)) * 16
        seed("ranged.bin", data)
        sink = io.BytesIO()
        info = reader.get(url_for("ranged.bin"), sink, byte_range=(start, end))
        assert sink.getvalue() == data[start:end]
        assert info.size == len(data), f"a ranged get reports the object's size, not {info.size}"

    def test_zero_length_range_writes_nothing(self, reader: Backend, seed: Seed, url_for: UrlFor) -> None:
        """``(n, n)`` asks for no bytes: none are written (never the whole object), and no
        error but the store's own (a TransferError) is raised."""
        seed("zero.bin", b"0123456789")
        sink = io.BytesIO()
        try:
            reader.get(url_for("zero.bin"), sink, byte_range=(5, 5))
        except TransferError:
            pass
        assert sink.getvalue() == b""

    def test_range_past_the_end_is_cut_or_refused(self, reader: Backend, seed: Seed, url_for: UrlFor) -> None:
        """A range ending past the object gives the bytes up to its end (as HTTP's ``Range``
        does) or raises a TransferError; it never writes a byte that is not the object's."""
        seed("short.bin", b"0123456789")
        sink = io.BytesIO()
        try:
            reader.get(url_for("short.bin"), sink, byte_range=(6, 50))
        except TransferError:
            assert sink.getvalue() in (b"", b"6789"[:len(sink.getvalue())])
            return
        assert sink.getvalue() == b"6789"

    def test_range_starting_past_the_end_is_refused(self, reader: Backend, seed: Seed, url_for: UrlFor) -> None:
        seed("short.bin", b"0123456789")
        sink = io.BytesIO()
        with pytest.raises(TransferError):
            reader.get(url_for("short.bin"), sink, byte_range=(20, 30))
        assert sink.getvalue() == b""

    def test_missing_object_is_not_found(self, reader: Backend, url_for: UrlFor) -> None:
        sink = io.BytesIO()
        with pytest.raises(NotFound) as raised:
            reader.get(url_for("absent/never"), sink)
        assert "never" in str(raised.value), f"the error does not name the object: {raised.value}"
        assert sink.getvalue() == b""
        with pytest.raises(NotFound):
            reader.stat(url_for("absent/never"))

    def test_a_directory_is_no_object(self, reader: Backend, seed: Seed, url_for: UrlFor) -> None:
        """A name with objects below it (a directory, a prefix) is not read as an object."""
        seed("dir/below/obj", b"below")
        sink = io.BytesIO()
        with pytest.raises(TransferError):
            reader.get(url_for("dir/below"), sink)
        assert sink.getvalue() == b""

    def test_get_names_the_url_it_read(self, reader: Backend, seed: Seed, url_for: UrlFor) -> None:
        seed("named.bin", b"n")
        assert reader.get(url_for("named.bin"), io.BytesIO()).url == url_for("named.bin")
        assert reader.stat(url_for("named.bin")).url == url_for("named.bin")

    def test_not_found_is_a_transfer_error_and_the_builtin(self, reader: Backend, url_for: UrlFor) -> None:
        with pytest.raises(NotFound) as raised:
            reader.stat(url_for("gone.bin"))
        assert isinstance(raised.value, FileNotFoundError) and isinstance(raised.value, TransferError)
        assert not raised.value.retryable

    @pytest.mark.parametrize("key", AWKWARD_KEYS)
    def test_awkward_keys_read_back(self, reader: Backend, seed: Seed, url_for: UrlFor, key: str) -> None:
        data = key.encode("utf-8") * 3
        seed(f"keys/{key}", data)
        assert reader.stat(url_for(f"keys/{key}")).size == len(data)
        assert self.read(reader, url_for(f"keys/{key}")) == data

    def test_concurrent_gets_each_get_their_own_bytes(self, reader: Backend, seed: Seed, url_for: UrlFor) -> None:
        """Methods are safe to call from many threads (the Backend contract)."""
        from concurrent.futures import ThreadPoolExecutor
        bodies = {f"many/{i}": os.urandom(1000 + i) for i in range(24)}
        for key, body in bodies.items():
            seed(key, body)
        with ThreadPoolExecutor(6) as pool:
            got = dict(zip(bodies, pool.map(lambda key: self.read(reader, url_for(key)), bodies)))
        assert got == bodies


def contract_for(reader: object, name: str = "Contract") -> Type[ReadContract]:
    """A base class for a test class: :class:`ReadContract` with the mix-ins of ``reader``'s
    capabilities (a reader that can be made at import time, without a server)::

        class TestMine(contract_for(MyBackend(...))):
            ...fixtures...
    """
    return type(name, (ReadContract, *mixins_for(reader)), {})
