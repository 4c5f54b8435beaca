"""A hostile-object corpus for bundles: isolation, precedence and the node cache (real MinIO;
isolation and listing on a real Azurite too).

Every case is staged the way jobs stage: an engine per job, bundling and the node cache on or
off, hand-made bundles and plain objects put straight into the bucket (container) by the
store's own SDK."""

from __future__ import annotations

import hashlib
import io
import itertools
import os

import boto3
import pytest

from transfer import Engine, RetryPolicy, Session, Settings, Transfer, parse_url
from transfer.bundles.format import pack
from transfer.cache import cache_from_settings
from transfer.client import Client
from transfer.errors import NotFound

FAST = RetryPolicy(max_attempts=2, base_delay=0.001, max_delay=0.01)
BUNDLES = "D/.cloudio-bundles"


def client(minio):
    return boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                        aws_secret_access_key=minio.secret_key, region_name="us-east-1")


def bundle_bytes(members):
    out = io.BytesIO()
    pack(members, out)
    return out.getvalue()


@pytest.fixture(params=["s3", "azure"])
def store(request):
    """(env, root URL, site label, ``put(key, data)``) of a new, empty bucket on MinIO or
    container on Azurite; ``put`` stores by the store's own SDK."""
    if request.param == "s3":
        bucket = request.getfixturevalue("bucket")
        s3 = client(request.getfixturevalue("minio"))
        return (request.getfixturevalue("s3_env"), f"s3://test@minio/{bucket}", "minio",
                lambda key, data: s3.put_object(Bucket=bucket, Key=key, Body=data))
    env, root = request.getfixturevalue("store_azure")
    sdk = request.getfixturevalue("azure_sdk")
    return env, root, None, lambda key, data: sdk.upload_blob(key, data)


def stage(env, bucket, names, dest, **kwargs):
    """One job: stage ``D/<name>`` of MinIO's ``bucket`` for each name into ``dest`` (`stage_at`)."""
    return stage_at(env, f"s3://test@minio/{bucket}", names, dest, site_label="minio", **kwargs)


def stage_at(env, root, names, dest, *, bundle, site_label=None, cache_dir=None, threads=4):
    """One job: stage ``ROOT/D/<name>`` for each name into ``dest``; returns the results."""
    cache = None
    if cache_dir is not None:
        cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(cache_dir), "HOME": env["HOME"]}, strict=True)
    try:
        with Session(Settings(threads=threads, bundle=bundle), env) as session:
            return Engine(session, retry=FAST, cache=cache).run(
                [Transfer((parse_url(f"{root}/D/{n}", site_label=site_label),),
                          parse_url(f"file://{dest}/{n}")) for n in names])
    finally:
        if cache is not None:
            cache.close()


# --------------------------------------------------------------------------- isolation


@pytest.mark.parametrize("bundling", [True, False])
@pytest.mark.parametrize("damage", ["truncated", "hostile-name", "bad-magic", "lying-member"])
def test_one_bad_bundle_affects_only_its_own_members(store, tmp_path, bundling, damage):
    env, root, site, put = store
    put(f"{BUNDLES}/001-good.pcb", bundle_bytes([("m1", b"good one")]))
    bad = bundle_bytes([("m2", b"in the bad bundle"), ("m3", b"also")])
    bad = {"truncated": bad[:-6],
           "hostile-name": bad.replace(b'"m2"', b'"/x"'),
           "bad-magic": b"JUNK" + bad[4:],
           "lying-member": bad[:-4] + b"EVIL"}[damage]
    put(f"{BUNDLES}/002-bad.pcb", bad)
    put("D/plain", b"plain object")
    results = stage_at(env, root, ["m1", "plain", "missing"], tmp_path / "job", bundle=bundling, site_label=site)
    assert results[0].ok, results[0].error
    assert (tmp_path / "job" / "m1").read_bytes() == b"good one"
    assert results[1].ok and (tmp_path / "job" / "plain").read_bytes() == b"plain object"
    missing = results[2]
    assert not missing.ok and isinstance(missing.error, NotFound), missing.error
    assert f"{root}/D/missing" in str(missing.error)
    if damage != "lying-member":  # that bundle's index is fine: it is searched, so no note
        assert "002-bad.pcb" in str(missing.error)
    results = stage_at(env, root, ["m3"], tmp_path / "job2", bundle=bundling, site_label=site)  # the damaged one's
    assert not results[0].ok and f"{root}/D/m3" in str(results[0].error)
    assert "002-bad.pcb" in str(results[0].error)
    assert sorted(os.listdir(tmp_path / "job")) == ["m1", "plain"]
    assert not (tmp_path / "job2").exists() or os.listdir(tmp_path / "job2") == []


def test_listing_from_a_name_finds_bundle_members_as_files(store):
    env, root, _, put = store
    put(f"{BUNDLES}/001.pcb", bundle_bytes([("m1", b"one"), ("m2", b"two!")]))
    put("D/plain", b"plain object")
    with Client(env=env) as listing:
        assert [(e.name, e.size, e.is_dir) for e in listing.list(f"{root}/D")] == [
            ("m1", 3, False), ("m2", 4, False), ("plain", 12, False)]
        assert [(e.url, e.is_dir) for e in listing.list(root)] == [(f"{root}/D", True)]
        assert listing.info(f"{root}/D/m2").size == 4 and listing.info(f"{root}/D").is_dir
        assert sorted(e.url for e in listing.find(root)) == [f"{root}/D/m1", f"{root}/D/m2", f"{root}/D/plain"]
        with pytest.raises(NotFound, match=f"{root}/D/m9"):
            listing.info(f"{root}/D/m9")


def test_a_bad_member_fails_alone_in_its_bundle(s3_env, bucket, minio, tmp_path):
    blob = bytearray(bundle_bytes([("a", b"A" * 100), ("b", b"B" * 100), ("c", b"C" * 100)]))
    blob[-150] ^= 0xFF  # inside member b
    client(minio).put_object(Bucket=bucket, Key=f"{BUNDLES}/x.pcb", Body=bytes(blob))
    results = stage(s3_env, bucket, ["a", "b", "c"], tmp_path / "job", bundle=True)
    assert [r.ok for r in results] == [True, False, True]
    assert "x.pcb" in str(results[1].error) and f"{bucket}/D/b" in str(results[1].error)
    assert sorted(os.listdir(tmp_path / "job")) == ["a", "c"]


@pytest.mark.parametrize("body, why", [(b"", "the bundle is empty"),
                                       (b"PCB", "the bundle is 3 bytes, shorter than its 16-byte preamble")])
def test_a_bundle_shorter_than_its_preamble_is_set_aside_saying_so(s3_env, bucket, minio, tmp_path, caplog,
                                                                   body, why):
    """A 0-byte .pcb (an interrupted upload, a placeholder a tool made) was set aside as "HTTP
    200": the ranged read of its first bytes asked for none. The warning and the error of a
    lookup that finds nothing else say what is wrong, and name the bundle."""
    s3 = client(minio)
    s3.put_object(Bucket=bucket, Key=f"{BUNDLES}/001-good.pcb", Body=bundle_bytes([("m1", b"good one")]))
    s3.put_object(Bucket=bucket, Key=f"{BUNDLES}/002-short.pcb", Body=body)
    results = stage(s3_env, bucket, ["m1", "missing"], tmp_path / "job", bundle=True)
    assert results[0].ok and (tmp_path / "job" / "m1").read_bytes() == b"good one"
    error = str(results[1].error)
    assert isinstance(results[1].error, NotFound) and f"{bucket}/D/missing" in error
    assert f"bundle s3://test@minio/{bucket}/{BUNDLES}/002-short.pcb in its directory could not be read: {why}" \
        in error, error
    [warning] = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert f"{BUNDLES}/002-short.pcb set aside: {why}" in warning, warning


# --------------------------------------------------------------------------- precedence


@pytest.fixture
def poisoned(minio, bucket):
    """A bundle in D/ holding y, x and sub/z, next to real plain objects D/x and D/sub/z."""
    s3 = client(minio)
    s3.put_object(Bucket=bucket, Key=f"{BUNDLES}/001.pcb",
                  Body=bundle_bytes([("y", b"member y"), ("x", b"member x, NOT the object"),
                                     ("sub/z", b"member z, NOT the object")]))
    s3.put_object(Bucket=bucket, Key="D/x", Body=b"the real x")
    s3.put_object(Bucket=bucket, Key="D/sub/z", Body=b"the real z")
    return bucket


@pytest.mark.parametrize("first_bundling, second_bundling, cached",
                         list(itertools.product([True, False], [True, False], [True, False])))
def test_plain_objects_win_and_the_cache_never_changes_what_a_read_returns(
        s3_env, poisoned, tmp_path, first_bundling, second_bundling, cached):
    cache_dir = tmp_path / "cache" if cached else None
    [first] = stage(s3_env, poisoned, ["y"], tmp_path / "job1", bundle=first_bundling, cache_dir=cache_dir)
    assert first.ok and (tmp_path / "job1" / "y").read_bytes() == b"member y"
    results = stage(s3_env, poisoned, ["x", "sub/z", "y"], tmp_path / "job2", bundle=second_bundling,
                    cache_dir=cache_dir)
    assert all(r.ok for r in results), [r.error for r in results]
    assert (tmp_path / "job2" / "x").read_bytes() == b"the real x"
    assert (tmp_path / "job2" / "sub" / "z").read_bytes() == b"the real z"
    assert (tmp_path / "job2" / "y").read_bytes() == b"member y"


def test_the_conflict_is_reported_once_per_directory(s3_env, poisoned, tmp_path, caplog):
    stage(s3_env, poisoned, ["x", "y"], tmp_path / "job", bundle=True)
    conflicts = [r for r in caplog.records if "share a name with a bundle member" in r.getMessage()]
    assert len(conflicts) == 1 and "plain object is served" in conflicts[0].getMessage()


# --------------------------------------------------------------------------- transparent reads


def test_a_consumer_without_bundling_lists_each_directory_once(proxied, bucket, minio, tmp_path):
    proxy, env = proxied
    names = [f"f{i:04d}" for i in range(400)]
    members = [(n, hashlib.sha256(n.encode()).digest() * 4) for n in names]
    for part in range(4):
        client(minio).put_object(Bucket=bucket, Key=f"{BUNDLES}/{part:03d}.pcb",
                                 Body=bundle_bytes(members[part::4]))
    proxy.reset_counters()
    results = stage(env, bucket, names, tmp_path / "job", bundle=False, threads=8)
    assert all(r.ok for r in results)
    assert (tmp_path / "job" / "f0123").read_bytes() == members[123][1]
    counts = proxy.snapshot()["requests_by_method"]
    lists = proxy.snapshot()["requests"] - counts.get("HEAD", 0)
    # at most one 404 per worker before the index is known, one LIST, one head GET per bundle
    assert lists <= 8 + 1 + 4, counts


# --------------------------------------------------------------------------- limits


def test_the_index_cap_is_a_clear_error(s3_env, bucket, minio):
    from transfer.bundles.directory import BundleDirectory
    from transfer.bundles.format import BundleFormatError, parse_index

    blob = bundle_bytes([(f"m{i}", b"") for i in range(5)])
    with pytest.raises(BundleFormatError, match="more than 4 members"):
        parse_index(blob, len(blob), max_members=4)
    s3 = client(minio)
    s3.put_object(Bucket=bucket, Key=f"{BUNDLES}/001.pcb", Body=blob)
    for name in ("p1", "p2"):
        s3.put_object(Bucket=bucket, Key=f"D/{name}", Body=b"plain")
    directory = parse_url(f"s3://test@minio/{bucket}/D", site_label="minio")
    with Session(Settings(), s3_env) as session:
        backend = session.backend(directory)
        assert BundleDirectory.load(backend, directory, max_entries=7).lookup("m3") is not None
        with pytest.raises(BundleFormatError, match=r"7 objects and bundle members, more than the bundle index limit of 6"):
            BundleDirectory.load(backend, directory, max_entries=6)


def test_a_slow_directory_listing_holds_up_no_other_directory(proxied, bucket, minio, tmp_path):
    proxy, env = proxied
    from pegasus_cloudio_testbed.proxy import Fault

    s3 = client(minio)
    for directory in ("slowdir", "fastdir"):
        s3.put_object(Bucket=bucket, Key=f"{directory}/.cloudio-bundles/001.pcb",
                      Body=bundle_bytes([("x", f"{directory} member".encode())]))
    # the slow directory's listing starts first (the fast one's first GET is held back a second)
    proxy.set_faults([Fault.stall(4, method="GET", path="prefix=slowdir", times=1),
                      Fault.stall(1, method="GET", path="fastdir/x", times=1)])
    with Session(Settings(threads=2), env) as session:
        results = Engine(session, retry=FAST).run(
            [Transfer((parse_url(f"s3://test@minio/{bucket}/{d}/x", site_label="minio"),),
                      parse_url(f"file://{tmp_path}/{d}/x")) for d in ("slowdir", "fastdir")])
    assert results[1].ok and (tmp_path / "fastdir" / "x").read_bytes() == b"fastdir member"
    assert proxy.snapshot()["faults_triggered"] == 2

    def finished_at(result):
        last = result.history[-1]
        return last.start + last.seconds

    # no lock is held across one directory's listing: the other directory is not queued behind it
    assert finished_at(results[1]) < finished_at(results[0])


def test_files_the_node_cache_holds_are_not_read_through_bundles(proxied, bucket, tmp_path):
    proxy, env = proxied
    src = tmp_path / "src"
    src.mkdir()
    for i in range(10):
        (src / f"f{i}").write_bytes(os.urandom(100_000))
    cache_dir = tmp_path / "cache"

    def produce(names, cache_on):
        cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(cache_dir), "HOME": env["HOME"],
                                     "PEGASUS_CLOUDIO_CACHE_UPLOADS": "1"}) \
            if cache_on else None
        with Session(Settings(threads=4, bundle=True), env) as session:
            results = Engine(session, retry=FAST, cache=cache).run(
                [Transfer((parse_url(str(src / n)),), parse_url(f"s3://test@minio/{bucket}/D/{n}", site_label="minio"))
                 for n in names])
        if cache is not None:
            cache.close()
        assert all(r.ok for r in results)

    produce([f"f{i}" for i in range(1, 10)], cache_on=True)  # one bundle, written through the cache
    produce(["f0"], cache_on=False)  # too few to bundle: a plain object, not cached
    proxy.reset_counters()
    results = stage(env, bucket, [f"f{i}" for i in range(10)], tmp_path / "job", bundle=True, cache_dir=cache_dir)
    assert all(r.ok for r in results)
    for i in range(10):
        assert (tmp_path / "job" / f"f{i}").read_bytes() == (src / f"f{i}").read_bytes()
    # f0's GET alone (one file to read: too few to list the directory): the nine cached files cost nothing
    assert proxy.snapshot()["requests_by_method"] == {"GET": 1}, proxy.snapshot()["requests_by_method"]


def test_a_directorys_small_bundles_are_read_in_one_pipelined_pass(proxied, bucket, minio):
    """The heads of small bundles (each all of its bundle) are pipelined GETs on at most
    ``connections`` connections, one per bundle; none is left to the one-request path, and
    every member reads back as packed. One small bundle alone takes the one-request path."""
    from transfer.bundles.directory import BundleDirectory

    proxy, env = proxied
    s3 = client(minio)
    packed = {f"{b:03d}": {f"m{b}_{i}": os.urandom(50 + i) for i in range(3)} for b in range(12)}
    for name, members in packed.items():
        s3.put_object(Bucket=bucket, Key=f"{BUNDLES}/{name}.pcb", Body=bundle_bytes(list(members.items())))
    s3.put_object(Bucket=bucket, Key="E/.cloudio-bundles/001.pcb", Body=bundle_bytes([("alone", b"one")]))
    asked = []

    def map_fn(function, items):
        items = list(items)
        asked.extend(info.url.path for info in items)
        return map(function, items)

    with Session(Settings(threads=3), env) as session:
        directory = parse_url(f"s3://test@minio/{bucket}/D", site_label="minio")
        proxy.reset_counters()
        loaded = BundleDirectory.load(session.backend(directory), directory, map_fn, connections=5)
        counts = proxy.snapshot()
        assert asked == []
        assert counts["requests_by_method"] == {"GET": 13} and counts["connections"] <= 5  # a LIST and 12 heads
        for members in packed.values():
            for member_name, data in members.items():
                bundle, member = loaded.lookup(member_name)
                start = bundle.index.data_start + member.offset
                assert bundle.head[start:start + member.size] == data
        single = parse_url(f"s3://test@minio/{bucket}/E", site_label="minio")
        assert BundleDirectory.load(session.backend(single), single, map_fn, connections=5).lookup("alone") is not None
        assert asked == [f"/{bucket}/E/.cloudio-bundles/001.pcb"]
