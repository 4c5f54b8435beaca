"""Cases of the write capabilities: batched small writes, multipart uploads, the open uploads a store lists,
exclusive, conditional and attributed puts, server-side copies and uploads through temp files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pegasus_cloudio_testbed.contract.base import ContractBase, Seed, UrlFor, keys_of
from transfer.backends.base import (
    Attributes,
    AttributedPuts,
    BatchWrites,
    ConditionalPuts,
    ExclusiveCreate,
    MultipartUploads,
    PendingUploads,
    ServerSideCopy,
    TempUploads,
)
from transfer.errors import AlreadyExists, NotFound, RemoteError, TransferError
from transfer.http.connection import FileRegion

MIB = 1 << 20


class BatchWritesContract(ContractBase):
    """``write_small``: each file the store took, checked, to ``stored``; everything else (a
    file that cannot be read, refused by ``stored``) handed back by index, in order, for the
    caller's per-file path; never raises."""

    capability: ClassVar[type] = BatchWrites

    def test_files_are_stored_and_the_rest_comes_back(self, reader: Any, tmp_path: Path, url_for: UrlFor) -> None:
        bodies = {f"bw/{i:02d}": os.urandom(100 + i) for i in range(12)}
        items = [(self.local_file(tmp_path, body, f"w{i}"), url_for(key)) for i, (key, body) in enumerate(bodies.items())]
        items.append((str(tmp_path / "absent"), url_for("bw/absent")))
        told = {}

        def stored(index: int, info: Any, sent: float) -> bool:
            told[index] = info.size
            return index != 3  # refused: must come back in the rest

        rest = reader.write_small(items, stored, connections=2)
        keys = list(bodies)
        assert 12 in rest and 3 in rest and list(rest) == sorted(rest)
        assert set(rest) | set(told) == set(range(13)) and 12 not in told
        for index, size in told.items():
            assert size == len(bodies[keys[index]])
            assert self.read(reader, url_for(keys[index])) == bodies[keys[index]]

    def test_an_empty_batch(self, reader: Any) -> None:
        assert reader.write_small([], lambda *args: True, connections=1) == []


class MultipartUploadsContract(ContractBase):
    """start, parts (1-based, any order of sending), complete in order; abort discards.
    ``part_bytes``: a part size the store accepts for every part but the last (S3: 5 MiB)."""

    capability: ClassVar[type] = MultipartUploads
    part_bytes: ClassVar[int] = 5 * MIB

    def upload(self, reader: Any, path: str, url: Any, part: int) -> Any:
        size = os.path.getsize(path)
        upload_id = reader.start_upload(url)
        regions = [FileRegion(path, offset, min(part, size - offset)) for offset in range(0, max(size, 1), part)]
        receipts = {n: reader.upload_part(url, upload_id, n, r) for n, r in reversed(list(enumerate(regions, 1)))}
        return reader.complete_upload(url, upload_id, [receipts[n] for n in sorted(receipts)])

    def test_the_attributes_are_set(self, reader: Any) -> None:
        assert reader.multipart_threshold > 0 and reader.part_size > 0

    def test_two_parts_assemble_in_order(self, reader: Any, tmp_path: Path, url_for: UrlFor) -> None:
        data = os.urandom(self.part_bytes + 12345)
        info = self.upload(reader, self.local_file(tmp_path, data), url_for("mp/two.bin"), self.part_bytes)
        assert info.size == len(data)
        assert self.read(reader, url_for("mp/two.bin")) == data

    def test_one_part(self, reader: Any, tmp_path: Path, url_for: UrlFor) -> None:
        data = os.urandom(1000)
        info = self.upload(reader, self.local_file(tmp_path, data), url_for("mp/one.bin"), self.part_bytes)
        assert info.size == 1000
        assert self.read(reader, url_for("mp/one.bin")) == data

    def test_abort_leaves_no_object_and_twice_is_harmless(self, reader: Any, tmp_path: Path,
                                                          url_for: UrlFor) -> None:
        path = self.local_file(tmp_path, b"abandoned")
        upload_id = reader.start_upload(url_for("mp/aborted.bin"))
        reader.upload_part(url_for("mp/aborted.bin"), upload_id, 1, FileRegion(path, 0, 9))
        reader.abort_upload(url_for("mp/aborted.bin"), upload_id)
        reader.abort_upload(url_for("mp/aborted.bin"), upload_id)
        with pytest.raises(NotFound):
            reader.stat(url_for("mp/aborted.bin"))

    def test_complete_of_an_unknown_upload_raises(self, reader: Any, tmp_path: Path, url_for: UrlFor) -> None:
        with pytest.raises(TransferError):
            reader.complete_upload(url_for("mp/unknown.bin"), "no-such-upload-id", ["x"])
        with pytest.raises(NotFound):
            reader.stat(url_for("mp/unknown.bin"))


class PendingUploadsContract(ContractBase):
    """``pending_uploads``: an upload started and not finished is listed; once aborted it is not."""

    capability: ClassVar[type] = PendingUploads

    def test_an_open_upload_is_listed_until_aborted(self, reader: Any, url_for: UrlFor) -> None:
        assert reader.orphan_age >= 0
        upload_id = reader.start_upload(url_for("open/one.bin"))
        listed = list(reader.pending_uploads(url_for("open/one.bin")))
        assert [(u.key.rsplit("/", 1)[1], u.upload_id) for u in listed] == [("one.bin", upload_id)]
        assert [u.upload_id for u in reader.pending_uploads(url_for("open/"), whole_key=False)] == [upload_id]
        assert list(reader.pending_uploads(url_for("open/one"))) == [], "whole_key matched a prefix"
        reader.abort_upload(url_for("open/one.bin"), upload_id)
        assert list(reader.pending_uploads(url_for("open/one.bin"))) == []


class ExclusiveCreateContract(ContractBase):
    """``put_new``: stores a new name; AlreadyExists, the old bytes kept, for a taken one."""

    capability: ClassVar[type] = ExclusiveCreate

    def test_put_new_creates_then_refuses(self, reader: Any, tmp_path: Path, url_for: UrlFor) -> None:
        first = self.local_file(tmp_path, b"first", "a")
        assert reader.put_new(first, url_for("ex.bin")).size == 5
        with pytest.raises(AlreadyExists):
            reader.put_new(self.local_file(tmp_path, b"second", "b"), url_for("ex.bin"))
        assert self.read(reader, url_for("ex.bin")) == b"first"


class ConditionalPutsContract(ContractBase):
    """``put_if_match``: replaces the expected version; RemoteError 412, nothing stored, otherwise."""

    capability: ClassVar[type] = ConditionalPuts

    def test_put_if_match_replaces_only_the_expected_version(self, reader: Any, seed: Seed, tmp_path: Path,
                                                             url_for: UrlFor) -> None:
        seed("cond.bin", b"v1")
        version = reader.stat(url_for("cond.bin")).version
        reader.put_if_match(self.local_file(tmp_path, b"v2", "a"), url_for("cond.bin"), version)
        assert self.read(reader, url_for("cond.bin")) == b"v2"
        with pytest.raises(RemoteError) as raised:
            reader.put_if_match(self.local_file(tmp_path, b"v3", "b"), url_for("cond.bin"), version)
        assert raised.value.status == 412
        assert self.read(reader, url_for("cond.bin")) == b"v2"

    def test_put_if_match_of_a_missing_object_stores_nothing(self, reader: Any, tmp_path: Path,
                                                              url_for: UrlFor) -> None:
        with pytest.raises(RemoteError):
            reader.put_if_match(self.local_file(tmp_path, b"x"), url_for("nocond.bin"), "0123abcd")
        with pytest.raises(NotFound):
            reader.stat(url_for("nocond.bin"))


class AttributedPutsContract(ContractBase):
    """``put_with``: the bytes and their attributes in one request; the conditions as put_new's."""

    capability: ClassVar[type] = AttributedPuts

    def test_put_with_stores_bytes_and_attributes(self, reader: Any, tmp_path: Path, url_for: UrlFor) -> None:
        attributes = Attributes(content_type="text/x-contract", cache_control="max-age=60",
                                metadata=(("origin", "contract"),))
        info = reader.put_with(self.local_file(tmp_path, b"attributed"), url_for("attr.txt"), attributes)
        assert info.size == 10
        assert self.read(reader, url_for("attr.txt")) == b"attributed"
        stat = reader.stat(url_for("attr.txt"))
        if stat.attributes is not None:
            assert stat.attributes.content_type == "text/x-contract"
            assert ("origin", "contract") in stat.attributes.metadata

    def test_put_with_if_none_match_refuses_a_taken_name(self, reader: Any, seed: Seed, tmp_path: Path,
                                                         url_for: UrlFor) -> None:
        seed("taken.txt", b"old")
        with pytest.raises(AlreadyExists):
            reader.put_with(self.local_file(tmp_path, b"new"), url_for("taken.txt"), Attributes(),
                            if_none_match=True)
        assert self.read(reader, url_for("taken.txt")) == b"old"


class ServerSideCopyContract(ContractBase):
    """``copy``: the bytes under a second name, source kept; NotFound for a missing source;
    a copy onto itself keeps the object."""

    capability: ClassVar[type] = ServerSideCopy

    def test_copy_makes_a_second_object(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        data = os.urandom(40_000)
        seed("cp/src.bin", data)
        info = reader.copy(url_for("cp/src.bin"), url_for("cp/sub/dst.bin"))
        assert info.size == len(data)
        assert self.read(reader, url_for("cp/sub/dst.bin")) == data
        assert self.read(reader, url_for("cp/src.bin")) == data

    def test_copy_of_an_empty_object(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        seed("cp/empty", b"")
        assert reader.copy(url_for("cp/empty"), url_for("cp/empty2")).size == 0

    def test_copy_of_a_missing_source_is_not_found(self, reader: Any, url_for: UrlFor) -> None:
        with pytest.raises(NotFound):
            reader.copy(url_for("cp/absent"), url_for("cp/never"))
        with pytest.raises(NotFound):
            reader.stat(url_for("cp/never"))

    def test_copy_onto_itself_keeps_the_object(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        """The store may refuse (S3 asks for new metadata), but the object stays whole."""
        seed("cp/self.bin", b"myself")
        try:
            reader.copy(url_for("cp/self.bin"), url_for("cp/self.bin"))
        except TransferError:
            pass
        assert self.read(reader, url_for("cp/self.bin")) == b"myself"


class TempUploadsContract(ContractBase):
    """Uploads through temp files leave none behind, and ``discard_in_flight`` with none in
    flight returns at once without raising."""

    capability: ClassVar[type] = TempUploads

    def test_no_temp_file_is_left_after_a_put(self, reader: Any, tmp_path: Path, url_for: UrlFor) -> None:
        reader.make_dirs(url_for("tmpdir"))
        reader.put(self.local_file(tmp_path, b"body"), url_for("tmpdir/file.bin"))
        reader.discard_in_flight(1.0)
        assert keys_of(reader.list(url_for("tmpdir")), url_for("tmpdir")) == ["file.bin"]
        assert self.read(reader, url_for("tmpdir/file.bin")) == b"body"
