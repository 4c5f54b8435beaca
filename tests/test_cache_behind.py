"""Write-behind of cache inserts (transfer.cache.behind): queued only while collecting and
within the byte budget; drained entries are real, verified cache entries."""

import hashlib

from transfer.cache import behind, cache_from_settings


def _member(key, data):
    return key, data, hashlib.sha256(data).hexdigest()


def test_offers_are_refused_unless_collecting_and_within_the_budget(tmp_path, monkeypatch):
    cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path / "c"), "HOME": str(tmp_path),
                                 "PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES": "0"})
    assert not behind.offer(cache, [_member("k0", b"x")])  # not collecting: the caller inserts now
    monkeypatch.setattr(behind, "BUDGET_BYTES", 10)
    behind.collect()
    assert behind.offer(cache, [_member("k1", b"12345678")])
    assert not behind.offer(cache, [_member("k2", b"to"), _member("k4", b"o")])  # 8 + 3 > 10: none of them
    assert cache.entries() == []  # nothing inserted before the drain
    assert behind.drain() == 1
    [entry] = cache.entries()
    assert entry.meta.key == "k1" and entry.meta.sha256 == hashlib.sha256(b"12345678").hexdigest()
    assert not behind.offer(cache, [_member("k3", b"x")])  # draining ends collection
    cache.close()


def test_offers_from_many_threads_keep_the_budget_and_lose_nothing(tmp_path, monkeypatch):
    import threading

    cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path / "c"), "HOME": str(tmp_path),
                                 "PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES": "0"})
    monkeypatch.setattr(behind, "BUDGET_BYTES", 100 * 64)
    behind.collect()
    accepted = []

    def offer(thread: int) -> None:
        for n in range(50):
            if behind.offer(cache, [_member(f"t{thread}-{n}", bytes([thread]) * 64)]):
                accepted.append(f"t{thread}-{n}")

    threads = [threading.Thread(target=offer, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(accepted) == 100  # exactly the budget, never more (an unlocked counter let more in)
    assert behind.drain() == 100
    assert sorted(e.meta.key for e in cache.entries()) == sorted(accepted)
    cache.close()


def test_a_drain_keeps_an_entry_made_after_the_offer_and_replaces_one_from_before(tmp_path):
    """The queued bytes are of the object as the job read it. Another job that filled the entry
    after that (the object replaced in the store meanwhile) holds the newer object: the drain
    leaves its entry. An entry of another version that was there before the offer is the stale
    one: the drain replaces it, as an insert made at once does."""
    cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path / "c"), "HOME": str(tmp_path),
                                 "PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES": "0"})
    assert cache.insert_bytes("before", b"older bytes", version="v0")
    behind.collect()
    assert behind.offer(cache, [_member("after", b"job's bytes")], "v1", "download")
    assert behind.offer(cache, [_member("before", b"job's bytes")], "v1", "download")
    assert cache.insert_bytes("after", b"newer bytes", version="v2")  # another job's fill, after the read
    behind.drain()
    newer, replaced = cache.describe("after"), cache.describe("before")
    assert newer is not None and (newer.version, newer.sha256) == ("v2", hashlib.sha256(b"newer bytes").hexdigest())
    assert replaced is not None and (replaced.version, replaced.sha256) == \
        ("v1", hashlib.sha256(b"job's bytes").hexdigest())
    cache.close()


def test_a_drain_joins_offers_in_batches_each_member_with_its_own_version(tmp_path):
    """The small files of a pipelined pass are offered one by one; the drain stores them in
    batches (bounded by a sixteenth of the cap, so a batch is never refused whole where the
    members one by one would fit), each entry with its own offer's version and source."""
    cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path / "c"), "HOME": str(tmp_path),
                                 "PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES": "0",
                                 "PEGASUS_CLOUDIO_CACHE_MAX_BYTES": str(160_000)})
    behind.collect()
    for n in range(100):  # 100 KB in all: more than one batch of at most 10 KB
        assert behind.offer(cache, [_member(f"f{n}", bytes([n]) * 1000)], f"v{n}", "download")
    assert behind.offer(cache, [_member("m", b"member")], "b1")  # another source: a batch of its own
    assert behind.drain() == 101
    metas = {e.meta.key: e.meta for e in cache.entries()}
    assert {k: (m.version, m.source) for k, m in metas.items() if k != "m"} == \
        {f"f{n}": (f"v{n}", "download") for n in range(100)}
    assert (metas["m"].version, metas["m"].source) == ("b1", "bundle")
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.inserts) == (101, 100_000 + len(b"member"), 101)
    cache.close()


def _cache(tmp_path):
    return cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path / "c"), "HOME": str(tmp_path),
                                "PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES": "0"})


def test_a_staged_file_is_written_once_the_job_has_it_and_the_drain_makes_it_the_entry(tmp_path):
    """Write once and link: the job's file is the cache's temp file (read-only), and the drain
    renames that file into the entry, writing no bytes again."""
    import os

    cache = _cache(tmp_path)
    dest = tmp_path / "job" / "in.dat"
    dest.parent.mkdir()
    dest.write_bytes(b"an older file the job had")  # replaced, as a download replaces it
    temp = cache.stage_linked("k", b"job's bytes", str(dest))
    assert temp is not None and os.path.samefile(temp, dest) and dest.read_bytes() == b"job's bytes"
    assert os.stat(dest).st_mode & 0o222 == 0  # read-only, as an entry handed to a job
    behind.collect()
    assert behind.offer(cache, [_member("k", b"job's bytes")], "v1", "download", [temp])
    assert behind.drain() == 1
    [entry] = cache.entries()
    assert (entry.meta.key, entry.meta.version) == ("k", "v1")
    assert os.path.samefile(tmp_path / "c" / "objects" / entry.digest[:2] / entry.digest, dest)
    assert not list((tmp_path / "c").rglob("*.part"))
    assert cache.fetch("k", str(tmp_path / "job" / "again"), _no_download) == (len(b"job's bytes"), True)
    cache.close()


def test_a_staged_file_gone_or_an_existing_key_costs_only_a_write(tmp_path):
    """The temp file is made without the key's lock: a cleaning may take it before the drain,
    and another job may have made the entry meanwhile. Then the drain writes the bytes (or
    keeps the other entry) and leaves no temp file; the job's file is untouched."""
    import os

    cache = _cache(tmp_path)
    (tmp_path / "job").mkdir()
    gone = cache.stage_linked("gone", b"bytes one", str(tmp_path / "job" / "one"))
    taken = cache.stage_linked("taken", b"bytes two", str(tmp_path / "job" / "two"))
    os.unlink(gone)  # what clean_leftovers does to a key with no entry
    assert cache.insert_bytes("taken", b"bytes two", version="v0")  # another job's entry, same object
    behind.collect()
    assert behind.offer(cache, [_member("gone", b"bytes one")], "v1", "download", [gone])
    assert behind.offer(cache, [_member("taken", b"bytes two")], "v0", "download", [taken])
    assert behind.drain() == 2
    metas = {e.meta.key: e.meta for e in cache.entries()}
    assert (metas["gone"].version, metas["taken"].version) == ("v1", "v0")
    assert (tmp_path / "job" / "one").read_bytes() == b"bytes one"
    assert (tmp_path / "job" / "two").read_bytes() == b"bytes two" and os.stat(tmp_path / "job" / "two").st_nlink == 1
    assert not list((tmp_path / "c").rglob("*.part"))
    cache.close()


def test_nothing_is_staged_where_the_cache_links_nothing(tmp_path):
    """PEGASUS_CLOUDIO_CACHE_HARDLINK=0 (jobs that change their inputs) and objects above the
    re-hashed size: the caller writes its file itself, nothing is left in the cache."""
    (tmp_path / "job").mkdir()
    nolink = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path / "c"), "HOME": str(tmp_path),
                                  "PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES": "0", "PEGASUS_CLOUDIO_CACHE_HARDLINK": "0"})
    assert nolink.stage_linked("k", b"x", str(tmp_path / "job" / "a")) is None
    small = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path / "c"), "HOME": str(tmp_path),
                                 "PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES": "0",
                                 "PEGASUS_CLOUDIO_CACHE_VERIFY_BYTES": "4"})
    assert small.stage_linked("k", b"12345", str(tmp_path / "job" / "a")) is None
    assert not (tmp_path / "job" / "a").exists() and not list((tmp_path / "c").rglob("*.part"))
    nolink.close()
    small.close()


def _no_download(sink):
    raise AssertionError("a hit makes no request")


def test_a_staged_file_never_drained_is_a_leftover_gc_removes(tmp_path):
    """A job killed before its inserts leaves its staged files in the cache's ``incoming/`` with
    no lock nor metadata: no reader trusts them, and a cleaning removes those older than the
    grace (the job's links stay); a younger one may still be waiting for its insert, and stays."""
    import os

    from transfer.cache.layout import INCOMING_GRACE_S

    cache = _cache(tmp_path)
    (tmp_path / "job").mkdir()
    old = cache.stage_linked("k", b"bytes", str(tmp_path / "job" / "a"))
    young = cache.stage_linked("y", b"young", str(tmp_path / "job" / "b"))
    assert old is not None and young is not None and not cache.contains("k")
    assert os.path.dirname(old) == str(tmp_path / "c" / "incoming")
    assert not list((tmp_path / "c" / "objects").iterdir())  # a first job makes no shard directory
    then = os.stat(old).st_mtime - INCOMING_GRACE_S - 1
    os.utime(old, (then, then))
    cache.gc()
    assert not os.path.exists(old) and os.path.exists(young)
    assert not list((tmp_path / "c" / "objects").rglob("*.*"))  # nor a lock the cleaning took
    assert (tmp_path / "job" / "a").read_bytes() == b"bytes"
    cache.close()


def test_new_entries_metadata_is_private_whatever_the_umask(tmp_path):
    """A new key's metadata is created exclusively, with no fchmod when the umask leaves 0600
    (022, 077); a umask that takes the owner's write (0277) still gets 0600: the fchmod is made.
    Both insert paths: a staged file renamed into the entry, and bytes written by the drain."""
    import os
    import stat

    (tmp_path / "job").mkdir()
    for n, umask in enumerate((0o022, 0o077, 0o277)):
        cache = _cache(tmp_path / str(n))
        staged = cache.stage_linked("staged", b"staged bytes", str(tmp_path / "job" / f"s{n}"))
        assert staged is not None
        old = os.umask(umask)
        try:
            behind.collect()
            assert behind.offer(cache, [_member("staged", b"staged bytes")], "v1", "download", [staged])
            assert behind.offer(cache, [_member("written", b"written bytes")], "v1", "download")
            assert behind.drain() == 2
        finally:
            os.umask(old)
        metas = sorted((tmp_path / str(n) / "c" / "objects").rglob("*.meta"))
        assert len(metas) == 2
        assert [oct(stat.S_IMODE(os.stat(m).st_mode)) for m in metas] == ["0o600", "0o600"], oct(umask)
        assert {e.meta.key for e in cache.entries()} == {"staged", "written"}
        cache.close()
