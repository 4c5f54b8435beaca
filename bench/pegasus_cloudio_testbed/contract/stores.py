"""Cases of the store capabilities: uploads, a namespace (list, delete, make_dirs), one-level
and paged listings, tree removal, touches, buckets and their removal. Each mix-in names its protocol in
``capability``; :func:`pegasus_cloudio_testbed.contract.mixins_for` picks them by ``isinstance``."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pegasus_cloudio_testbed.contract.base import AWKWARD_KEYS, ContractBase, Seed, UrlFor, keys_of
from transfer.backends.base import (
    BucketRemoval,
    Buckets,
    DirectoryListing,
    Namespace,
    PagedListing,
    Touches,
    TreeRemoval,
    Uploads,
)
from transfer.errors import NotFound, TransferError


class UploadsContract(ContractBase):
    """``put``: the file's bytes stored under the URL, an existing object replaced whole."""

    capability: ClassVar[type] = Uploads

    def test_put_then_read_back(self, reader: Any, tmp_path: Path, url_for: UrlFor) -> None:
        data = os.urandom(70_000)
        if isinstance(reader, Namespace):
            reader.make_dirs(url_for("up"))
        info = reader.put(self.local_file(tmp_path, data), url_for("up/obj.bin"))
        assert info.size == len(data)
        assert self.read(reader, url_for("up/obj.bin")) == data

    def test_put_of_an_empty_file(self, reader: Any, tmp_path: Path, url_for: UrlFor) -> None:
        info = reader.put(self.local_file(tmp_path, b""), url_for("empty.bin"))
        assert info.size == 0
        assert reader.stat(url_for("empty.bin")).size == 0

    def test_put_replaces_a_larger_object_whole(self, reader: Any, seed: Seed, tmp_path: Path,
                                                 url_for: UrlFor) -> None:
        seed("replace.bin", b"x" * 5000)
        reader.put(self.local_file(tmp_path, b"short"), url_for("replace.bin"))
        assert self.read(reader, url_for("replace.bin")) == b"short"

    @pytest.mark.parametrize("key", AWKWARD_KEYS)
    def test_put_of_awkward_keys(self, reader: Any, tmp_path: Path, url_for: UrlFor, key: str) -> None:
        data = key.encode("utf-8")
        reader.put(self.local_file(tmp_path, data), url_for(key))
        assert self.read(reader, url_for(key)) == data

    def test_put_of_a_missing_local_file_raises(self, reader: Any, tmp_path: Path, url_for: UrlFor) -> None:
        with pytest.raises(TransferError) as raised:
            reader.put(str(tmp_path / "no-such-file"), url_for("never.bin"))
        assert isinstance(raised.value, OSError) or "no-such-file" in str(raised.value)
        with pytest.raises(NotFound):
            reader.stat(url_for("never.bin"))


class NamespaceContract(ContractBase):
    """``list`` (recursive, within the prefix's boundary, every page), ``delete`` (missing
    keys succeed, one result per URL) and ``make_dirs`` (idempotent)."""

    capability: ClassVar[type] = Namespace
    page_size: ClassVar[int] = 1000  # the store's listing page: the pagination case lists one more

    def test_list_is_recursive_within_the_prefix(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        for key in ("d/a", "d/sub/b", "d2/c", "dd"):
            seed(key, key.encode())
        assert keys_of(reader.list(url_for("d")), url_for("d")) == ["a", "sub/b"]

    def test_list_gives_sizes(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        seed("sizes/three", b"abc")
        seed("sizes/empty", b"")
        assert sorted((i.url.path.rsplit("/", 1)[1], i.size) for i in reader.list(url_for("sizes"))) == [
            ("empty", 0), ("three", 3)]

    def test_list_of_a_missing_prefix_is_empty_or_not_found(self, reader: Any, url_for: UrlFor) -> None:
        try:
            assert list(reader.list(url_for("nothing-here"))) == []
        except NotFound:
            pass

    def test_listed_urls_read_back(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        """Awkward keys come back as written, and each listed URL reads its object."""
        for key in AWKWARD_KEYS:
            seed(f"awk/{key}", key.encode())
        listed = list(reader.list(url_for("awk")))
        assert keys_of(iter(listed), url_for("awk")) == sorted(AWKWARD_KEYS)
        for info in listed:
            assert self.read(reader, info.url) == info.url.path.rsplit("/", 1)[1].encode()

    def test_a_trailing_slash_lists_the_same(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        seed("slash/a", b"a")
        seed("slash/b/c", b"c")
        assert keys_of(reader.list(url_for("slash/")), url_for("slash")) == ["a", "b/c"]

    def test_list_reads_every_page(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        keys = [f"pages/{i:05d}" for i in range(self.page_size + 1)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda key: seed(key, b""), keys))
        listed = keys_of(reader.list(url_for("pages")), url_for("pages"))
        assert listed == [key.split("/", 1)[1] for key in keys]

    def test_delete_gives_one_result_per_url_and_missing_ones_succeed(self, reader: Any, seed: Seed,
                                                                       url_for: UrlFor) -> None:
        seed("x/1", b"1")
        seed("x/2", b"2")
        assert reader.delete([url_for("x/1"), url_for("x/never"), url_for("x/2")]) == [None, None, None]
        assert list(reader.list(url_for("x"))) == []
        with pytest.raises(NotFound):
            reader.stat(url_for("x/1"))

    def test_delete_of_nothing(self, reader: Any) -> None:
        assert reader.delete([]) == []

    def test_delete_keeps_the_neighbours(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        seed("n/gone", b"1")
        seed("n/gone2", b"2")
        assert reader.delete([url_for("n/gone")]) == [None]
        assert self.read(reader, url_for("n/gone2")) == b"2"

    def test_make_dirs_is_idempotent(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        reader.make_dirs(url_for("m"))
        seed("m/kept", b"kept")
        reader.make_dirs(url_for("m"))
        assert self.read(reader, url_for("m/kept")) == b"kept"
        assert keys_of(reader.list(url_for("m")), url_for("m")) == ["kept"]


class DirectoryListingContract(ContractBase):
    """``list_dir``: one level, objects and sub-directories (ending in ``/``) apart."""

    capability: ClassVar[type] = DirectoryListing

    def test_list_dir_gives_one_level(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        for key in ("lv/a", "lv/b", "lv/sub/c", "lv/sub/deeper/d", "lvx/e"):
            seed(key, b"z")
        objects, dirs = reader.list_dir(url_for("lv"))
        assert keys_of(iter(objects), url_for("lv")) == ["a", "b"]
        assert [d.path for d in dirs] == [url_for("lv/sub/").path]

    def test_list_dir_of_a_missing_directory_is_empty(self, reader: Any, url_for: UrlFor) -> None:
        assert reader.list_dir(url_for("no-dir")) == ([], [])


class PagedListingContract(ContractBase):
    """``list_dir_pages``: the same answer as ``list_dir``, a page at a time, from a name on."""

    capability: ClassVar[type] = PagedListing
    page_size: ClassVar[int] = 1000

    def test_pages_add_up_to_the_directory(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        keys = [f"pg/{i:05d}" for i in range(self.page_size + 2)] + ["pg/sub/x"]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda key: seed(key, b""), keys))
        pages = list(reader.list_dir_pages(url_for("pg")))
        assert len(pages) >= 2, "more names than a page, yet one page"
        names = [o.url.path.rsplit("/", 1)[1] for objects, _ in pages for o in objects]
        assert names == [k.split("/", 1)[1] for k in keys[:-1]]
        assert [d.path for _, dirs in pages for d in dirs] == [url_for("pg/sub/").path]

    def test_start_after_skips_the_names_up_to_it(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        for name in ("a", "b", "c", "d"):
            seed(f"sa/{name}", b"")
        pages = list(reader.list_dir_pages(url_for("sa"), start_after="b"))
        assert [o.url.path.rsplit("/", 1)[1] for objects, _ in pages for o in objects] == ["c", "d"]


class TreeRemovalContract(ContractBase):
    """``delete_tree``: the tree and everything below it; a missing or empty tree is success."""

    capability: ClassVar[type] = TreeRemoval

    def test_delete_tree_removes_everything_below(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        for key in ("t/a", "t/s/b", "t/s/deep/c", "t2/kept"):
            seed(key, b"z")
        assert reader.delete_tree(url_for("t")) is None
        for key in ("t/a", "t/s/b", "t/s/deep/c"):
            with pytest.raises(NotFound):
                reader.stat(url_for(key))
        assert self.read(reader, url_for("t2/kept")) == b"z"

    def test_delete_tree_of_contents_keeps_the_directory(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        """``DIR/*`` empties DIR and keeps it (a cleanup job's ``rm -rf DIR/*``)."""
        for key in ("k/a", "k/s/b"):
            seed(key, b"z")
        assert reader.delete_tree(url_for("k/*")) is None
        assert list(reader.list(url_for("k"))) == []
        seed("k/again", b"again")
        assert self.read(reader, url_for("k/again")) == b"again"

    def test_delete_tree_of_a_missing_tree_succeeds(self, reader: Any, url_for: UrlFor) -> None:
        assert reader.delete_tree(url_for("never/there")) is None

    def test_delete_tree_of_an_empty_tree_succeeds(self, reader: Any, url_for: UrlFor) -> None:
        reader.make_dirs(url_for("hollow/inner"))
        assert reader.delete_tree(url_for("hollow")) is None
        assert reader.delete_tree(url_for("hollow")) is None


class TouchesContract(ContractBase):
    """``touch``: a newer modification time, bytes kept; NotFound for a missing object."""

    capability: ClassVar[type] = Touches

    def test_touch_keeps_the_bytes(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        seed("touched.bin", b"keep me")
        before = reader.stat(url_for("touched.bin"))
        info = reader.touch(url_for("touched.bin"))
        assert info.size == before.size == 7
        assert info.mtime is None or before.mtime is None or info.mtime >= before.mtime
        assert self.read(reader, url_for("touched.bin")) == b"keep me"

    def test_touch_of_a_missing_object_is_not_found(self, reader: Any, url_for: UrlFor) -> None:
        with pytest.raises(NotFound):
            reader.touch(url_for("untouchable"))
        with pytest.raises(NotFound):
            reader.stat(url_for("untouchable"))


class BucketsContract(ContractBase):
    """``bucket_exists``: True for the base URL's bucket, False for one that does not exist;
    ``names_bucket``: True for the bucket's own URL, False for an object's or a directory's in it."""

    capability: ClassVar[type] = Buckets
    missing_bucket_url: ClassVar[str] = ""  # a URL in a bucket that does not exist (default: derived)

    def test_the_base_bucket_exists(self, reader: Any, url_for: UrlFor) -> None:
        assert reader.bucket_exists(url_for("any")) is True

    def test_only_the_bucket_s_own_url_names_the_bucket(self, reader: Any, base_url: str, url_for: UrlFor) -> None:
        from transfer import parse_url
        assert reader.names_bucket(parse_url(base_url)) is True  # a contract's base URL is a bucket's root
        assert reader.names_bucket(parse_url(base_url + "/")) is True
        assert reader.names_bucket(url_for("any")) is False
        assert reader.names_bucket(url_for("dir/")) is False

    def test_a_missing_bucket_does_not(self, reader: Any, base_url: str) -> None:
        from transfer import parse_url
        scheme, _, rest = base_url.partition("://")
        head = rest.partition("/")[0]
        bucket = f"no-such-bucket-{os.urandom(6).hex()}"
        # s3://USER@SITE/BUCKET/KEY keeps its site; s3://BUCKET/KEY and gs://BUCKET/KEY name the bucket first
        derived = f"{scheme}://{head}/{bucket}/k" if "@" in head else f"{scheme}://{bucket}/k"
        url = self.missing_bucket_url or derived
        assert reader.bucket_exists(parse_url(url)) is False



class BucketRemovalContract(ContractBase):
    """``remove_bucket``: a missing bucket is NotFound, one still holding objects is refused and
    keeps them (the case that deletes a bucket needs one made for it, which the protocol does not
    promise; the front ends' own tests cover it)."""

    capability: ClassVar[type] = BucketRemoval
    missing_bucket_url: ClassVar[str] = ""

    def test_removing_a_missing_bucket_is_not_found(self, reader: Any, base_url: str) -> None:
        from transfer import parse_url
        scheme, _, rest = base_url.partition("://")
        head = rest.partition("/")[0]
        bucket = f"no-such-bucket-{os.urandom(6).hex()}"
        derived = f"{scheme}://{head}/{bucket}/k" if "@" in head else f"{scheme}://{bucket}/k"
        with pytest.raises(NotFound):
            reader.remove_bucket(parse_url(self.missing_bucket_url or derived))

    def test_a_bucket_with_objects_is_kept(self, reader: Any, seed: Seed, url_for: UrlFor) -> None:
        seed("kept/one", b"still here")
        with pytest.raises(TransferError) as refused:
            reader.remove_bucket(url_for("kept/one"))
        assert not isinstance(refused.value, NotFound)
        assert reader.stat(url_for("kept/one")).size == len(b"still here")