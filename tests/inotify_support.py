"""Counting the opens of a node cache's ``stats.json`` with inotify (the kernel's record, so a
read by any process counts)."""

import ctypes
import os
import struct
from typing import Callable, Tuple


def stats_opens(directory: "os.PathLike[str] | str") -> Tuple[int, Callable[[], int]]:
    """An inotify descriptor queuing the opens of files in ``directory``, and a function giving
    how many of those since its last call were of ``stats.json``. The caller closes the descriptor."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0 and libc.inotify_add_watch(fd, str(directory).encode(), 0x20) >= 0, ctypes.get_errno()  # IN_OPEN

    def count() -> int:
        seen = 0
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return seen
            at = 0
            while at < len(data):
                _wd, _mask, _cookie, size = struct.unpack_from("iIII", data, at)
                seen += data[at + 16:at + 16 + size].rstrip(b"\0") == b"stats.json"
                at += 16 + size
    return fd, count
