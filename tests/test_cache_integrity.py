"""Checked cache hits, changed objects and private files: hostile cache entries never reach a job."""

from __future__ import annotations

import os
import stat

import pytest

from transfer import parse_url
from transfer.backends.base import ObjectInfo
from transfer.cache import CacheConfig, NodeCache
from transfer.errors import ConfigError

MiB = 1 << 20


def config(directory, **changes) -> CacheConfig:
    fields = {"directory": str(directory), "max_bytes": 1 << 30, "min_free_bytes": 0, "fsync": False}
    fields.update(changes)
    return CacheConfig(**fields)


class Origin:
    """A store of one object that counts GETs and reports a version (ETag) per content."""

    def __init__(self, data: bytes, version: str = "v1") -> None:
        self.data, self.version, self.gets = data, version, 0

    def __call__(self, sink) -> ObjectInfo:
        self.gets += 1
        sink.write(self.data)
        return ObjectInfo(parse_url("s3://b/k", env={}), len(self.data), self.version)


def rot(path: str) -> None:
    """Change bytes in place, keeping size and mtime (what the cheap check compares)."""
    before = os.stat(path)
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:
        fh.write(b"\xffROT")
    os.chmod(path, 0o444)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def entry_of(cache: NodeCache, key: str) -> str:
    with cache.pin(key) as path:
        assert path is not None
        return path


def test_bit_rot_with_same_size_and_mtime_is_never_served(tmp_path):
    origin = Origin(os.urandom(300_000))
    cache = NodeCache(config(tmp_path / "cache"))
    cache.fetch("k", str(tmp_path / "j1"), origin)
    rot(entry_of(cache, "k"))
    assert cache.fetch("k", str(tmp_path / "j2"), origin) == (len(origin.data), False)
    assert (tmp_path / "j2").read_bytes() == origin.data and origin.gets == 2
    assert cache.fetch("k", str(tmp_path / "j3"), origin) == (len(origin.data), True)  # repaired
    assert cache.stats().corrupt == 1


@pytest.mark.parametrize("size", [1000, MiB, MiB + 1, 5 * MiB])
def test_bit_rot_is_caught_on_a_hit_whatever_the_entry_size_by_default(tmp_path, size):
    """Before: entries over 1 MiB (1,048,577 bytes here) were served rotten. Up to 1 MiB every
    hit re-hashes; above, the change of ctime that any write, chmod or utime makes does."""
    origin = Origin(os.urandom(size))
    cache = NodeCache(config(tmp_path / "cache"))  # the defaults CacheConfig and the knob give
    cache.fetch("k", str(tmp_path / "j1"), origin)
    rot(entry_of(cache, "k"))
    assert cache.fetch("k", str(tmp_path / "j2"), origin) == (size, False)
    assert (tmp_path / "j2").read_bytes() == origin.data and origin.gets == 2
    assert cache.stats().corrupt == 1


def test_a_big_entry_is_re_hashed_only_when_its_ctime_moved(tmp_path):
    origin = Origin(os.urandom(2 * MiB))
    cache = NodeCache(config(tmp_path / "cache"))
    cache.fetch("big", str(tmp_path / "j1"), origin)
    entry = entry_of(cache, "big")
    for n in range(2, 5):  # hard-link hits move the ctime themselves: each restamps, none re-hashes
        assert cache.fetch("big", str(tmp_path / f"j{n}"), origin) == (2 * MiB, True)
    stamp = os.stat(entry + ".ok").st_mtime_ns
    assert stamp == os.stat(entry).st_ctime_ns
    os.chmod(entry, 0o444)  # a change of metadata only: the bytes are intact, so it is re-hashed and kept
    assert cache.fetch("big", str(tmp_path / "j5"), origin) == (2 * MiB, True) and origin.gets == 1
    assert os.stat(entry + ".ok").st_mtime_ns != stamp


def test_entries_above_the_verify_limit_are_checked_by_cache_verify(tmp_path):
    origin = Origin(os.urandom(2 * MiB))
    cache = NodeCache(config(tmp_path / "cache", verify_bytes=MiB))
    cache.fetch("big", str(tmp_path / "j1"), origin)
    rot(entry_of(cache, "big"))
    assert cache.verify() == ["big"]
    assert cache.fetch("big", str(tmp_path / "j2"), origin) == (2 * MiB, False)
    assert (tmp_path / "j2").read_bytes() == origin.data


def test_verify_bytes_is_a_setting(tmp_path):
    from transfer.cache import config_from_env
    found = config_from_env({"PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
                             "PEGASUS_CLOUDIO_CACHE_VERIFY_BYTES": "4M"})
    assert found is not None and found.verify_bytes == 4 * MiB
    default = config_from_env({"PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull})
    assert default is not None and default.verify_bytes == MiB
    every = config_from_env({"PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path), "PEGASUS_CLOUDIO_CACHE_VERIFY_BYTES": "all"})
    assert every is not None and every.verify_bytes is None and every.verifies(1 << 40)


def test_a_get_showing_a_new_version_drops_the_entry(tmp_path):
    cache = NodeCache(config(tmp_path / "cache"))
    cache.fetch("k", str(tmp_path / "j1"), Origin(b"old bytes", "v1"))
    cache.observe("k", "v1")
    assert cache.contains("k")
    cache.observe("k", "v2")
    assert not cache.contains("k")
    newer = Origin(b"new bytes", "v2")
    assert cache.fetch("k", str(tmp_path / "j2"), newer) == (9, False)
    assert (tmp_path / "j2").read_bytes() == b"new bytes"


def test_an_upload_with_other_bytes_replaces_the_entry(tmp_path):
    cache = NodeCache(config(tmp_path / "cache"))
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_bytes(b"first")
    second.write_bytes(b"second!")
    assert cache.insert_file("k", str(first), "e1")
    assert cache.insert_file("k", str(second), "e2")
    cache.fetch("k", str(tmp_path / "j"), Origin(b"unused"))
    assert (tmp_path / "j").read_bytes() == b"second!"
    assert cache.insert_bytes("m", b"member one")
    assert cache.insert_bytes("m", b"member two")
    cache.fetch("m", str(tmp_path / "jm"), Origin(b"unused"))
    assert (tmp_path / "jm").read_bytes() == b"member two"


def test_metadata_and_counters_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        cache = NodeCache(config(tmp_path / "cache"))
        cache.fetch("k", str(tmp_path / "j"), Origin(b"data"))
        cache.close()
    finally:
        os.umask(old)
    meta = entry_of(cache, "k") + ".meta"
    assert stat.S_IMODE(os.stat(meta).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "cache" / "stats.json").st_mode) == 0o600


def test_a_symlinked_cache_directory_must_be_the_users(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    mine = tmp_path / "mine"
    mine.symlink_to(real)
    NodeCache(config(mine))  # one's own link is fine
    planted = tmp_path / "planted"
    planted.symlink_to(real)
    os.lchown(planted, 4242, 4242)
    with pytest.raises(ConfigError, match="symbolic link owned by uid 4242"):
        NodeCache(config(planted))


@pytest.mark.parametrize("verify_bytes, size, fsyncs", [
    (MiB, 300, 0),            # re-hashed on every hit: a power cut's damage is a miss
    (MiB, MiB + 1, 1),        # trusted on its ctime: made durable before it is published
    (0, 300, 1),              # VERIFY_BYTES=0: nothing is re-hashed, every entry is fsynced
    (None, 3 * MiB, 0),       # "all": every hit re-hashes
])
def test_only_entries_a_hit_does_not_re_hash_are_fsynced(tmp_path, monkeypatch, verify_bytes, size, fsyncs):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    cache = NodeCache(config(tmp_path / "c", fsync=True, verify_bytes=verify_bytes))
    origin = Origin(os.urandom(size))
    assert cache.fetch("s3://b/k", str(tmp_path / "job"), origin) == (size, False)
    assert len(calls) == fsyncs
def test_a_torn_small_entry_left_by_a_power_cut_is_a_miss_not_wrong_bytes(tmp_path):
    """What skipping its fsync risks: the data never reached the disk (zeros, same size and mtime)."""
    cache = NodeCache(config(tmp_path / "c", fsync=True))
    origin = Origin(os.urandom(300))
    cache.fetch("k", str(tmp_path / "job1"), origin)
    data = entry_of(cache, "k")
    before = os.stat(data)
    os.chmod(data, 0o644)
    with open(data, "r+b") as fh:
        fh.write(bytes(300))
    os.chmod(data, 0o444)
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert cache.fetch("k", str(tmp_path / "job2"), origin) == (300, False)
    assert (tmp_path / "job2").read_bytes() == origin.data and origin.gets == 2


def test_a_hit_under_a_stricter_umask_than_the_fill_s_is_not_readable_by_others(tmp_path):
    """Jobs of one user share the node cache but not their umasks: an entry one job made under
    umask 022 (0444) is not hard-linked into a job under umask 077, whose input would then be
    readable by every user who can reach its directory; that job gets its own private file."""
    origin = Origin(b"private input")
    old = os.umask(0o022)
    try:
        cache = NodeCache(config(tmp_path / "cache"))
        assert cache.fetch("k", str(tmp_path / "j1" / "in.dat"), origin) == (13, False)
        os.umask(0o077)
        assert cache.fetch("k", str(tmp_path / "j2" / "in.dat"), origin) == (13, True)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "j1" / "in.dat").st_mode) == 0o444
    assert stat.S_IMODE(os.stat(tmp_path / "j2" / "in.dat").st_mode) & 0o077 == 0
    assert (tmp_path / "j2" / "in.dat").read_bytes() == origin.data and origin.gets == 1


def test_without_proc_the_umask_still_takes_its_bits_away(tmp_path):
    """Where /proc/self/status has no ``Umask:`` line (/proc not mounted in a container, a
    kernel before 4.7), entries and declined downloads still lose the umask's bits: under
    umask 077 a hard-linked input and a declined download are the job's alone (they were 0444
    and 0644, as under umask 022). Run in a mount namespace whose /proc is an empty tmpfs."""
    import shutil
    import subprocess
    import sys
    import textwrap

    unshare = shutil.which("unshare")  # util-linux: on every Debian system
    assert unshare is not None, "unshare (util-linux) is needed to run without /proc"
    probe = subprocess.run([unshare, "-Urm", "true"], capture_output=True, text=True)
    assert probe.returncode == 0, f"unshare -Urm cannot make a user and mount namespace here: {probe.stderr.strip()}"
    script = textwrap.dedent(f"""
        import os, stat
        from transfer.cache import CacheConfig, NodeCache
        assert not os.path.exists("/proc/self/status")
        os.umask(0o077)
        def config(name, max_bytes):
            return CacheConfig(directory="{tmp_path}/" + name, max_bytes=max_bytes, min_free_bytes=0, fsync=False)
        def origin(sink):
            from transfer import parse_url
            from transfer.backends.base import ObjectInfo
            sink.write(b"private input")
            return ObjectInfo(parse_url("s3://b/k"), 13, "v1")
        NodeCache(config("cache", 1 << 30)).fetch("k", "{tmp_path}/j1", origin)
        NodeCache(config("tiny", 1)).fetch("k", "{tmp_path}/j2", origin)
        print(oct(stat.S_IMODE(os.stat("{tmp_path}/j1").st_mode)), oct(stat.S_IMODE(os.stat("{tmp_path}/j2").st_mode)))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([unshare, "-Urm", "sh", "-c", 'mount -t tmpfs none /proc && exec "$0" -c "$1"',
                           sys.executable, script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0o400", "0o600"]


def test_a_hard_linked_input_is_no_more_readable_than_a_downloaded_one(tmp_path):
    """A hit hands the job the entry itself (a hard link): with a umask of 077 it must be as
    private as the file an uncached download writes, not readable by every user who can reach
    the job's directory."""
    origin = Origin(b"private input")
    old = os.umask(0o077)
    try:
        cache = NodeCache(config(tmp_path / "cache"))
        assert cache.fetch("k", str(tmp_path / "j1" / "in.dat"), origin) == (13, False)
        assert cache.fetch("k", str(tmp_path / "j2" / "in.dat"), origin) == (13, True)
        assert cache.insert_bytes("m", b"member")
        uncached = NodeCache(config(tmp_path / "tiny", max_bytes=1))
        uncached.fetch("k", str(tmp_path / "j3" / "in.dat"), origin)
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "j1" / "in.dat").st_ino == os.stat(tmp_path / "j2" / "in.dat").st_ino
    modes = {job: stat.S_IMODE(os.stat(tmp_path / job / "in.dat").st_mode) for job in ("j1", "j2", "j3")}
    assert modes == {"j1": 0o400, "j2": 0o400, "j3": 0o600}
    assert stat.S_IMODE(os.stat(entry_of(cache, "m")).st_mode) == 0o400
