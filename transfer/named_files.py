"""Reading a file someone else names: the one safe way.

A daemon, the HTCondor plugin and the drop-in read files whose names come from elsewhere:
the job ad (``$_CONDOR_JOB_AD``, which the job may replace in its sandbox), credentials
files named by a job's variables, configuration files, cache summaries, the entries of a
user's cache. Any such name may be a FIFO (a plain ``open`` never returns), a device
(``/dev/zero`` never ends), a file far larger than the reader needs, or a symbolic link
another user planted. So every such file is read here, and only here:

* looked at first through an ``O_PATH`` descriptor (Linux), which opens nothing: a device or a
  FIFO is refused unopened, and a regular file is then opened through that descriptor;
  elsewhere opened with ``O_NONBLOCK``: a FIFO opens at once and is then refused (and
  ``O_NOCTTY``: a terminal is refused without becoming the reader's controlling terminal);
* regular files only, checked with ``fstat`` on the opened descriptor (no race with a
  rename); ``os.devnull`` itself is read as an empty file (``PEGASUS_CLOUDIO_CONFIG=/dev/null``
  is the usual way to say "no file");
* at most ``limit`` bytes: ``limit + 1`` are read, and one more than the limit is a refusal;
* links: the path is walked one component at a time, and a link on the way (a directory
  component) is followed only when it is the reader's own or root's, each link of a chain
  alike: another user's link is never followed (``/tmp/x/creds`` with another user's
  ``/tmp/x`` is refused), as the kernel's ``protected_symlinks`` does only in sticky
  directories and only for the last component. For the last component, :data:`NO_LINKS`
  opens with ``O_NOFOLLOW`` (it may not be a link), for names whose contract is a file (the
  job ad, a summary, a cache entry); :data:`OWN_LINKS` follows it too when it is the reader's
  own link or root's (credentials and configuration files, which users and administrators
  link on purpose).

A refusal is :class:`UnsafeFile`, an ``OSError`` whose ``str`` is one line naming the file
and the reason; callers re-raise it as their own error kind. This module imports only
``errno``, ``os`` and ``stat`` (every job step may import it).
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Tuple

__all__ = ["NO_LINKS", "OWN_LINKS", "UnsafeFile", "check_regular", "is_missing", "open_regular", "read_fd",
           "read_file"]

NO_LINKS = "no links"
OWN_LINKS = "own links"
_MAX_LINKS = 40  # as the kernel's path walk
# a directory on the way: O_PATH (only a place to look up the next name), never through a link
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# O_NOCTTY: a terminal named as a file must not become a session leader's controlling terminal
FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
# the last component, looked at before it is opened (0 where there is no O_PATH: opened at once)
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) if hasattr(os, "O_PATH") else 0
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class UnsafeFile(OSError):
    """A named file that cannot be read the safe way; ``str()`` is ``"<path>: <reason>"``
    (``filename`` and ``strerror`` are set, ``errno`` is the OS's when there was one)."""

    def __init__(self, path: str, reason: str, code: int = 0) -> None:
        super().__init__(code, reason, path)

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"

    def __reduce__(self) -> "Tuple[type, Tuple[str, str, int]]":
        return type(self), (str(self.filename), str(self.strerror), self.errno or 0)


def open_regular(path: str, links: str = NO_LINKS, dir_fd: "Optional[int]" = None) -> "Tuple[int, os.stat_result]":
    """A descriptor of the regular file ``path`` (relative to ``dir_fd`` when given) and its
    ``fstat``. Raises :class:`UnsafeFile` (``FileNotFoundError``'s errno kept, so callers can
    tell a missing file) for anything else; see the module docstring for ``links``. Where
    there is ``O_PATH`` (Linux), the file is looked at before it is opened: a device or a FIFO
    is refused without being opened (a device's open may act; a FIFO's wakes its writer)."""
    parent, leaf = _walk(path, links, dir_fd)
    try:
        fd = _open_leaf(path, leaf, parent)
    finally:
        os.close(parent)
    st = os.fstat(fd)
    problem = check_regular(st)
    if problem and not (path == os.devnull and stat.S_ISCHR(st.st_mode)):
        os.close(fd)
        raise UnsafeFile(path, problem)
    return fd, st


def _open_leaf(path: str, leaf: str, parent: int) -> int:
    """``leaf`` in the directory ``parent`` opened for reading, never through a link; with
    ``O_PATH``, only once a descriptor that cannot read (nor act on a device) showed a regular
    file, and then that very file (``/proc/self/fd``, or where there is no ``/proc`` the name
    again, checked to be the same file)."""
    try:
        if not _PATH_FLAGS:
            return os.open(leaf, FLAGS | os.O_NOFOLLOW, dir_fd=parent)
        handle = os.open(leaf, _PATH_FLAGS, dir_fd=parent)
    except OSError as err:
        raise UnsafeFile(path, _reason(err), err.errno or 0) from None
    try:
        st = os.fstat(handle)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeFile(path, "a symbolic link (not followed)", errno.ELOOP)
        problem = check_regular(st)
        if problem and not (path == os.devnull and stat.S_ISCHR(st.st_mode)):
            raise UnsafeFile(path, problem)
        try:
            return os.open(f"/proc/self/fd/{handle}", FLAGS)
        except FileNotFoundError:  # no /proc (a bare chroot): by name, and the same file or nothing
            fd = os.open(leaf, FLAGS | os.O_NOFOLLOW, dir_fd=parent)
            if (os.fstat(fd).st_ino, os.fstat(fd).st_dev) != (st.st_ino, st.st_dev):
                os.close(fd)
                raise UnsafeFile(path, "replaced while it was opened") from None
            return fd
    except UnsafeFile:
        raise
    except OSError as err:
        raise UnsafeFile(path, _reason(err), err.errno or 0) from None
    finally:
        os.close(handle)


def _reason(err: OSError) -> str:
    return "a symbolic link (not followed)" if err.errno == errno.ELOOP else err.strerror or str(err)


def check_regular(st: os.stat_result) -> "Optional[str]":
    """Why ``st`` is not a regular file (``"a FIFO"``, ...), None when it is one."""
    if stat.S_ISREG(st.st_mode):
        return None
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
    return f"{kind}, not a regular file"


def read_fd(fd: int, limit: int, path: str) -> bytes:
    """At most ``limit`` bytes: the whole file behind ``fd`` from its start, read with
    ``pread`` (at most ``limit + 1`` bytes, whatever ``fstat`` said); :class:`UnsafeFile`
    naming ``path`` when it holds more. Does not close ``fd``."""
    chunks = []
    got = 0
    while got <= limit:
        try:
            chunk = os.pread(fd, limit + 1 - got, got)
        except OSError as err:
            raise UnsafeFile(path, err.strerror or str(err), err.errno or 0) from None
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    if got > limit:
        raise UnsafeFile(path, f"larger than {limit} bytes")
    return b"".join(chunks)


def read_file(path: str, limit: int, links: str = NO_LINKS) -> "Tuple[bytes, os.stat_result]":
    """The bytes of the regular file ``path`` (at most ``limit``) and its ``fstat``, opened
    and checked as the module docstring says; :class:`UnsafeFile` otherwise."""
    fd, st = open_regular(path, links)
    try:
        return read_fd(fd, limit, path), st
    finally:
        os.close(fd)


def is_missing(err: OSError) -> bool:
    """Whether ``err`` (from this module) means the file does not exist."""
    return err.errno == errno.ENOENT


def _walk(path: str, links: str, dir_fd: "Optional[int]") -> "Tuple[int, str]":
    """(a descriptor of the directory holding the file ``path`` names, the file's name in it),
    ``path`` walked from ``/`` (or the working directory, or ``dir_fd``) one component at a
    time: a link on the way is followed only when it is this process's user's or root's, and
    the last component too with :data:`OWN_LINKS` (see the module docstring); anything else
    that is a link is left as the last name, for the caller's ``O_NOFOLLOW`` open to refuse.
    The caller closes the descriptor. Raises :class:`UnsafeFile`."""
    parts = [p for p in path.split("/") if p and p != "."]
    fd = os.open("/" if path.startswith("/") else ".", _DIR_FLAGS, dir_fd=None if path.startswith("/") else dir_fd)
    followed = 0
    try:
        while parts:
            name = parts.pop(0)
            if name == "..":
                parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                continue
            if not parts and not _follows(fd, name, links):
                return fd, name
            try:
                st = os.lstat(name, dir_fd=fd)
            except OSError as err:
                raise UnsafeFile(path, err.strerror or str(err), err.errno or 0) from None
            if stat.S_ISLNK(st.st_mode):
                followed += 1
                target = _link_target(path, name, fd, st, followed)
                parts[:0] = [p for p in target.split("/") if p and p != "."]
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR_FLAGS)
                continue
            fd = _enter(path, name, fd)
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    raise UnsafeFile(path, "names a directory, not a file")


def _link_target(path: str, name: str, fd: int, st: os.stat_result, followed: int) -> str:
    """The target of the ``followed``-th link on the way, ``name`` in ``fd`` (``st``: its
    ``lstat``); :class:`UnsafeFile` when it is another user's or there are too many."""
    if st.st_uid not in (0, os.geteuid()) or followed > _MAX_LINKS:
        raise UnsafeFile(path, f"{name} on the way is another user's symbolic link (not followed)"
                         if followed <= _MAX_LINKS else "too many symbolic links", errno.ELOOP)
    return os.readlink(name, dir_fd=fd)


def _enter(path: str, name: str, fd: int) -> int:
    """The directory ``name`` in ``fd`` opened, and ``fd`` closed (not if the open fails:
    :class:`UnsafeFile`)."""
    try:
        child = os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError as err:
        raise UnsafeFile(path, err.strerror or str(err), err.errno or 0) from None
    os.close(fd)
    return child


def _follows(fd: int, name: str, links: str) -> bool:
    """Whether the last component ``name`` (in the directory ``fd``) is a link to follow: with
    :data:`OWN_LINKS`, one of this process's user's or root's."""
    if links != OWN_LINKS:
        return False
    try:
        st = os.lstat(name, dir_fd=fd)
    except OSError:
        return False  # the open names the error
    return stat.S_ISLNK(st.st_mode) and st.st_uid in (0, os.geteuid())
