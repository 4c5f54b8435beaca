"""Reading a file someone else names: the one safe way.

A daemon, the HTCondor plugin and the drop-in read files whose names come from elsewhere:
the job ad (``$_CONDOR_JOB_AD``, which the job may replace in its sandbox), credentials
files named by a job's variables, configuration files, cache summaries, the entries of a
user's cache. Any such name may be a FIFO (a plain ``open`` never returns), a device
(``/dev/zero`` never ends), a file far larger than the reader needs, or a symbolic link
another user planted. So every such file is read here, and only here:

* opened with ``O_NONBLOCK``: a FIFO opens at once and is then refused (and ``O_NOCTTY``: a
  terminal is refused without becoming the reader's controlling terminal);
* regular files only, checked with ``fstat`` on the opened descriptor (no race with a
  rename); ``os.devnull`` itself is read as an empty file (``PEGASUS_CLOUDIO_CONFIG=/dev/null``
  is the usual way to say "no file");
* at most ``limit`` bytes: ``limit + 1`` are read, and one more than the limit is a refusal;
* links: :data:`NO_LINKS` opens with ``O_NOFOLLOW`` (the last component may not be a link),
  for names whose contract is a file (the job ad, a summary, a cache entry); :data:`OWN_LINKS`
  follows a last component that is a link only when the link is the reader's own or
  root's, one link at a time, so each link of a chain must be (credentials and configuration
  files, which users and administrators link on purpose; another user's link is never
  followed, as the kernel's ``protected_symlinks`` does in sticky directories, and not
  after one of the reader's own either).

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
# O_NOCTTY: a terminal named as a file must not become a session leader's controlling terminal
FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
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
    tell a missing file) for anything else; see the module docstring for ``links``."""
    target = _own_links_followed(path, dir_fd) if links == OWN_LINKS else path
    try:
        fd = os.open(target, FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as err:
        link = err.errno == errno.ELOOP
        raise UnsafeFile(path, "a symbolic link (not followed)" if link else err.strerror or str(err),
                         err.errno or 0) from None
    st = os.fstat(fd)
    problem = check_regular(st)
    if problem and not (path == os.devnull and stat.S_ISCHR(st.st_mode)):
        os.close(fd)
        raise UnsafeFile(path, problem)
    return fd, st


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


def _own_links_followed(path: str, dir_fd: "Optional[int]") -> str:
    """``path`` with the links of its last component followed one at a time while each is a
    link of this process's user or root (the kernel would follow a whole chain, and another
    user's link after one of ours would choose the file). The name the chain ends at, which
    the caller opens with ``O_NOFOLLOW``: a link of another user's there, or one swapped in
    meanwhile, is then refused as a link."""
    for _ in range(_MAX_LINKS):
        try:
            st = os.lstat(path, dir_fd=dir_fd) if dir_fd is not None else os.lstat(path)
        except OSError:
            return path  # the open names the error
        if not stat.S_ISLNK(st.st_mode) or st.st_uid not in (0, os.geteuid()):
            return path
        try:
            target = os.readlink(path, dir_fd=dir_fd) if dir_fd is not None else os.readlink(path)
        except OSError:
            return path
        path = os.path.join(os.path.dirname(path), target)  # an absolute target replaces the directory
    return path  # still a link: refused as one
