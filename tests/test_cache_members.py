"""Batched inserts of bundle members (NodeCache.insert_members): every entry complete and
verified, a process killed half-way leaves nothing a later job would trust, and concurrent
processes inserting the same bundle agree."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from transfer.cache import CacheConfig, NodeCache
from transfer.cache import members as members_module


def config(directory, **changes) -> CacheConfig:
    fields = {"directory": str(directory), "max_bytes": 1 << 30, "min_free_bytes": 0, "fsync": False}
    fields.update(changes)
    return CacheConfig(**fields)


def members(prefix: str, count: int, size: int = 300):
    out = []
    for n in range(count):
        data = hashlib.sha256(f"{prefix}{n}".encode()).digest() * (size // 32 + 1)
        data = data[:size]
        out.append((f"s3://h/b/.cloudio-bundles/x.pcb#member={prefix}{n}", data, hashlib.sha256(data).hexdigest()))
    return out


def leftovers(directory) -> list:
    return [p.name for p in Path(directory).rglob("*") if p.name.endswith(".part")]


def assert_served_right(cache: NodeCache, items, tmp_path) -> int:
    """Every entry the cache holds for ``items`` gives exactly its bytes; the number held."""
    held = 0
    for n, (key, data, _) in enumerate(items):
        if not cache.contains(key):
            continue
        dest = tmp_path / f"out-{n}"

        def never(sink):
            raise AssertionError(f"{key}: a valid entry was expected, the cache downloaded")

        size, hit = cache.fetch(key, str(dest), never)
        assert hit and size == len(data) and dest.read_bytes() == data
        held += 1
    return held


def test_a_batch_stores_every_member_verified_and_keeps_what_is_there(tmp_path):
    cache = NodeCache(config(tmp_path / "c"))
    items = members("a", 20)
    assert cache.insert_members(items[:5]) == [k for k, _, _ in items[:5]]
    before = {k: cache.describe(k).created for k, _, _ in items[:5]}
    assert cache.insert_members(items) == [k for k, _, _ in items]
    assert {k: cache.describe(k).created for k, _, _ in items[:5]} == before  # kept, not rewritten
    for key, data, digest in items:
        meta = cache.describe(key)
        assert meta.size == len(data) and meta.sha256 == digest and meta.source == "bundle"
    assert assert_served_right(cache, items, tmp_path) == 20
    assert leftovers(tmp_path / "c") == []
    assert cache.verify() == []
    cache.close()
    assert cache.stats().inserts == 20


def test_a_batch_over_the_cap_or_the_free_space_floor_stores_nothing(tmp_path):
    items = members("b", 4, size=1000)
    capped = NodeCache(config(tmp_path / "c1", max_bytes=3000))
    assert capped.insert_members(items) == []
    floor = NodeCache(config(tmp_path / "c2", min_free_bytes=1 << 62))
    assert floor.insert_members(items) == []
    assert capped.entries() == [] and floor.entries() == []


def test_an_entry_whose_bytes_changed_is_replaced_by_the_batch(tmp_path):
    cache = NodeCache(config(tmp_path / "c"))
    [(key, data, digest)] = members("c", 1)
    other = b"y" * 300
    assert cache.insert_members([(key, other, hashlib.sha256(other).hexdigest())]) == [key]
    assert cache.insert_members([(key, data, digest)]) == [key]
    assert cache.describe(key).sha256 == digest
    assert assert_served_right(cache, [(key, data, digest)], tmp_path) == 1


@pytest.mark.parametrize("hardlink", [True, False])
def test_a_damaged_older_entry_is_not_handed_to_the_job(tmp_path, hardlink):
    """An existing entry passes insert_members' cheap check (size and time) even if its bytes
    rotted; the job's destination must get the bytes the caller verified, not the entry's."""
    cache = NodeCache(config(tmp_path / "c", hardlink=hardlink))
    [(key, data, digest)] = members("d", 1)
    assert cache.insert_members([(key, data, digest)]) == [key]
    entry = cache._layout.paths(key).data
    stat = os.stat(entry)
    os.chmod(entry, 0o644)
    with open(entry, "r+b") as fh:  # same size, then the same times: only a re-hash can tell
        fh.write(b"Z" * 16)
    os.utime(entry, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.chmod(entry, stat.st_mode & 0o777)
    dest = tmp_path / "job" / "member"
    dest.parent.mkdir()
    assert cache.insert_members([(key, data, digest)], dests=[[str(dest)]]) == [key]
    assert dest.read_bytes() == data
    assert cache.verify() != []  # the damage is still there for a hit's re-hash to find


@pytest.mark.parametrize("stop_after", ["write_meta_in_place", "open_temp"])
def test_an_interrupted_member_leaves_no_entry_and_the_next_batch_completes(tmp_path, monkeypatch, stop_after):
    cache = NodeCache(config(tmp_path / "c"))
    items = members("d", 6)
    calls = []

    if stop_after == "write_meta_in_place":
        real = members_module.write_meta_in_place

        def interrupted(paths, meta, **kwargs):
            real(paths, meta, **kwargs)  # the metadata is complete, the data not yet renamed: a kill now
            calls.append(meta.key)
            if len(calls) == 3:
                raise KeyboardInterrupt

        monkeypatch.setattr(members_module, "write_meta_in_place", interrupted)
    else:
        real_open = members_module.KeyPaths.open_temp

        def interrupted_open(self):
            fd, temp = real_open(self)
            calls.append(temp)
            if len(calls) == 3:
                os.write(fd, b"partial")
                os.close(fd)
                raise KeyboardInterrupt
            return fd, temp

        monkeypatch.setattr(members_module.KeyPaths, "open_temp", interrupted_open)
    with pytest.raises(KeyboardInterrupt):
        cache.insert_members(items)
    monkeypatch.undo()
    assert [cache.contains(k) for k, _, _ in items] == [True, True, False, False, False, False]
    assert assert_served_right(cache, items, tmp_path) == 2
    assert cache.insert_members(items) == [k for k, _, _ in items]
    assert assert_served_right(cache, items, tmp_path) == 6
    assert leftovers(tmp_path / "c") == []


def test_a_killed_process_never_leaves_an_entry_a_later_job_trusts_wrongly(tmp_path):
    """SIGKILL at an arbitrary point of a long run of batches: whatever is left is either a
    complete entry with the right bytes or no entry; the next batch fills the rest."""
    directory = tmp_path / "c"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from test_cache_members import config, members
        from transfer.cache import NodeCache
        cache = NodeCache(config({str(directory)!r}))
        round = 0
        while True:
            print(round, flush=True)  # before the batch: the parent knows what was attempted
            cache.insert_members(members(f"r{{round}}-", 20))
            round += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        while int(proc.stdout.readline()) < 8:  # a condition, not a sleep: well into the run
            pass
    finally:
        proc.send_signal(signal.SIGKILL)
        rest = proc.communicate()[0].split()
    last = int(rest[-1]) if rest else 8
    attempted = [item for round in range(last + 1) for item in members(f"r{round}-", 20)]
    cache = NodeCache(config(directory))
    assert assert_served_right(cache, attempted, tmp_path) >= 8 * 20
    assert cache.insert_members(attempted) == [k for k, _, _ in attempted]
    assert assert_served_right(cache, attempted, tmp_path) == len(attempted)
    assert cache.verify() == []


def test_concurrent_processes_inserting_one_bundle_agree(tmp_path):
    directory = tmp_path / "c"
    NodeCache(config(directory))
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from test_cache_members import config, members
        from transfer.cache import NodeCache
        sys.stdin.readline()  # all start together
        cache = NodeCache(config({str(directory)!r}))
        for _ in range(3):
            assert len(cache.insert_members(members("same", 60))) == 60
        cache.close()
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, text=True) for _ in range(4)]
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    assert [proc.wait(timeout=120) for proc in procs] == [0, 0, 0, 0]
    cache = NodeCache(config(directory))
    items = members("same", 60)
    assert assert_served_right(cache, items, tmp_path) == 60
    assert len(cache.entries()) == 60
    assert leftovers(directory) == []
    assert cache.stats().inserts == 60  # one process stored each; the others found it there


def test_a_reservation_a_killed_process_leaves_does_not_starve_later_fills(tmp_path):
    """A process SIGKILLed between a batch's reservation under the cap and its entries (here
    while it waits on a member's lock, which this test holds through a pin) leaves its bytes
    counted in stats.json. The next batch the count leaves no room for recounts the disk and
    is stored; the count then is what the disk holds."""
    import time

    directory = tmp_path / "c"
    cap = 1 << 20
    dead = members("dead-", 3, size=300_000)  # 900 KB: over a slack, so reserved in the shared file
    live = members("live-", 2, size=300_000)  # fits the cap only once the dead reservation is gone
    cache = NodeCache(config(directory, max_bytes=cap))
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from test_cache_members import config, members
        from transfer.cache import NodeCache
        NodeCache(config({str(directory)!r}, max_bytes={cap})).insert_members(members("dead-", 3, size=300_000))
    """)
    with cache.pin(dead[0][0]):  # the child's first member waits for this (shared) lock
        proc = subprocess.Popen([sys.executable, "-c", script])
        try:
            deadline = time.monotonic() + 60
            while cache.stats().bytes < len(dead) * 300_000:  # a condition: the reservation is counted
                assert proc.poll() is None and time.monotonic() < deadline, "the child never reserved"
                time.sleep(0.02)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    later = NodeCache(config(directory, max_bytes=cap))
    assert later.insert_members(live) == [k for k, _, _ in live]
    assert assert_served_right(later, live, tmp_path) == len(live)
    later.close()
    assert NodeCache(config(directory, max_bytes=cap)).stats().bytes == len(live) * 300_000
