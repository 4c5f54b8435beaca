"""The orchestration layer on local files: ordering, failover, link modes, atomicity, full disks."""

import os
import subprocess

import pytest

from transfer import (
    Engine,
    InlineExecutor,
    LinkMode,
    Mkdir,
    NoSpace,
    NotFound,
    Remove,
    RetryPolicy,
    Session,
    Settings,
    Transfer,
    parse_url,
)


@pytest.fixture
def session(tmp_path):
    with Session(Settings(threads=4), {"HOME": str(tmp_path)}) as s:
        yield s


def url(path):
    return parse_url(f"file://{path}")


def leftovers(directory):
    return [n for n in os.listdir(directory) if n.endswith((".part", ".link"))]


def test_one_result_per_operation_in_input_order(session, tmp_path):
    (tmp_path / "a").write_bytes(b"A" * 10)
    (tmp_path / "old").write_bytes(b"x")
    ops = [Transfer((url(tmp_path / "a"),), url(tmp_path / "out/deep/a")),
           Mkdir(url(tmp_path / "made/here")),
           Remove(url(tmp_path / "old")),
           Transfer((url(tmp_path / "missing"),), url(tmp_path / "out/m"))]
    seen = []
    results = Engine(session, on_result=seen.append).run(ops)
    assert [r.op for r in results] == ops
    assert [r.ok for r in results] == [True, True, True, False]
    assert sorted(map(id, seen)) == sorted(map(id, results))
    assert (tmp_path / "out/deep/a").read_bytes() == b"A" * 10 and results[0].bytes == 10
    assert (tmp_path / "made/here").is_dir() and not (tmp_path / "old").exists()
    assert isinstance(results[3].error, NotFound) and results[3].attempts == 1


def test_failover_to_the_next_source_within_one_attempt(session, tmp_path):
    (tmp_path / "second").write_bytes(b"2")
    op = Transfer((url(tmp_path / "first"), url(tmp_path / "second")), url(tmp_path / "dst"))
    [result] = Engine(session, executor=InlineExecutor()).run([op])
    assert result.ok and result.attempts == 1 and result.source == op.sources[1]
    assert [a.ok for a in result.history] == [False, True]


def test_symlink_hardlink_and_moveto(session, tmp_path):
    src = tmp_path / "src"
    src.write_bytes(b"data")
    (tmp_path / "mv").write_bytes(b"move")
    ops = [Transfer((url(src),), parse_url(f"symlink://{tmp_path}/sym")),
           Transfer((url(src),), url(tmp_path / "sym2"), link=LinkMode.SYMLINK),
           Transfer((url(src),), url(tmp_path / "hard"), link=LinkMode.HARDLINK),
           Transfer((url(tmp_path / "mv"),), parse_url(f"moveto://{tmp_path}/moved"))]
    assert all(r.ok for r in Engine(session).run(ops))
    assert os.readlink(tmp_path / "sym") == str(src) and os.readlink(tmp_path / "sym2") == str(src)
    assert os.stat(tmp_path / "hard").st_ino == os.stat(src).st_ino
    assert (tmp_path / "moved").read_bytes() == b"move" and not (tmp_path / "mv").exists()


def test_dangling_symlink_only_without_source_verification(session, tmp_path):
    strict = Transfer((url(tmp_path / "nowhere"),), parse_url(f"symlink://{tmp_path}/l1"))
    lax = Transfer((url(tmp_path / "nowhere"),), parse_url(f"symlink://{tmp_path}/l2"), verify_source=False)
    first, second = Engine(session).run([strict, lax])
    assert not first.ok and not os.path.lexists(tmp_path / "l1")
    assert second.ok and os.path.islink(tmp_path / "l2")


def test_same_file_counts_as_success(session, tmp_path):
    (tmp_path / "f").write_bytes(b"same")
    [result] = Engine(session).run([Transfer((url(tmp_path / "f"),), url(tmp_path / "f"))])
    assert result.ok and (tmp_path / "f").read_bytes() == b"same"


def test_unwritable_destination_leaves_nothing(session, tmp_path):
    (tmp_path / "src").write_bytes(b"x" * 100)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        [result] = Engine(session).run([Transfer((url(tmp_path / "src"),), url(locked / "f"))])
    finally:
        locked.chmod(0o700)
    if os.geteuid() == 0:  # root ignores the mode; then the copy must simply be complete
        assert result.ok and (locked / "f").read_bytes() == b"x" * 100
    else:
        assert not result.ok and os.listdir(locked) == []


def test_recursive_local_remove(session, tmp_path):
    (tmp_path / "tree/a/b").mkdir(parents=True)
    (tmp_path / "tree/a/b/f").write_bytes(b"1")
    [result] = Engine(session).run([Remove(url(tmp_path / "tree"), recursive=True)])
    assert result.ok and not (tmp_path / "tree").exists()


@pytest.fixture
def tiny_fs(tmp_path):
    """A 256 KiB tmpfs mounted for the test: a real full filesystem, not an injected error."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_full_disk_is_a_clean_no_space_error_with_no_partial_file(session, tmp_path, tiny_fs):
    big = tmp_path / "big"
    big.write_bytes(os.urandom(1 << 20))
    retry = RetryPolicy(max_attempts=3, base_delay=0.001)
    [result] = Engine(session, retry=retry).run([Transfer((url(big),), url(tiny_fs / "big"))])
    assert not result.ok and isinstance(result.error, NoSpace)
    assert result.attempts == 1  # a full disk is not retried
    assert os.listdir(tiny_fs) == []


def test_relinking_an_existing_hardlink_leaves_no_temp_name(tmp_path):
    from transfer.atomic import atomic_hardlink

    (tmp_path / "src").write_bytes(b"data")
    assert atomic_hardlink(str(tmp_path / "src"), str(tmp_path / "hard"))
    assert atomic_hardlink(str(tmp_path / "src"), str(tmp_path / "hard"))  # rename() is a no-op here
    assert sorted(os.listdir(tmp_path)) == ["hard", "src"]


def test_recursive_remove_of_dir_star_keeps_the_directory(session, tmp_path):
    (tmp_path / "d/sub").mkdir(parents=True)
    (tmp_path / "d/a").write_bytes(b"1")
    (tmp_path / "d/sub/b").write_bytes(b"2")
    [result] = Engine(session).run([Remove(parse_url(f"file://{tmp_path}/d/*"), recursive=True)])
    assert result.ok and (tmp_path / "d").is_dir() and os.listdir(tmp_path / "d") == []


def test_a_bug_in_one_transfer_is_reported_for_that_file_only(session, tmp_path, monkeypatch):
    (tmp_path / "good").write_bytes(b"ok")
    (tmp_path / "bad").write_bytes(b"boom")
    from transfer.backends import local as local_backend

    real = local_backend.LocalBackend.get

    def flaky(self, url, sink, byte_range=None):
        if url.path.endswith("bad"):
            raise KeyError("simulated bug")
        return real(self, url, sink, byte_range)

    monkeypatch.setattr(local_backend.LocalBackend, "get", flaky)
    bad, good = Engine(session).run([Transfer((url(tmp_path / "bad"),), url(tmp_path / "o/bad")),
                                     Transfer((url(tmp_path / "good"),), url(tmp_path / "o/good"))])
    assert good.ok and not bad.ok and bad.attempts == 1
    assert "internal error: KeyError" in str(bad.error) and isinstance(bad.error.__cause__, KeyError)
    assert os.listdir(tmp_path / "o") == ["good"]


def test_many_threads_linking_into_one_new_directory(tmp_path):
    """Parents created concurrently by other threads never make a link fail."""
    from concurrent.futures import ThreadPoolExecutor

    from transfer.atomic import atomic_hardlink

    (tmp_path / "src").write_bytes(b"x")
    for round_ in range(20):
        target = tmp_path / f"new{round_}" / "deeper"
        with ThreadPoolExecutor(8) as pool:
            done = list(pool.map(lambda i: atomic_hardlink(str(tmp_path / "src"), str(target / f"f{i}")), range(8)))
        assert done == [True] * 8 and len(os.listdir(target)) == 8


def test_an_interrupt_inside_a_small_write_leaves_no_temp_file(tmp_path, monkeypatch):
    """Ctrl-C lands in the main thread, which writes the pipelined pass's files: the write's
    temp file goes with it, as on any error (only the rename makes a file appear)."""
    from transfer import atomic

    def interrupted(fd, data):
        os.write(fd, data[:10])
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic, "write_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic.atomic_write_bytes(str(tmp_path / "f"), b"x" * 300)
    assert list(tmp_path.iterdir()) == []
