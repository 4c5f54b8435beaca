"""transfer.named_files, the one way a file someone else names is read: FIFOs, devices,
oversized files and other users' links (real users, made with ``useradd``) are refused with
one line naming the file, and nothing blocks or reads past the bound."""

from __future__ import annotations

import os
import pickle
import pwd
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Iterator

import pytest

from unix_users import new_users

from transfer.named_files import NO_LINKS, OWN_LINKS, UnsafeFile, is_missing, read_file


@pytest.fixture
def users() -> Iterator[Dict[str, int]]:
    """Two new Unix users (name -> uid), removed after the test."""
    with new_users(2) as made:
        yield {user.pw_name: user.pw_uid for user in made}


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A sticky, world-writable directory, as /tmp is (every user may plant names in it)."""
    path = Path(tempfile.mkdtemp(prefix="pcio-named-"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", str(path)], check=False)


def refusal(path: str, links: str = NO_LINKS, limit: int = 1 << 20) -> str:
    with pytest.raises(UnsafeFile) as caught:
        read_file(path, limit, links)
    line = str(caught.value)
    assert line.startswith(f"{path}: ") and "\n" not in line, line
    return line


def test_a_fifo_is_refused_at_once_without_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "a FIFO, not a regular file" in refusal(str(fifo))
    assert "a FIFO, not a regular file" in refusal(str(fifo), OWN_LINKS)


def test_devices_and_directories_are_refused(tmp_path: Path) -> None:
    assert "a character device" in refusal("/dev/zero")
    assert "a directory" in refusal(str(tmp_path))


def test_dev_null_reads_as_an_empty_file() -> None:
    data, _ = read_file(os.devnull, 10)
    assert data == b""


def test_at_most_the_limit_is_read(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_file(str(path), 100)[0] == b"x" * 100
    assert "larger than 99 bytes" in refusal(str(path), limit=99)


def test_a_missing_file_keeps_its_errno(tmp_path: Path) -> None:
    with pytest.raises(UnsafeFile) as caught:
        read_file(str(tmp_path / "absent"), 10)
    assert is_missing(caught.value) and str(tmp_path / "absent") in str(caught.value)


def test_no_links_refuses_every_link_own_links_follows_only_own_or_roots(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"mine")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert "a symbolic link (not followed)" in refusal(str(link))
    assert read_file(str(link), 10, OWN_LINKS)[0] == b"mine"  # root's own link (the tests run as root)


def read_as(uid: int, path: Path) -> str:
    """What :func:`read_file` with OWN_LINKS gives ``uid`` for ``path`` (the bytes, or the
    refusal's line), read in a child process running as ``uid``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(pwd.getpwuid(uid).pw_gid)
            os.setuid(uid)
            try:
                answer = repr(read_file(str(path), 100, OWN_LINKS)[0])
            except UnsafeFile as err:
                answer = str(err)
            os.write(w, answer.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        answer = fh.read().decode()
    assert os.waitpid(pid, 0)[1] == 0
    return answer


def test_another_users_link_is_never_followed(users: Dict[str, int], shared_dir: Path) -> None:
    """User b plants a link in a shared directory to a's private file; a reading the name
    with OWN_LINKS is not steered to it. a's own link is followed."""
    (_, a_uid), (_, b_uid) = users.items()
    private = shared_dir / "a-private"
    private.write_bytes(b"a's secret")
    os.chown(private, a_uid, a_uid)
    private.chmod(0o600)
    planted, own = shared_dir / "credentials.conf", shared_dir / "own-link"
    planted.symlink_to(private)
    os.chown(planted, b_uid, b_uid, follow_symlinks=False)
    own.symlink_to(private)
    os.chown(own, a_uid, a_uid, follow_symlinks=False)
    assert read_as(a_uid, planted) == f"{planted}: a symbolic link (not followed)"
    assert read_as(a_uid, own) == repr(b"a's secret")


def test_an_own_link_to_another_users_link_is_not_followed(users: Dict[str, int], shared_dir: Path) -> None:
    """a's own link names a path where b keeps a link: the kernel would follow both, so b
    would choose the file a reads as her credentials. Every link of the chain must be a's or
    root's; a chain of a's own links is followed."""
    (_, a_uid), (_, b_uid) = users.items()
    b_file = shared_dir / "b-chosen"
    b_file.write_bytes(b"b's choice")
    b_file.chmod(0o644)
    b_link, own = shared_dir / "b-link", shared_dir / "own-link"
    b_link.symlink_to(b_file)
    os.chown(b_link, b_uid, b_uid, follow_symlinks=False)
    own.symlink_to(b_link.name)  # relative, as links usually are
    os.chown(own, a_uid, a_uid, follow_symlinks=False)
    assert read_as(a_uid, own) == f"{own}: a symbolic link (not followed)"
    mine, hop = shared_dir / "a-file", shared_dir / "a-hop"
    mine.write_bytes(b"a's file")
    mine.chmod(0o644)
    hop.symlink_to(mine)
    os.chown(hop, a_uid, a_uid, follow_symlinks=False)
    os.unlink(own)
    own.symlink_to(hop)
    os.chown(own, a_uid, a_uid, follow_symlinks=False)
    assert read_as(a_uid, own) == repr(b"a's file")


def test_another_users_link_on_the_way_is_not_followed(users: Dict[str, int], shared_dir: Path) -> None:
    """b plants a link where a directory of a's path should be (shared/x -> a directory of b's
    choosing): a's read of shared/x/creds is refused, naming the link, in either mode; a link
    of a's own on the way is followed (she chose it)."""
    (_, a_uid), (_, b_uid) = users.items()
    b_dir = shared_dir / "b-dir"
    b_dir.mkdir()
    b_dir.chmod(0o755)
    (b_dir / "creds").write_bytes(b"b's choice")
    (b_dir / "creds").chmod(0o644)
    planted, own = shared_dir / "x", shared_dir / "own-x"
    planted.symlink_to(b_dir)
    os.chown(planted, b_uid, b_uid, follow_symlinks=False)
    own.symlink_to(b_dir)
    os.chown(own, a_uid, a_uid, follow_symlinks=False)
    assert read_as(a_uid, planted / "creds") == \
        f"{planted / 'creds'}: x on the way is another user's symbolic link (not followed)"
    assert read_as(a_uid, own / "creds") == repr(b"b's choice")
    # a reader running as root (a daemon) follows its own links on the way, no user's
    rooted = shared_dir / "root-x"
    rooted.symlink_to(b_dir)
    assert read_file(str(rooted / "creds"), 100, NO_LINKS)[0] == b"b's choice"
    assert "own-x on the way is another user's symbolic link" in refusal(str(own / "creds"))


def test_the_refusal_pickles_and_is_an_oserror(tmp_path: Path) -> None:
    err = UnsafeFile(str(tmp_path / "x"), "a FIFO, not a regular file")
    copy = pickle.loads(pickle.dumps(err))
    assert isinstance(copy, OSError) and str(copy) == str(err) and copy.filename == err.filename


@pytest.mark.parametrize("kind", ["directory", "fifo", "device", "link"])
def test_cache_summary_read_gives_one_line_for_every_non_file(tmp_path: Path, kind: str) -> None:
    """``cache-summary --read`` is the startd cron: what it is pointed at is read the same way."""
    import sys
    path = {"directory": tmp_path, "fifo": tmp_path / "fifo", "device": Path("/dev/zero"),
            "link": tmp_path / "link"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    if kind == "link":
        (tmp_path / "summary").write_text('PegasusCloudioCacheFiles = 0\n')
        path.symlink_to(tmp_path / "summary")
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "cache-summary", "--read", str(path)],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PEGASUS_CLOUDIO_CONFIG=os.devnull))
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    why = {"directory": "a directory", "fifo": "a FIFO", "device": "a character device", "link": "a symbolic link"}
    assert line.startswith(f"pegasus-cloudio cache-summary: {path}: {why[kind]}"), line


def test_a_terminal_named_as_a_file_does_not_become_the_readers_terminal() -> None:
    """A terminal opened by a session leader without one becomes its controlling terminal
    (its hangup then signals the reader) unless opened with O_NOCTTY: a refused name must
    leave the reader as it was."""
    master, slave = os.openpty()  # glibc opens the slave with O_NOCTTY
    name = os.ttyname(slave)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.setsid()  # a new session: no controlling terminal
            try:
                read_file(name, 10)
            except UnsafeFile as err:
                os.write(w, f"{err}\n".encode())
            try:
                os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY))
                os.write(w, b"a controlling terminal")
            except OSError:
                os.write(w, b"none")
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        answer = fh.read().decode()
    assert os.waitpid(pid, 0)[1] == 0
    os.close(slave)
    os.close(master)
    assert answer == f"{name}: a character device, not a regular file\nnone", answer


def _open_events(path: Path):
    """An inotify descriptor that queues an event each time ``path`` is opened (the kernel's
    own record: an ``O_PATH`` descriptor opens nothing and makes none)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0 and libc.inotify_add_watch(fd, str(path).encode(), 0x20) >= 0, ctypes.get_errno()  # IN_OPEN
    return fd


def _queued(fd: int) -> int:
    try:
        return len(os.read(fd, 4096))
    except BlockingIOError:
        return 0


def test_a_fifo_or_device_is_refused_without_being_opened(tmp_path: Path) -> None:
    """The last stop's note: a device was opened (its open may act; a FIFO's open wakes a
    writer waiting for a reader) and only then refused. Now it is looked at through O_PATH."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        events = _open_events(path)
        try:
            assert "not a regular file" in refusal(str(path))
            assert _queued(events) == 0, f"{path} was opened"
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # the watch sees an open
            assert _queued(events) > 0
        finally:
            os.close(events)
    regular = tmp_path / "f"
    regular.write_bytes(b"data")
    assert read_file(str(regular), 10)[0] == b"data"
    assert read_file(os.devnull, 10)[0] == b""
