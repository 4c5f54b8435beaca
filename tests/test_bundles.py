"""Bundles: the format refuses hostile input, the engine stages through bundles transparently,
fetches each bundle once, and removes members and bundles correctly (real MinIO)."""

import concurrent.futures
import io
import json
import os
import struct

import boto3
import pytest

from transfer import Engine, Remove, RetryPolicy, Session, Settings, Transfer, parse_url
from transfer.bundles import BUNDLE_DIR, BundleFormatError, pack_files, read_index, unbundle
from transfer.bundles.format import MAGIC, pack, parse_index
from transfer.errors import ChecksumMismatch, InvalidInput, NotFound
from local_files import files

FAST = RetryPolicy(max_attempts=2, base_delay=0.001, max_delay=0.01)


def raw_bundle(rows, data=b""):
    index = json.dumps({"format": 1, "members": rows}).encode()
    return MAGIC + struct.pack("<Q", len(index)) + index + data


GOOD_SHA = "0" * 64


@pytest.mark.parametrize("name", ["/etc/passwd", "../escape", "a/../../b", "a//b", "./a", "a\\b", "a\x00b", "", "a/"])
def test_unsafe_member_names_are_refused(name):
    with pytest.raises(BundleFormatError):
        parse_index(raw_bundle([[name, 0, 0, GOOD_SHA]]))


@pytest.mark.parametrize("rows,size", [
    ([["a", 0, 10, GOOD_SHA]], None),        # needs size to check; then outside
    ([["a", 0, 1, GOOD_SHA], ["a", 1, 1, GOOD_SHA]], 1000),  # duplicate
    ([["a", -1, 1, GOOD_SHA]], 1000),
    ([["a", 0, 1, "short"]], 1000),
    ([["a", 0, True, GOOD_SHA]], 1000),
])
def test_malformed_indexes_are_refused(rows, size):
    blob = raw_bundle(rows)
    with pytest.raises(BundleFormatError):
        parse_index(blob, size if size is not None else len(blob))


def test_bad_magic_and_oversized_index_are_refused():
    with pytest.raises(BundleFormatError):
        parse_index(b"PK\x03\x04" + b"\x00" * 40)
    with pytest.raises(BundleFormatError):
        parse_index(MAGIC + struct.pack("<Q", 1 << 40))


def test_pack_and_unbundle_round_trip_only_what_was_asked(tmp_path):
    (tmp_path / "a").write_bytes(b"alpha")
    (tmp_path / "b").write_bytes(b"beta" * 100)
    index = pack_files([("a", str(tmp_path / "a")), ("sub/b", str(tmp_path / "b"))], str(tmp_path / "x.pcb"))
    assert [m.name for m in index.members] == ["a", "sub/b"]
    assert read_index(str(tmp_path / "x.pcb")) == index
    out = tmp_path / "out"
    written = unbundle(str(tmp_path / "x.pcb"), str(out), names=["sub/b"])
    assert written == [str(out / "sub" / "b")] and (out / "sub" / "b").read_bytes() == b"beta" * 100
    assert not (out / "a").exists()
    with pytest.raises(NotFound):
        unbundle(str(tmp_path / "x.pcb"), str(out), names=["c"])
    with pytest.raises(BundleFormatError):
        unbundle(str(tmp_path / "x.pcb"), str(out), names=["../a"])


def test_unbundle_never_writes_through_a_symlinked_directory(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    pack_files([("link/f", str(tmp_path / "f"))], str(tmp_path / "b.pcb"))
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "link").symlink_to(outside)
    with pytest.raises(InvalidInput):
        unbundle(str(tmp_path / "b.pcb"), str(target))
    assert os.listdir(outside) == []


def test_tampered_member_fails_its_checksum(tmp_path):
    buffer = io.BytesIO()
    pack([("a", b"hello world")], buffer)
    blob = bytearray(buffer.getvalue())
    blob[-1] ^= 0xFF
    (tmp_path / "t.pcb").write_bytes(bytes(blob))
    with pytest.raises(BundleFormatError):
        unbundle(str(tmp_path / "t.pcb"), str(tmp_path / "o"))
    assert not (tmp_path / "o" / "a").exists()


# --------------------------------------------------------------------------- engine + MinIO


def s3(bucket, key):
    return parse_url(f"s3://test@minio/{bucket}/{key}", site_label="minio")


def make_files(directory, count, size=300):
    return files(directory, count, size, name="f{:03d}")


def keys(minio, bucket):
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return [o["Key"] for page in pages for o in page.get("Contents", [])], client


def upload(env, bucket, files, prefix="run", **settings):
    with Session(Settings(threads=4, **settings), env) as session:
        results = Engine(session, retry=FAST).run(
            [Transfer((parse_url(str(p)),), s3(bucket, f"{prefix}/{p.name}")) for p in files])
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    return results


def download(env, bucket, names, dest, prefix="run", **settings):
    with Session(Settings(threads=4, **settings), env) as session:
        results = Engine(session, retry=FAST).run(
            [Transfer((s3(bucket, f"{prefix}/{n}"),), parse_url(f"file://{dest}/{n}")) for n in names])
    return results


def test_bundled_batch_becomes_one_object_and_reads_back_in_two_requests(proxied, bucket, minio, tmp_path):
    proxy, env = proxied
    files = make_files(tmp_path / "src", 60)
    proxy.reset_counters()
    upload(env, bucket, files, bundle=True)
    assert proxy.snapshot()["requests"] == 1  # one PUT for 60 files
    listed, _ = keys(minio, bucket)
    assert len(listed) == 1 and listed[0].startswith(f"run/{BUNDLE_DIR}/") and listed[0].endswith(".pcb")
    proxy.reset_counters()
    results = download(env, bucket, [p.name for p in files], tmp_path / "dst", bundle=True)
    assert all(r.ok for r in results)
    assert proxy.snapshot()["requests"] == 2  # LIST of the bundle directory + one GET of the bundle
    for p in files:
        assert (tmp_path / "dst" / p.name).read_bytes() == p.read_bytes()


def test_reader_without_bundling_finds_members_after_a_404(s3_env, bucket, tmp_path):
    files = make_files(tmp_path / "src", 10)
    upload(s3_env, bucket, files, bundle=True)
    results = download(s3_env, bucket, [files[3].name], tmp_path / "dst")  # bundling off
    assert results[0].ok and (tmp_path / "dst" / files[3].name).read_bytes() == files[3].read_bytes()


def test_plain_objects_and_members_mix_in_one_batch(proxied, bucket, tmp_path):
    proxy, env = proxied
    bundled = make_files(tmp_path / "b", 12)
    upload(env, bucket, bundled, bundle=True)
    plain = make_files(tmp_path / "p", 3)
    for p in plain:
        p.rename(tmp_path / "p" / f"plain-{p.name}")
    plain = sorted((tmp_path / "p").iterdir())
    upload(env, bucket, plain)  # too few to bundle even if on, and bundling is off here
    proxy.reset_counters()
    names = [p.name for p in bundled] + [p.name for p in plain] + ["absent"]
    results = download(env, bucket, names, tmp_path / "dst", bundle=True)
    assert [r.ok for r in results] == [True] * 15 + [False]
    assert isinstance(results[-1].error, NotFound)
    assert proxy.snapshot()["requests"] == 1 + 1 + 3 + 1  # LIST, bundle, 3 plain, 1 missing


def test_large_bundle_with_few_members_wanted_uses_ranges(proxied, bucket, tmp_path):
    proxy, env = proxied
    files = make_files(tmp_path / "src", 40, size=20_000)
    upload(env, bucket, files, bundle=True)
    proxy.reset_counters()
    wanted = [files[n] for n in (5, 6, 30, 31)]
    results = download(env, bucket, [f.name for f in wanted], tmp_path / "dst", bundle=True)
    assert all(r.ok for r in results)
    counters = proxy.snapshot()
    assert counters["requests"] == 1 + 1 + 2  # LIST, head (index), two coalesced ranges
    assert counters["bytes_down"] < 400_000  # the 256 KiB head and two 40 KB ranges, not the 800 KB bundle
    for f in wanted:
        assert (tmp_path / "dst" / f.name).read_bytes() == f.read_bytes()


def test_large_bundle_with_most_members_wanted_is_read_whole_at_load(proxied, bucket, tmp_path):
    """A batch wanting many files of the directory (its bundles under 64 KiB per wanted file) reads
    an 800 KB bundle in one GET when loading it: no 256 KiB head first, no second GET of its data."""
    proxy, env = proxied
    files = make_files(tmp_path / "src", 40, size=20_000)
    upload(env, bucket, files, bundle=True)
    proxy.reset_counters()
    wanted = files[:30]
    results = download(env, bucket, [f.name for f in wanted], tmp_path / "dst", bundle=True)
    assert all(r.ok for r in results)
    counters = proxy.snapshot()
    assert counters["requests"] == 1 + 1  # LIST, the whole bundle
    assert counters["bytes_down"] < 900_000  # the bundle once
    for f in wanted:
        assert (tmp_path / "dst" / f.name).read_bytes() == f.read_bytes()


def test_a_batch_of_few_files_of_a_directory_skips_its_listing(proxied, bucket, tmp_path):
    """One plain file beside bundles: one GET, no LIST and no bundle heads. One member alone:
    its 404, then the LIST and the bundle (small: fetched whole), as a reader without bundling."""
    proxy, env = proxied
    bundled = make_files(tmp_path / "b", 12)
    upload(env, bucket, bundled, bundle=True)
    header = tmp_path / "p" / "header.hdr"
    header.parent.mkdir()
    header.write_bytes(b"SIMPLE = T")
    upload(env, bucket, [header])
    proxy.reset_counters()
    [result] = download(env, bucket, ["header.hdr"], tmp_path / "dst", bundle=True)
    assert result.ok and (tmp_path / "dst" / "header.hdr").read_bytes() == b"SIMPLE = T"
    assert proxy.snapshot()["requests_by_method"] == {"GET": 1}
    proxy.reset_counters()
    results = download(env, bucket, [bundled[3].name, bundled[7].name], tmp_path / "dst2", bundle=True)
    assert all(r.ok for r in results)
    for f in (bundled[3], bundled[7]):
        assert (tmp_path / "dst2" / f.name).read_bytes() == f.read_bytes()
    assert proxy.snapshot()["requests"] <= 2 + 1 + 1  # a 404 per file in flight, LIST, the bundle


def test_corrupt_bundle_is_retried_then_reported_leaving_no_files(s3_env, bucket, minio, tmp_path):
    files = make_files(tmp_path / "src", 10)
    upload(s3_env, bucket, files, bundle=True)
    listed, client = keys(minio, bucket)
    body = bytearray(client.get_object(Bucket=bucket, Key=listed[0])["Body"].read())
    body[-5] ^= 0xFF
    client.put_object(Bucket=bucket, Key=listed[0], Body=bytes(body))
    results = download(s3_env, bucket, [p.name for p in files], tmp_path / "dst", bundle=True)
    assert not results[-1].ok and isinstance(results[-1].error, ChecksumMismatch)
    assert results[-1].attempts == 2
    assert "SHA-256" in str(results[-1].error)
    assert not (tmp_path / "dst").exists() or [n for n in os.listdir(tmp_path / "dst")
                                              if n == files[-1].name] == []


def test_removing_members_then_the_last_one_deletes_the_bundle(s3_env, bucket, minio, tmp_path):
    files = make_files(tmp_path / "src", 10)
    upload(s3_env, bucket, files, bundle=True)
    settings = Settings(threads=2, bundle=True)
    with Session(settings, s3_env) as session:
        engine = Engine(session, retry=FAST)
        first = engine.run([Remove(s3(bucket, f"run/{p.name}")) for p in files[:4]])
        assert all(r.ok for r in first)
    listed, _ = keys(minio, bucket)
    assert len(listed) == 2  # the bundle and one removal record
    gone = download(s3_env, bucket, [files[0].name, files[5].name], tmp_path / "dst", bundle=True)
    assert [r.ok for r in gone] == [False, True]
    with Session(settings, s3_env) as session:
        rest = Engine(session, retry=FAST).run([Remove(s3(bucket, f"run/{p.name}")) for p in files[4:]])
    assert all(r.ok for r in rest)
    assert keys(minio, bucket)[0] == []


def test_recursive_remove_of_the_directory_deletes_bundles(s3_env, bucket, minio, tmp_path):
    upload(s3_env, bucket, make_files(tmp_path / "src", 10), bundle=True)
    with Session(Settings(threads=2), s3_env) as session:
        [result] = Engine(session).run([Remove(s3(bucket, "run"), recursive=True)])
    assert result.ok and keys(minio, bucket)[0] == []


def test_bundling_only_for_configured_sites_and_min_files(s3_env, bucket, minio, tmp_path):
    files = make_files(tmp_path / "src", 10)
    upload(s3_env, bucket, files, prefix="other", bundle_sites="elsewhere")
    upload(s3_env, bucket, files[:5], prefix="few", bundle=True, bundle_min_files=8)
    upload(s3_env, bucket, files, prefix="site", bundle_sites="minio")
    listed, _ = keys(minio, bucket)
    assert sum(k.startswith("other/f") for k in listed) == 10
    assert sum(k.startswith("few/f") for k in listed) == 5
    assert [k.startswith(f"site/{BUNDLE_DIR}/") for k in listed if k.startswith("site/")] == [True]


def test_custom_engine_example_runs_against_minio(s3_env, bucket, minio, tmp_path):
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                          "bundles_custom_engine.py")
    done = subprocess.run([sys.executable, script, f"s3://test@minio/{bucket}/run1", str(tmp_path / "w")],
                          env=dict(s3_env, PATH=os.environ["PATH"]), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "staged 50 files out and back in; 0 failures" in done.stdout
    assert (tmp_path / "w" / "task2" / "part049.txt").read_text() == "partial result 49\n"
    assert (tmp_path / "w" / "restored" / "part007.txt").read_text() == "partial result 7\n"
    assert [k.split("/")[1] for k in keys(minio, bucket)[0]] == [BUNDLE_DIR]


def test_planning_failures_become_per_file_results_not_a_crash(proxied, bucket, tmp_path):
    proxy, env = proxied
    from pegasus_cloudio_testbed.proxy import Fault

    upload(env, bucket, make_files(tmp_path / "src", 10), bundle=True)
    proxy.set_faults([Fault.status(403, body=b"<Error><Code>AccessDenied</Code></Error>", method="GET",
                                   path="list-type", times=1)])
    proxy.reset_counters()
    names = [f"f{i:03d}" for i in range(10)]
    results = download(env, bucket, names, tmp_path / "dst", bundle=True)
    assert len(results) == 10  # the LIST of the bundle directory failed; nothing raised
    assert all(r.ok for r in results)  # each file then found its bundle member after a 404
    bad = dict(env, PEGASUS_CREDENTIALS=str(tmp_path / "absent.conf"))
    results = download(bad, bucket, names[:3], tmp_path / "dst2", bundle=True)
    assert [type(r.error).__name__ for r in results] == ["ConfigError"] * 3


def test_a_reader_without_bundling_gets_6173_members_with_one_404_and_one_listing(proxied, bucket, tmp_path):
    """mConcatFit's directory size (a bundle bigger than the 256 KiB head, an index read in
    ranges): a reader with bundling off pays at most one 404 per thread in flight, the listing,
    the index and the bundle once (docs/bundles.md), never a request per file (before: 6,180
    GETs, one ranged GET per member)."""
    proxy, env = proxied
    count = 6173
    src = tmp_path / "src"
    src.mkdir()
    names = [f"f{i:05d}" for i in range(count)]
    for name in names:
        (src / name).write_bytes(name.encode() * 60)
    upload(env, bucket, [src / n for n in names], bundle=True)
    proxy.reset_counters()
    results = download(env, bucket, names, tmp_path / "dst")  # bundling off
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    gets = proxy.snapshot()["requests_by_method"].get("GET", 0)
    threads = 4  # download() runs 4: the first 4 reads may all meet a 404 before the index loads
    assert gets <= threads + 4, f"{gets} GETs for {count} bundled files"  # + LIST, head, index range, bundle
    assert all((tmp_path / "dst" / n).read_bytes() == n.encode() * 60 for n in names[::97])


def test_an_index_keeps_offsets_sizes_and_digests_of_any_width():
    """The index stores offsets and sizes as 8-byte integers: big values, zero sizes and
    many members come back exactly, and the total size adds them up."""
    from transfer.bundles.format import BundleIndex, Member
    members = [Member(f"m{i}", offset, size, f"{i:064x}")
               for i, (offset, size) in enumerate([(0, 0), (0, 1), (1, 2 ** 40), (2 ** 62, 2 ** 31 - 1)] +
                                                  [(n * 300, 300) for n in range(1000)])]
    index = BundleIndex(members, 4096)
    assert index.members == tuple(members) and index.get("m3") == members[3] and index.get("zz") is None
    assert index.total_size == 4096 + sum(m.size for m in members)
    with pytest.raises(BundleFormatError):
        BundleIndex(members + [members[0]], 0)


class _VanishingBundles(concurrent.futures.ThreadPoolExecutor):
    """An engine executor that, as the first bundle group is handed to it (its plan made, the
    bundle's head read), deletes the bundle and stores its members as plain objects."""

    def __init__(self, vanish):
        super().__init__(max_workers=4)
        self._vanish = vanish

    def submit(self, fn, *args, **kwargs):
        if getattr(fn, "__name__", "") == "read_bundle" and self._vanish is not None:
            self._vanish, vanish = None, self._vanish
            vanish()
        return super().submit(fn, *args, **kwargs)


def test_a_throttled_bundle_read_is_asked_again_whole_not_member_by_member(proxied, bucket, tmp_path):
    """A 503 SlowDown to a batch's bundle read: the bundle read is made again (its prefix's
    pace told), the wanted ranges; not left to the members' own reads (which fetch a bundle
    whole where it fits the directory's memory, and make a request a member where not)."""
    from pegasus_cloudio_testbed.proxy import Fault
    proxy, env = proxied
    files = make_files(tmp_path / "src", 40, size=20_000)  # a bundle too large to come whole with its head
    upload(env, bucket, files, bundle=True)
    with Session(Settings(threads=4, bundle=True), env) as session:
        engine = Engine(session, retry=FAST)

        def read(numbers, job):
            return engine.run([Transfer((s3(bucket, f"run/{files[n].name}"),),
                                        parse_url(f"file://{tmp_path}/{job}/{files[n].name}")) for n in numbers])

        assert all(r.ok for r in read((0, 1, 2, 3), "first"))  # the directory's index loaded
        proxy.reset_counters()
        proxy.set_faults([Fault.status(503, method="GET", path=".pcb")])
        wanted = (5, 6, 30, 31)
        results = read(wanted, "second")
    assert [r.ok for r in results] == [True] * len(wanted), [r.error for r in results]
    assert all((tmp_path / "second" / files[n].name).read_bytes() == files[n].read_bytes() for n in wanted)
    # the throttled first range, then the bundle's two ranges (5-6 and 30-31), not a GET a member
    assert proxy.snapshot()["requests_by_method"] == {"GET": 3}


def test_a_bundle_gone_after_its_plan_sends_its_files_down_the_per_file_path(proxied, bucket, minio, tmp_path):
    proxy, env = proxied
    files = make_files(tmp_path / "src", 40, size=20_000)  # a bundle too large to come whole with its head
    upload(env, bucket, files, bundle=True)
    [bundle], client = keys(minio, bucket)
    wanted = [files[n] for n in (5, 6, 30, 31)]

    def vanish():
        client.delete_object(Bucket=bucket, Key=bundle)
        for f in wanted:
            client.put_object(Bucket=bucket, Key=f"run/{f.name}", Body=f.read_bytes())

    proxy.reset_counters()
    with _VanishingBundles(vanish) as executor, Session(Settings(threads=4, bundle=True), env) as session:
        results = Engine(session, retry=FAST, executor=executor).run(
            [Transfer((s3(bucket, f"run/{f.name}"),), parse_url(f"file://{tmp_path}/dst/{f.name}")) for f in wanted])
    assert [r.ok for r in results] == [True] * 4, [r.error for r in results]
    for f, result in zip(wanted, results):
        assert (tmp_path / "dst" / f.name).read_bytes() == f.read_bytes()
        assert [a.source for a in result.history] == [s3(bucket, f"run/{f.name}")]  # its own read, not the bundle's
    assert proxy.snapshot()["requests_by_method"]["GET"] >= 1 + 1 + 4  # head, the bundle's 404, four plain GETs
