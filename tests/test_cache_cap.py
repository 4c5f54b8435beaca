"""The node cache's size cap under many processes filling it at once (issue 39, item 5): the
usage stays near the cap while they fill, and under it once they are done."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from transfer import lean
from transfer.cache import CacheConfig, NodeCache

KiB, MiB = 1 << 10, 1 << 20
JOBS, OBJECTS, SIZE = 32, 8, 512 * KiB
FILLER = textwrap.dedent("""
    import os, sys
    from transfer.backends.base import ObjectInfo
    from transfer.cache import CacheConfig, NodeCache
    from transfer.urls import parse_url

    config, job, count, size = eval(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sys.stdin.readline()  # every filler starts at once
    with NodeCache(CacheConfig(**config)) as cache:
        for n in range(count):
            key = f"s3://b/{job}/{n}"
            body = bytes([n]) * size

            def download(sink, key=key, body=body):
                sink.write(body)
                return ObjectInfo(url=parse_url(key), size=len(body), version=None)

            assert cache.fetch(key, os.path.join(sys.argv[5], f"{job}-{n}"), download) == (size, False)
    """)


def entry_bytes(root: Path) -> int:
    """Bytes of the entries (data files) under the cache ``root`` right now."""
    total = 0
    for shard in (root / "objects").glob("??"):
        for entry in os.scandir(shard):
            if len(entry.name) == 64:
                try:
                    total += entry.stat().st_size
                except FileNotFoundError:
                    pass  # evicted while listed
    return total


def test_32_processes_filling_at_once_keep_the_cache_near_its_cap_and_end_under_it(tmp_path):
    cfg = CacheConfig(directory=str(tmp_path / "cache"), max_bytes=16 * MiB, min_free_bytes=0, fsync=False)
    NodeCache(cfg).close()
    (tmp_path / "jobs").mkdir()
    fillers = [subprocess.Popen([sys.executable, "-c", FILLER, repr(lean.asdict(cfg)), f"j{n}", str(OBJECTS),
                                 str(SIZE), str(tmp_path / "jobs")], stdin=subprocess.PIPE, text=True)
               for n in range(JOBS)]
    peak, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], entry_bytes(tmp_path / "cache"))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for filler in fillers:
            filler.stdin.write("go\n")
            filler.stdin.close()
        assert [filler.wait(timeout=300) for filler in fillers] == [0] * JOBS
    finally:
        done.set()
        watcher.join()
    assert len(os.listdir(tmp_path / "jobs")) == JOBS * OBJECTS  # every job got every file
    end = entry_bytes(tmp_path / "cache")
    assert 0 < end <= cfg.max_bytes, end
    # one object in flight per process may pass the check at once: the cap plus that, no more
    assert peak[0] <= cfg.max_bytes + JOBS * SIZE, peak[0]
    # the shared count agrees with the disk, but for entries reserved while an eviction pass
    # scanned and put on disk after it (one in flight per process at most), which the next pass counts
    assert abs(NodeCache(cfg).stats().bytes - end) <= JOBS * SIZE
    NodeCache(cfg).gc()
    assert NodeCache(cfg).stats().bytes == entry_bytes(tmp_path / "cache")
