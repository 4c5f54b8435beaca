"""The engine asks the node cache first, writes uploads through it, and fills it from bundles."""

import os
import stat

import pytest

from transfer import Engine, Session, Settings, Transfer, parse_url
from transfer.cache import cache_from_settings


def s3(bucket, key):
    return parse_url(f"s3://test@minio/{bucket}/{key}", site_label="minio")


def engine_run(env, ops, cache_dir, uploads="1", cache_env=None, **settings):
    """``ops`` run by an engine with the node cache at ``cache_dir`` (None: without a cache);
    ``cache_env``: more ``PEGASUS_CLOUDIO_CACHE_*`` settings."""
    cache = None if cache_dir is None else cache_from_settings(
        {"PEGASUS_CLOUDIO_CACHE_DIR": str(cache_dir), "HOME": env["HOME"], "PEGASUS_CLOUDIO_CACHE_UPLOADS": uploads,
         **(cache_env or {})})
    try:
        with Session(Settings(threads=3, **settings), env) as session:
            return Engine(session, cache=cache).run(ops)
    finally:
        if cache is not None:
            cache.close()


def test_second_job_on_the_node_reads_from_the_cache_without_requests(proxied, bucket, tmp_path):
    proxy, env = proxied
    src = tmp_path / "in.dat"
    src.write_bytes(os.urandom(5000))
    cache_dir = tmp_path / "cache"
    [up] = engine_run(env, [Transfer((parse_url(str(src)),), s3(bucket, "in.dat"))], tmp_path / "other-cache")
    assert up.ok
    proxy.reset_counters()
    for job in ("job1", "job2", "job3"):
        [result] = engine_run(env, [Transfer((s3(bucket, "in.dat"),), parse_url(f"file://{tmp_path}/{job}/in.dat"))],
                              cache_dir)
        assert result.ok and (tmp_path / job / "in.dat").read_bytes() == src.read_bytes()
    assert proxy.snapshot()["requests"] == 1  # job1 fetched; job2 and job3 were served by the cache
    assert os.stat(tmp_path / "job2" / "in.dat").st_ino == os.stat(tmp_path / "job3" / "in.dat").st_ino


def test_uploads_write_through_so_a_later_job_needs_no_request(proxied, bucket, tmp_path):
    proxy, env = proxied
    out = tmp_path / "out.dat"
    out.write_bytes(b"produced here")
    cache_dir = tmp_path / "cache"
    assert engine_run(env, [Transfer((parse_url(str(out)),), s3(bucket, "out.dat"))], cache_dir)[0].ok
    proxy.reset_counters()
    [result] = engine_run(env, [Transfer((s3(bucket, "out.dat"),), parse_url(f"file://{tmp_path}/next/out.dat"))],
                          cache_dir)
    assert result.ok and (tmp_path / "next" / "out.dat").read_bytes() == b"produced here"
    assert proxy.snapshot()["requests"] == 0


def test_uploads_skip_the_cache_by_default_without_peers(proxied, bucket, tmp_path):
    """auto: without peer sharing an upload costs no cache entry; the next read asks the store."""
    proxy, env = proxied
    for name in ("plain.dat", "bundled.dat"):
        (tmp_path / name).write_bytes(b"produced here")
    cache_dir = tmp_path / "cache"
    ups = [Transfer((parse_url(str(tmp_path / "plain.dat")),), s3(bucket, "plain.dat"))]
    assert engine_run(env, ups, cache_dir, uploads="auto")[0].ok
    ups = [Transfer((parse_url(str(tmp_path / "bundled.dat")),), s3(bucket, "bundled.dat"))]
    assert engine_run(env, ups, cache_dir, uploads="auto", bundle=True)[0].ok
    cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(cache_dir), "HOME": env["HOME"]})
    try:
        assert list(cache.entries()) == []
    finally:
        cache.close()
    proxy.reset_counters()
    [result] = engine_run(env, [Transfer((s3(bucket, "plain.dat"),), parse_url(f"file://{tmp_path}/next/p.dat"))],
                          cache_dir, uploads="auto")
    assert result.ok and proxy.snapshot()["requests"] == 1


def test_bundle_members_are_cached_under_member_keys_never_under_their_urls(proxied, bucket, tmp_path):
    proxy, env = proxied
    (tmp_path / "src").mkdir()
    for i in range(12):
        (tmp_path / "src" / f"f{i:02d}").write_bytes(os.urandom(300))
    ups = [Transfer((parse_url(f"file://{tmp_path}/src/f{i:02d}"),), s3(bucket, f"run/f{i:02d}")) for i in range(12)]
    assert all(r.ok for r in engine_run(env, ups, tmp_path / "producer-cache", bundle=True))
    cache_dir = tmp_path / "cache"
    for job in ("a", "b"):
        reads = [Transfer((s3(bucket, f"run/f{i:02d}"),), parse_url(f"file://{tmp_path}/{job}/f{i:02d}"))
                 for i in range(6)]
        proxy.reset_counters()
        assert all(r.ok for r in engine_run(env, reads, cache_dir, bundle=True))
        for i in range(6):
            assert (tmp_path / job / f"f{i:02d}").read_bytes() == (tmp_path / "src" / f"f{i:02d}").read_bytes()
    assert proxy.snapshot()["requests"] <= 2  # job b: the directory's index (LIST + head); bytes from the cache
    cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(cache_dir), "HOME": env["HOME"]})
    keys = [e.meta.key for e in cache.entries() if e.meta is not None]
    assert len(keys) == 6 and all("#member=f0" in key and "/.cloudio-bundles/" in key for key in keys)


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask022", "umask077"])
def test_a_download_the_cache_cannot_keep_has_the_mode_of_an_uncached_one(proxied, bucket, tmp_path, umask):
    """A fill the cache declines (here: larger than its cap) reaches the job as the fill's temp
    file, hard-linked into place: it must have the mode the same download writes without the
    cache (0666 less the umask), not the cache's private 0600. One file alone takes the per-file
    path, two the pipelined pass, bundle members their own; all fill through the cache."""
    proxy, env = proxied
    (tmp_path / "src").mkdir()
    names = ("alone.dat", "pair1.dat", "pair2.dat", "member1.dat", "member2.dat")
    for name in names:
        (tmp_path / "src" / name).write_bytes(os.urandom(3000))
    batches = [(names[:1], False), (names[1:3], False), (names[3:], True)]
    for batch, bundle in batches:
        ups = [Transfer((parse_url(str(tmp_path / "src" / n)),), s3(bucket, n)) for n in batch]
        assert all(r.ok for r in engine_run(env, ups, None, bundle=bundle))
    tight = {"PEGASUS_CLOUDIO_CACHE_MAX_BYTES": "1000"}
    old = os.umask(umask)
    try:
        for job, cache_dir in (("plain", None), ("tight", tmp_path / "cache")):
            for batch, bundle in batches:
                reads = [Transfer((s3(bucket, n),), parse_url(f"file://{tmp_path}/{job}/{n}")) for n in batch]
                assert all(r.ok for r in engine_run(env, reads, cache_dir, cache_env=tight, bundle=bundle))
    finally:
        os.umask(old)
    modes = {job: {n: stat.S_IMODE(os.stat(tmp_path / job / n).st_mode) for n in names} for job in ("plain", "tight")}
    assert modes["plain"] == dict.fromkeys(names, 0o666 & ~umask)
    assert modes["tight"] == modes["plain"]
    assert all((tmp_path / "tight" / n).read_bytes() == (tmp_path / "src" / n).read_bytes() for n in names)
    cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path / "cache"), "HOME": env["HOME"]})
    try:
        assert list(cache.entries()) == []  # the cache kept none of them
    finally:
        cache.close()


def test_a_long_lived_cache_gives_each_file_the_umask_of_its_time(proxied, bucket, tmp_path):
    """A library process keeps one node cache open over jobs and sets each job's umask (022,
    then 077): a download the cache declines gets the mode the same download writes without
    the cache under the umask of that moment, not the first job's (0644 under 077, readable
    by all where the job's own files are private)."""
    proxy, env = proxied
    (tmp_path / "src").mkdir()
    for name in ("first.dat", "second.dat"):
        (tmp_path / "src" / name).write_bytes(os.urandom(3000))
        up = Transfer((parse_url(str(tmp_path / "src" / name)),), s3(bucket, name))
        assert all(r.ok for r in engine_run(env, [up], None))
    cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path / "cache"), "HOME": env["HOME"],
                                 "PEGASUS_CLOUDIO_CACHE_MAX_BYTES": "1000"})
    old = os.umask(0o022)
    try:
        for name, umask in (("first.dat", 0o022), ("second.dat", 0o077)):
            os.umask(umask)
            read = Transfer((s3(bucket, name),), parse_url(f"file://{tmp_path}/job/{name}"))
            with Session(Settings(threads=3), env) as session:
                assert all(r.ok for r in Engine(session, cache=cache).run([read]))
            assert stat.S_IMODE(os.stat(tmp_path / "job" / name).st_mode) == 0o666 & ~umask
    finally:
        os.umask(old)
        cache.close()


def test_a_signed_url_leaves_its_query_in_no_cache_file_and_no_log_line(tmp_path, caplog):
    """An HTTP URL's query may be its signature (a pre-signed URL): the cache key keeps two
    queries apart without holding their text, so it is in no metadata file, no ``cache ls``
    line and no warning (here: the entry fails its check and is fetched again)."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "in.dat").write_bytes(b"signed content")
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path / "site")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secret = "X-Amz-Signature=0123456789abcdef0123456789abcdef"
    url = parse_url(f"http://127.0.0.1:{server.server_address[1]}/in.dat?{secret}")
    env = {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull}
    cache_dir = tmp_path / "cache"
    try:
        for job in ("a", "b"):
            [result] = engine_run(env, [Transfer((url,), parse_url(f"file://{tmp_path}/{job}/in.dat"))], cache_dir)
            assert result.ok and (tmp_path / job / "in.dat").read_bytes() == b"signed content"
            [entry] = [p for p in cache_dir.rglob("*") if p.is_file() and len(p.name) == 64]
            st = entry.stat()
            entry.chmod(0o644)
            entry.write_bytes(b"tampered bytes")  # same size and mtime: the next hit re-hashes it,
            os.utime(entry, ns=(st.st_atime_ns, st.st_mtime_ns))  # fails and logs the entry's key
    finally:
        server.shutdown()
        server.server_close()
    assert "fails its SHA-256 check" in caplog.text and "in.dat" in caplog.text
    assert "0123456789abcdef" not in caplog.text
    assert not [p for p in cache_dir.rglob("*") if p.is_file() and b"0123456789abcdef" in p.read_bytes()]


def test_an_upload_in_parts_over_a_cached_name_replaces_the_entry(proxied, bucket, tmp_path):
    """A multipart upload has no version to compare (its ETag is not the content's), so the
    entry of the name is compared by SHA-256: the next job on the node reads what was uploaded
    last, never the bytes an older entry held (docs/cache.md: an upload whose ETag or SHA-256
    differs replaces the entry)."""
    proxy, env = proxied
    cache_dir = tmp_path / "cache"
    parts = dict(multipart_threshold=5 << 20, multipart_part_size=5 << 20)
    for version in (1, 2):
        out = tmp_path / f"out-v{version}.dat"
        out.write_bytes(os.urandom((5 << 20) + 1000))
        assert engine_run(env, [Transfer((parse_url(str(out)),), s3(bucket, "out.dat"))], cache_dir, **parts)[0].ok
        [read] = engine_run(env, [Transfer((s3(bucket, "out.dat"),), parse_url(f"file://{tmp_path}/next{version}/out.dat"))],
                            cache_dir, **parts)
        assert read.ok and (tmp_path / f"next{version}" / "out.dat").read_bytes() == out.read_bytes()


def read_through(env, bucket, key, cache_dir, dest):
    [read] = engine_run(env, [Transfer((s3(bucket, key),), parse_url(f"file://{dest}"))], cache_dir, uploads="0")
    assert read.ok, read.error
    return dest.read_bytes()


@pytest.mark.parametrize("how", ["put", "parts", "bundle", "copy"])
def test_an_upload_without_write_through_drops_the_entry_of_its_name(proxied, bucket, tmp_path, how):
    """With the cache's uploads off, an upload (or copy) over a name this node has cached must
    not leave the old entry: the next job on the node reads the new bytes, never the old."""
    proxy, env = proxied
    cache_dir = tmp_path / "cache"
    settings = dict(multipart_threshold=5 << 20, multipart_part_size=5 << 20) if how == "parts" else {}
    size = (5 << 20) + 1000 if how == "parts" else 3000
    old, new = tmp_path / "old.dat", tmp_path / "new.dat"
    old.write_bytes(os.urandom(size))
    new.write_bytes(os.urandom(size))
    assert engine_run(env, [Transfer((parse_url(str(old)),), s3(bucket, "x.dat"))], tmp_path / "c0")[0].ok
    assert read_through(env, bucket, "x.dat", cache_dir, tmp_path / "r1/x.dat") == old.read_bytes()
    if how == "copy":
        assert engine_run(env, [Transfer((parse_url(str(new)),), s3(bucket, "y.dat"))], tmp_path / "c0")[0].ok
        ops = [Transfer((s3(bucket, "y.dat"),), s3(bucket, "x.dat"))]
    else:
        ops = [Transfer((parse_url(str(new)),), s3(bucket, "x.dat"))]
    [up] = engine_run(env, ops, cache_dir, uploads="0", bundle=how == "bundle", **settings)
    assert up.ok, up.error
    assert read_through(env, bucket, "x.dat", cache_dir, tmp_path / "r2/x.dat") == new.read_bytes()


def test_a_removed_object_is_not_read_back_from_the_node_cache(proxied, bucket, tmp_path):
    """A remove on this node drops the entries of what it deletes, as an upload over a name does:
    before, a read after the remove succeeded with the deleted object's bytes from the entry
    (fsspec: exists() False, cat_file() the old bytes)."""
    from transfer import NotFound, Remove
    proxy, env = proxied
    for name in ("one.dat", "dir/two.dat"):
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_bytes(name.encode())
    ups = [Transfer((parse_url(str(tmp_path / "src" / n)),), s3(bucket, n)) for n in ("one.dat", "dir/two.dat")]
    assert all(r.ok for r in engine_run(env, ups, tmp_path / "other-cache"))
    cache_dir = tmp_path / "cache"

    def read(job):
        return engine_run(env, [Transfer((s3(bucket, n),), parse_url(f"file://{tmp_path}/{job}/{n}"))
                                for n in ("one.dat", "dir/two.dat")], cache_dir)

    assert all(r.ok for r in read("first"))
    removes = [Remove(s3(bucket, "one.dat")), Remove(s3(bucket, "dir/"), recursive=True)]
    assert all(r.ok for r in engine_run(env, removes, cache_dir))
    again = read("second")
    assert [type(r.error) for r in again] == [NotFound, NotFound], [r.error for r in again]
    assert not (tmp_path / "second").exists() or os.listdir(tmp_path / "second") == []
