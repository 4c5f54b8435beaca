"""Cases of the read capabilities: ranged parallel reads, batched small reads, dialling
ahead, cache keys, peer scopes and pre-signed URLs."""

from __future__ import annotations

import io
import os
import urllib.error
import urllib.request
from typing import Any, ClassVar, Dict, List, Tuple

import pytest

from pegasus_cloudio_testbed.contract.base import AWKWARD_KEYS, ContractBase, Seed, UrlFor
from transfer.backends.base import (
    BatchReads,
    CacheKeys,
    DialsAhead,
    ObjectInfo,
    PeerScopes,
    Presigns,
    RangedReads,
)
from transfer.errors import ChecksumMismatch, NotFound, RemoteError


class RangedReadsContract(ContractBase):
    """``open_read`` (head first, body streamed by the caller) and ``get_range`` pinned to a
    version: RemoteError once the object changed."""

    capability: ClassVar[type] = RangedReads

    def test_open_read_streams_the_body(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        data = os.urandom(300_000)
        seed("rr/obj.bin", data)
        stream = reader.open_read(url_for("rr/obj.bin"))
        out = io.BytesIO()
        try:
            assert stream.info.size == len(data) and stream.info.version
            assert stream.read(1000, out.write) == 1000
            assert stream.read(len(data) - 1000, out.write) == len(data) - 1000
        finally:
            stream.close()
        assert out.getvalue() == data
        if stream.check is not None:
            stream.check.update(data)
            assert stream.check.matches()

    def test_open_read_closed_early_is_harmless(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        seed("rr/early.bin", os.urandom(200_000))
        stream = reader.open_read(url_for("rr/early.bin"))
        stream.read(10, lambda chunk: None)
        stream.close()
        assert reader.stat(url_for("rr/early.bin")).size == 200_000

    def test_open_read_of_a_missing_object_is_not_found(self, reader: Any, url_for: UrlFor) -> None:
        with pytest.raises(NotFound):
            reader.open_read(url_for("rr/absent"))

    def test_get_range_pinned_to_the_version(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        data = os.urandom(100_000)
        seed("rr/pinned.bin", data)
        info = reader.stat(url_for("rr/pinned.bin"))
        out = io.BytesIO()
        assert reader.get_range(url_for("rr/pinned.bin"), (5000, 65000), info.version, info.size, out.write) == 60000
        assert out.getvalue() == data[5000:65000]

    def test_get_range_of_a_changed_object_raises(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        seed("rr/changing.bin", b"a" * 5000)
        info = reader.stat(url_for("rr/changing.bin"))
        seed("rr/changing.bin", b"b" * 5000)
        out = io.BytesIO()
        with pytest.raises((RemoteError, ChecksumMismatch)):
            reader.get_range(url_for("rr/changing.bin"), (0, 100), info.version, info.size, out.write)
        assert b"b" not in out.getvalue()


class BatchReadsContract(ContractBase):
    """``read_small``: each whole, verified body to ``take``; everything else (missing, refused
    by ``take``) handed back by index for the caller; never raises."""

    capability: ClassVar[type] = BatchReads

    def test_bodies_go_to_take_and_the_rest_comes_back(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        bodies = {f"br/{i:02d}": os.urandom(100 + i) for i in range(12)}
        for key, body in bodies.items():
            seed(key, body)
        keys = list(bodies) + ["br/absent"]
        taken: Dict[int, bytes] = {}
        missing: List[int] = []

        def take(index: int, body: bytes, info: ObjectInfo, sent: float) -> bool:
            assert info.size == len(body)
            if index == 3:
                return False  # refused: must come back in the rest
            taken[index] = bytes(body)
            return True

        def on_missing(index: int) -> bool:
            missing.append(index)
            return False
        rest = reader.read_small([url_for(k) for k in keys], take, connections=2, missing=on_missing)
        assert {keys[i]: b for i, b in taken.items()} == {k: b for k, b in bodies.items() if k != "br/03"}
        assert 3 in rest and 12 in rest and set(rest) | set(taken) == set(range(13))
        assert list(rest) == sorted(rest)
        assert missing in ([], [12])

    def test_an_empty_batch(self, reader: Any) -> None:
        assert reader.read_small([], lambda *args: True, connections=1) == []

    def test_an_empty_object_is_taken_or_handed_back(self, reader: Any, seed: Seed,
                                                               url_for: UrlFor) -> None:
        """An object of size 0 is a whole body like any other (or left to the caller)."""
        seed("br/zero", b"")
        got: List[Tuple[int, bytes]] = []

        def take(index: int, body: bytes, info: ObjectInfo, sent: float) -> bool:
            got.append((index, bytes(body)))
            return True
        rest = reader.read_small([url_for("br/zero")], take, connections=1)
        assert (got, rest) in (([(0, b"")], []), ([], [0]))


class DialsAheadContract(ContractBase):
    """``dial_ahead``: best effort, never raises; the requests after it work."""

    capability: ClassVar[type] = DialsAhead

    def test_requests_after_dialling_ahead_work(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        seed("da/x", b"dialled")
        reader.dial_ahead(url_for("da/x"), 4)
        assert self.read(reader, url_for("da/x")) == b"dialled"

    def test_dial_ahead_with_zero_connections(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        seed("da/y", b"y")
        reader.dial_ahead(url_for("da/y"), 0)
        assert self.read(reader, url_for("da/y")) == b"y"


class CacheKeysContract(ContractBase):
    """``cache_key``: the same name for the same object every time, different for different
    objects (awkward keys included)."""

    capability: ClassVar[type] = CacheKeys

    def test_one_name_per_object(self, reader: Any, url_for: UrlFor) -> None:
        keys = ["a", "a/b", "A", "a b", *AWKWARD_KEYS]
        names = [reader.cache_key(url_for(k)) for k in keys]
        assert len(set(names)) == len(keys)
        assert names == [reader.cache_key(url_for(k)) for k in keys]
        assert all(isinstance(n, str) and n for n in names)


class PeerScopesContract(ContractBase):
    """``peer_scope``: None (anonymous) or one scope per identity and bucket: the same for
    two objects of one bucket."""

    capability: ClassVar[type] = PeerScopes

    def test_one_scope_per_bucket(self, reader: Any, url_for: UrlFor) -> None:
        first, second = reader.peer_scope(url_for("a")), reader.peer_scope(url_for("sub/b"))
        assert first == second
        if first is not None:
            from transfer.peers import Scope
            assert isinstance(first, Scope)


class PresignsContract(ContractBase):
    """``presign``: a GET URL that reads the object and a PUT URL that stores one, without keys."""

    capability: ClassVar[type] = Presigns

    @staticmethod
    def fetch(url: str, method: str = "GET", body: bytes = b"") -> bytes:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        request = urllib.request.Request(url, data=body if method == "PUT" else None, method=method)
        with opener.open(request, timeout=30) as answer:
            data: bytes = answer.read()
            return data

    def test_a_presigned_get_reads_the_object(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        seed("ps/obj", b"signed")
        assert self.fetch(reader.presign(url_for("ps/obj"), "GET", 300)) == b"signed"

    def test_a_presigned_put_stores_one(self, reader: Any, url_for: UrlFor) -> None:
        self.fetch(reader.presign(url_for("ps/put"), "PUT", 300), "PUT", b"put by a stranger")
        assert self.read(reader, url_for("ps/put")) == b"put by a stranger"

    def test_a_tampered_signature_is_refused(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        seed("ps/guarded", b"guarded")
        signed = reader.presign(url_for("ps/guarded"), "GET", 300)
        tampered = signed.replace("ps/guarded", "ps/guardeD")
        with pytest.raises(urllib.error.HTTPError) as raised:
            self.fetch(tampered)
        assert raised.value.code in (403, 404)


