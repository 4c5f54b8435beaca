"""The node cache: single flight across real processes, crashes, eviction, full disks,
permissions, materialisation modes and counters, against MinIO behind a counting proxy."""

from __future__ import annotations

import contextlib

import grp
import hashlib
import io
import json
import os
import pwd
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from pegasus_cloudio_testbed.proxy import Fault, TcpProxy
from transfer import Session, lean, parse_url
from transfer.backends.base import ObjectInfo
from transfer.cache import CacheConfig, NodeCache, cache_from_settings
from transfer.errors import ChecksumMismatch, ConfigError, NotFound

MiB = 1 << 20
JOBS = [sys.executable, "-m", "pegasus_cloudio_bench.cache_jobs"]


# --------------------------------------------------------------------------- helpers


def config(directory, **changes) -> CacheConfig:
    fields = {"directory": str(directory), "max_bytes": 1 << 30, "min_free_bytes": 0, "fsync": False}
    fields.update(changes)
    return CacheConfig(**fields)


def sha(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest() if hasattr(hashlib, "file_digest") \
            else hashlib.sha256(fh.read()).hexdigest()


def gets(proxy: TcpProxy) -> int:
    return proxy.requests_by_method.get("GET", 0)


def parts(directory) -> list:
    """Temp files anywhere under ``directory`` (cache temp files and AtomicFile temps)."""
    return [str(p) for p in Path(directory).rglob("*") if p.name.endswith((".part", ".link"))]


class Store:
    """Objects in a fresh bucket; downloads go through ``proxy`` (which counts them)."""

    def __init__(self, minio, bucket, tmp_path, proxy: TcpProxy) -> None:
        self.bucket, self.proxy = bucket, proxy
        creds = minio.write_pegasus_credentials(tmp_path / f"creds-{proxy.port}.conf", site="minio",
                                                user="test", endpoint=proxy.url())
        self.env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path),
                    "PEGASUS_CLOUDIO_CONFIG": os.devnull, "PATH": os.environ.get("PATH", "")}
        self.session = Session(env=self.env)
        self._tmp = tmp_path

    def url(self, name: str) -> str:
        return f"s3://test@minio/{self.bucket}/{name}"

    def put(self, name: str, data: bytes) -> str:
        src = self._tmp / f"upload-{uuid.uuid4().hex}"
        src.write_bytes(data)
        url = parse_url(self.url(name), env=self.env)
        self.session.backend(url).put(str(src), url)
        src.unlink()
        self.proxy.reset_counters()
        return self.url(name)

    def download(self, name: str):
        url = parse_url(self.url(name), env=self.env)
        return lambda sink: self.session.backend(url).get(url, sink)


@pytest.fixture
def store(minio, bucket, tmp_path):
    with TcpProxy((minio.host, minio.port)) as proxy:
        found = Store(minio, bucket, tmp_path, proxy)
        yield found
        found.session.close()


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A real small filesystem, mounted for the test (tests run as root)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def run_jobs(plan: dict, timeout: float = 300) -> dict:
    done = subprocess.run(JOBS, input=json.dumps(plan), capture_output=True, text=True, timeout=timeout)
    assert done.stdout, done.stderr[-2000:]
    result = json.loads(done.stdout)
    errors = [job["error"] for job in result["jobs"] if job["error"]]
    assert not errors, errors[:3]
    return result


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "cache", *args],
                          capture_output=True, text=True, timeout=60)


def blocked_on_flock(pid: int) -> bool:
    """True when ``pid`` waits for an flock (a ``->`` line of /proc/locks)."""
    with open("/proc/locks", encoding="ascii") as fh:
        # "1: -> FLOCK  ADVISORY  READ 1234 fd:00:5678 0 EOF"
        return any(line.split()[1:3] == ["->", "FLOCK"] and line.split()[5] == str(pid) for line in fh)


def wait_for(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# --------------------------------------------------------------------------- single flight


def test_80_processes_reading_one_large_object_cause_one_get(minio, bucket, tmp_path):
    data = os.urandom(32 * MiB)
    digest = hashlib.sha256(data).hexdigest()
    # A 50 ms one-way delay keeps the one download in flight while the other 79 arrive.
    with TcpProxy((minio.host, minio.port), delay_ms=50) as proxy:
        objects = Store(minio, bucket, tmp_path, proxy)
        url = objects.put("big.bin", data)
        cfg = config(tmp_path / "cache")
        jobs = [[{"url": url, "key": url, "dest": str(tmp_path / "jobs" / f"j{i}" / "big.bin")}]
                for i in range(80)]
        result = run_jobs({"env": objects.env, "cache": lean.asdict(cfg), "jobs": jobs,
                           "parallel": 80})
        assert gets(proxy) == 1
        objects.session.close()
    fetches = [job["fetches"][0] for job in result["jobs"]]
    assert [f["hit"] for f in fetches].count(False) == 1
    assert all(f["size"] == len(data) for f in fetches)
    entry_inode = None
    for job in jobs:
        dest = job[0]["dest"]
        assert os.path.getsize(dest) == len(data) and sha(dest) == digest
        entry_inode = entry_inode or os.stat(dest).st_ino
        assert os.stat(dest).st_ino == entry_inode  # hard links of the one entry
    stats = NodeCache(cfg).stats()
    assert (stats.hits, stats.misses, stats.requests_saved) == (79, 1, 79)
    assert stats.bytes_saved == 79 * len(data) and (stats.entries, stats.bytes) == (1, len(data))
    assert parts(tmp_path) == []


def test_threads_of_one_process_share_one_download(store, tmp_path):
    data = os.urandom(4 * MiB)
    store.put("t.bin", data)
    cache = NodeCache(config(tmp_path / "cache"))
    outcomes = []

    def worker(i: int) -> None:
        outcomes.append(cache.fetch("t", str(tmp_path / f"t{i}"), store.download("t.bin")))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert gets(store.proxy) == 1
    assert sorted(hit for _, hit in outcomes) == [False] + [True] * 15
    assert all((tmp_path / f"t{i}").read_bytes() == data for i in range(16))


# --------------------------------------------------------------------------- crashes and errors


def test_kill_9_during_download_leaves_nothing_and_a_waiter_takes_over(store, tmp_path):
    data = os.urandom(8 * MiB)
    url = store.put("crash.bin", data)
    cfg = config(tmp_path / "cache")
    store.proxy.set_faults([Fault.stall(120, after_bytes=2 * MiB, method="GET")])

    def job(name: str) -> subprocess.Popen:
        plan = {"env": store.env, "cache": lean.asdict(cfg), "fork": False,
                "jobs": [[{"url": url, "key": url, "dest": str(tmp_path / name / "crash.bin")}]]}
        proc = subprocess.Popen(JOBS, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        proc.stdin.write(json.dumps(plan))
        proc.stdin.close()
        return proc

    victim = job("victim")
    wait_for(lambda: any(os.path.getsize(p) > 0 for p in parts(tmp_path / "cache")), "a partial download")
    waiter = job("waiter")
    wait_for(lambda: blocked_on_flock(waiter.pid), "the second job to wait for the first")
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    out = waiter.stdout.read()
    assert waiter.wait(timeout=120) == 0
    assert json.loads(out)["jobs"][0]["error"] is None
    assert (tmp_path / "waiter" / "crash.bin").read_bytes() == data
    assert not (tmp_path / "victim").exists()  # nothing under the job's name, no temp file
    assert parts(tmp_path / "cache") == []      # the waiter removed the victim's leftovers
    assert gets(store.proxy) == 2
    third = NodeCache(cfg).fetch(url, str(tmp_path / "third"), store.download("crash.bin"))
    assert third == (len(data), True)


def test_download_errors_propagate_unchanged_and_leave_nothing(store, tmp_path):
    cache = NodeCache(config(tmp_path / "cache"))
    with pytest.raises(NotFound):
        cache.fetch("absent", str(tmp_path / "job" / "absent"), store.download("absent"))
    data = b"x" * 1000

    def short(sink) -> ObjectInfo:
        sink.write(data)
        return ObjectInfo(parse_url("s3://test@minio/b/k"), len(data) + 1)

    with pytest.raises(ChecksumMismatch):
        cache.fetch("short", str(tmp_path / "job" / "short"), short)
    assert not cache.contains("absent") and not cache.contains("short")
    assert not (tmp_path / "job" / "absent").exists() and not (tmp_path / "job" / "short").exists()
    assert parts(tmp_path) == []


def test_corrupt_entries_are_detected_and_refetched(store, tmp_path):
    data = os.urandom(MiB)
    store.put("c.bin", data)
    cache = NodeCache(config(tmp_path / "cache"))
    cache.fetch("c", str(tmp_path / "j1"), store.download("c.bin"))
    with cache.pin("c") as entry:
        assert entry is not None
    with open(entry, "ab") as fh:  # a size change: caught on the next hit, cheaply
        fh.write(b"junk")
    assert cache.fetch("c", str(tmp_path / "j2"), store.download("c.bin")) == (len(data), False)
    assert (tmp_path / "j2").read_bytes() == data and gets(store.proxy) == 2
    before = os.stat(entry)
    with open(entry, "r+b") as fh:  # same size, same mtime: only the checksum tells
        fh.write(b"\0" * 16)
    os.utime(entry, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert cache.verify() == ["c"]
    assert not cache.contains("c")
    assert cache.fetch("c", str(tmp_path / "j3"), store.download("c.bin")) == (len(data), False)
    assert (tmp_path / "j3").read_bytes() == data and cache.verify() == []


# --------------------------------------------------------------------------- capacity


def test_eviction_under_pressure_spares_entries_in_use_and_pinned(tmp_path):
    cfg = config(tmp_path / "cache", max_bytes=10 * MiB, high_watermark=0.9, low_watermark=0.5)
    cache = NodeCache(cfg)
    assert cache.insert_bytes("k0", bytes([0]) * MiB) and cache.insert_bytes("k1", bytes([1]) * MiB)
    link = tmp_path / "job" / "k1"
    assert cache.fetch("k1", str(link), _never, symlink=True) == (MiB, True)  # pins k1
    for i in range(2, 8):
        assert cache.insert_bytes(f"k{i}", bytes([i]) * MiB)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from transfer.cache import CacheConfig, NodeCache
        with NodeCache(CacheConfig(**{lean.asdict(cfg)!r})).pin("k0") as path:
            print(path, flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip()  # k0 is in use by another process
        assert cache.insert_bytes("k8", b"8" * MiB) and cache.insert_bytes("k9", b"9" * MiB)
        # 10 MiB > 9 MiB: LRU eviction down to 5 MiB, skipping k0 (in use) and k1 (pinned),
        # the two least recently used
        present = [k for k in (f"k{i}" for i in range(10)) if cache.contains(k)]
        assert present == ["k0", "k1", "k7", "k8", "k9"]
        assert link.read_bytes() == bytes([1]) * MiB
        stats = cache.stats()
        assert (stats.entries, stats.bytes, stats.evictions) == (5, 5 * MiB, 5)
    finally:
        holder.stdin.close()
        holder.wait()
    tight = NodeCache(config(tmp_path / "cache", max_bytes=2 * MiB, low_watermark=0.5))
    assert tight.gc() == 4 * MiB  # k0 is free now; k1 stays pinned (1 MiB = the low mark)
    assert [k for k in ("k0", "k1", "k7", "k8", "k9") if tight.contains(k)] == ["k1"]
    assert not tight.insert_bytes("k10", b"x" * (3 * MiB // 2))  # would break the cap; k1 is pinned
    assert tight.insert_bytes("k11", b"x" * (MiB // 2)) and tight.stats().bytes == 3 * MiB // 2


def test_a_full_filesystem_falls_back_to_an_uncached_transfer(store, tmp_path):
    data = os.urandom(3 * MiB)
    store.put("full.bin", data)
    with tmpfs(tmp_path / "small", "1m") as small:
        cache = NodeCache(config(small / "cache"))
        dest = tmp_path / "job" / "full.bin"
        assert cache.fetch("full", str(dest), store.download("full.bin")) == (len(data), False)
        assert dest.read_bytes() == data
        assert gets(store.proxy) == 1  # the bytes already received moved over: no second GET
        assert not cache.contains("full") and parts(small) == [] and parts(tmp_path / "job") == []
        assert not cache.insert_bytes("too-big", os.urandom(2 * MiB)) and parts(small) == []
        floor = NodeCache(config(small / "cache", min_free_bytes=1 << 40))
        assert floor.fetch("full", str(tmp_path / "job" / "again"), store.download("full.bin")) == (
            len(data), False)
        assert (tmp_path / "job" / "again").read_bytes() == data
        assert not floor.insert_file("small", str(dest)) and not floor.contains("small")
        assert (cache.stats().uncached, floor.stats().uncached) == (1, 1)


# --------------------------------------------------------------------------- materialisation


def test_hits_are_read_only_hard_links_on_the_same_filesystem(store, tmp_path):
    data = os.urandom(MiB)
    store.put("h.bin", data)
    cache = NodeCache(config(tmp_path / "cache"))
    for name in ("a", "b"):
        cache.fetch("h", str(tmp_path / "job" / name), store.download("h.bin"))
    with cache.pin("h") as entry:
        assert all(os.path.samefile(entry, tmp_path / "job" / name) for name in ("a", "b"))
        assert stat.S_IMODE(os.stat(entry).st_mode) == 0o444


def test_symlink_mode_links_to_the_entry(store, tmp_path):
    data = os.urandom(MiB)
    store.put("s.bin", data)
    cache = NodeCache(config(tmp_path / "cache"))
    first, second = tmp_path / "job" / "s1", tmp_path / "job" / "s2"
    assert cache.fetch("s", str(first), store.download("s.bin"), symlink=True) == (len(data), False)
    assert cache.fetch("s", str(second), store.download("s.bin"), symlink=True) == (len(data), True)
    with cache.pin("s") as entry:
        assert os.readlink(first) == entry and os.readlink(second) == entry
    assert first.read_bytes() == data and gets(store.proxy) == 1


def test_a_cache_on_another_filesystem_hands_out_private_copies(store, tmp_path):
    data = os.urandom(2 * MiB)
    store.put("x.bin", data)
    with tmpfs(tmp_path / "other", "16m") as other:
        cache = NodeCache(config(other / "cache"))
        miss, hit = tmp_path / "job" / "miss", tmp_path / "job" / "hit"
        assert cache.fetch("x", str(miss), store.download("x.bin")) == (len(data), False)
        assert cache.fetch("x", str(hit), store.download("x.bin")) == (len(data), True)
        for copy in (miss, hit):
            assert copy.read_bytes() == data and not copy.is_symlink()
            assert os.stat(copy).st_dev != os.stat(other).st_dev
            assert os.stat(copy).st_mode & stat.S_IWUSR  # the job's own, writable copy
        hit.write_bytes(b"changed by the job")
        assert cache.verify() == [] and gets(store.proxy) == 1


def test_write_through_inserts_serve_later_jobs_without_a_request(store, tmp_path):
    output = tmp_path / "job1" / "out.dat"
    output.parent.mkdir()
    output.write_bytes(os.urandom(MiB))
    key = store.url("out.dat")
    cache = NodeCache(config(tmp_path / "cache"))
    assert cache.insert_file(key, str(output), version="etag-1")
    assert cache.insert_bytes("member", b"bundle member")
    assert cache.fetch(key, str(tmp_path / "job2" / "out.dat"), _never) == (MiB, True)
    assert cache.fetch("member", str(tmp_path / "job2" / "m"), _never) == (13, True)
    assert (tmp_path / "job2" / "out.dat").read_bytes() == output.read_bytes()
    assert not os.path.samefile(output, tmp_path / "job2" / "out.dat")  # a copy: the upload keeps its mode
    assert os.stat(output).st_mode & 0o200
    assert gets(store.proxy) == 0 and cache.stats().inserts == 2
    linked = tmp_path / "job1" / "linked.dat"
    linked.write_bytes(b"link me")
    assert cache.insert_file("linked", str(linked), link=True)  # opt-in: the file becomes the entry
    assert cache.fetch("linked", str(tmp_path / "job3" / "l"), _never) == (7, True)
    assert os.path.samefile(linked, tmp_path / "job3" / "l")


def _never(sink) -> ObjectInfo:
    raise AssertionError("a hit must not download")


# --------------------------------------------------------------------------- permissions and config


def test_the_cache_directory_is_private_and_foreign_ones_are_refused(tmp_path):
    old = os.umask(0)
    try:
        cache = NodeCache(config(tmp_path / "new" / "cache"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(cache.directory).st_mode) == 0o700
    assert cache.insert_bytes("k", b"data")
    with cache.pin("k") as entry:
        assert stat.S_IMODE(os.stat(entry).st_mode) == 0o444
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 4242, 4242)
    with pytest.raises(ConfigError, match="owned by uid 4242"):
        NodeCache(config(foreign))
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by group or others"):
        NodeCache(config(open_dir))
    env = {"PEGASUS_CLOUDIO_CONFIG": os.devnull, "HOME": str(tmp_path)}
    assert cache_from_settings({**env, "PEGASUS_CLOUDIO_CACHE_DIR": str(open_dir)}) is None
    with pytest.raises(ConfigError):
        cache_from_settings({**env, "PEGASUS_CLOUDIO_CACHE_DIR": str(foreign)}, strict=True)
    assert cache_from_settings({**env, "PEGASUS_CLOUDIO_CACHE_DIR": "off"}) is None
    found = cache_from_settings({**env, "PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path / "c"),
                                 "PEGASUS_CLOUDIO_CACHE_MAX_BYTES": "64M"})
    assert found is not None and found.config.max_bytes == 64 * MiB
    default = cache_from_settings(env)
    assert default is not None and default.directory == str(tmp_path / ".cache" / "pegasus-cloudio")


def test_a_cache_inside_a_directory_others_can_write_is_refused(tmp_path):
    """Another user who can write a directory above the cache (without the sticky bit) can
    rename the cache away and put a directory of their own in its place, which a running
    process (the stager) would then read entries from and write entries to: refused. A
    sticky directory (``/tmp``, ``/scratch``) lets nobody rename what they do not own."""
    shared = tmp_path / "shared"
    (shared / "project").mkdir(parents=True)
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="others can write") as info:
        NodeCache(config(shared / "project" / "cache"))
    assert str(shared) in str(info.value)
    env = {"PEGASUS_CLOUDIO_CONFIG": os.devnull, "HOME": str(tmp_path)}
    assert cache_from_settings({**env, "PEGASUS_CLOUDIO_CACHE_DIR": str(shared / "cache")}) is None
    shared.chmod(0o1777)
    assert NodeCache(config(shared / "project" / "cache")).insert_bytes("k", b"data")
    group = tmp_path / "group"
    group.mkdir(mode=0o775)
    group.chmod(0o775)
    os.chown(group, -1, 65534)  # a group of other users
    with pytest.raises(ConfigError, match="others can write"):
        NodeCache(config(group / "cache"))
    os.chown(group, -1, os.getegid())  # the user's own private group (named after the user)
    assert grp.getgrgid(os.getegid()).gr_name == pwd.getpwuid(os.geteuid()).pw_name
    assert NodeCache(config(group / "cache")).insert_bytes("k", b"data")


# --------------------------------------------------------------------------- counters and CLI


def test_hit_and_miss_counters_add_up_across_processes_and_the_cli_shows_them(store, tmp_path):
    sizes = {"a": MiB, "b": 2 * MiB, "c": 3 * MiB}
    urls = {name: store.put(f"{name}.bin", os.urandom(size)) for name, size in sizes.items()}
    cfg = config(tmp_path / "cache")

    def job(index: int, names: str) -> list:
        return [{"url": urls[n], "key": urls[n], "dest": str(tmp_path / f"job{index}" / n)} for n in names]

    run_jobs({"env": store.env, "cache": lean.asdict(cfg), "jobs": [job(1, "ab")], "parallel": 1})
    run_jobs({"env": store.env, "cache": lean.asdict(cfg), "jobs": [job(2, "abc")], "parallel": 1})
    assert gets(store.proxy) == 3
    shown = cli("stats", "--dir", cfg.directory, "--json")
    assert shown.returncode == 0, shown.stderr
    stats = json.loads(shown.stdout)
    assert (stats["hits"], stats["misses"], stats["requests_saved"]) == (2, 3, 2)
    assert stats["bytes_saved"] == 3 * MiB and (stats["entries"], stats["bytes"]) == (3, 6 * MiB)
    text = cli("stats", "--dir", cfg.directory).stdout
    assert "requests saved  2" in text and "bytes saved     3.0 MiB" in text
    listed = json.loads(cli("ls", "--dir", cfg.directory, "--json").stdout)
    assert sorted(e["key"] for e in listed) == sorted(urls.values())
    assert "0 corrupt entries removed" in cli("verify", "--dir", cfg.directory).stdout
    assert cli("gc", "--dir", cfg.directory, "--max-bytes", "4M").returncode == 0
    after = json.loads(cli("stats", "--dir", cfg.directory, "--json").stdout)
    assert after["bytes"] <= int(0.7 * 4 * MiB) and after["evictions"] >= 1
    assert cli("clear", "--dir", cfg.directory).returncode == 0
    assert json.loads(cli("ls", "--dir", cfg.directory, "--json").stdout) == []
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    bad = cli("stats", "--dir", str(tmp_path / "open"))
    assert bad.returncode == 2 and "writable by group or others" in bad.stderr


def test_clear_keeps_an_entry_a_job_holds_as_a_symlink(tmp_path):
    """A job handed a symlink to an entry reads it after the transfer ended: ``cache clear``
    must not pull it from under the job (pinned, as eviction honours), only the rest."""
    cfg = config(tmp_path / "cache")
    cache = NodeCache(cfg)
    assert cache.insert_bytes("k0", b"zero" * 1000) and cache.insert_bytes("k1", b"one" * 1000)
    link = tmp_path / "job" / "k1"
    assert cache.fetch("k1", str(link), _never, symlink=True) == (3000, True)
    done = cli("clear", "--dir", cfg.directory)
    assert done.returncode == 0, done.stderr
    assert link.read_bytes() == b"one" * 1000 and "1 pinned entry kept" in done.stdout
    assert [e.key for e in NodeCache(cfg).entries()] == ["k1"]


# --------------------------------------------------------------------------- benchmark


def test_the_cache_benchmark_runs_small_and_meets_its_targets():
    done = subprocess.run(
        [sys.executable, "-m", "pegasus_cloudio.cli", "bench", "cache", "--sources", "2", "--sites", "2",
         "--shared-files", "2", "--concurrent", "6", "--concurrent-mib", "8", "--repeats", "2",
         "--latency-mb", "0,1", "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    plain, cached = result["reuse"]
    assert plain["origin_requests"] == plain["files"] == 4 * 6
    assert cached["origin_requests"] == cached["unique_objects"] == 2 + 2 * 2 + 2 * 2
    assert cached["origin_bytes"] < plain["origin_bytes"]
    assert result["single_flight"]["origin_requests"] == 1 and result["single_flight"]["hits"] == 5
    assert [row["size_mb"] for row in result["latency_ms"]] == [0, 1]
    assert [row["hit_checked"] for row in result["latency_ms"]] == [True, True]  # 1 MB <= 1 MiB
    assert all(row["get_unchecked_ms"] > 0 for row in result["latency_ms"])
    assert result["targets"]["files_identical"] is True
    assert result["targets"]["hardlink_get_of_100MB_under_5ms"] is None  # not measured at this size


def test_removing_an_entry_takes_its_files_and_no_other_keys(tmp_path):
    """remove_entry lists the shard once and unlinks the key's own files: data, metadata, pin,
    peers capability, intact stamp and temp files; never its lock, nor a neighbour's files."""
    from transfer.cache.evict import remove_entry
    from transfer.cache.layout import Layout

    layout = Layout(str(tmp_path))
    mine = layout.paths_for_digest("ab" + "1" * 62)
    other = layout.paths_for_digest("ab" + "2" * 62)
    os.makedirs(mine.shard)
    for paths in (mine, other):
        for name in (paths.data, paths.meta, paths.pin, paths.peers, paths.stamp, paths.lock,
                     f"{paths.data}.123.4.part"):
            with open(name, "wb") as fh:
                fh.write(b"12345")
    assert remove_entry(mine) == 5
    assert sorted(os.listdir(mine.shard)) == sorted(
        [os.path.basename(mine.lock)] + [n for n in os.listdir(mine.shard) if n.startswith(other.digest)])
    assert len([n for n in os.listdir(mine.shard) if n.startswith(other.digest)]) == 7
    assert remove_entry(mine) is None  # nothing left to remove
