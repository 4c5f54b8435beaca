"""transfer.atomic's write-all pair, the one loop each for ``os.write`` and ``os.pwrite`` that the
cache (sink, staging, materialise) and ranged downloads write through."""

from __future__ import annotations

import os
import threading

from transfer.atomic import pwrite_all, write_all


def test_pwrite_all_puts_the_bytes_at_the_offset_and_leaves_the_file_position(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"." * 10)
    fd = os.open(path, os.O_RDWR)
    try:
        os.lseek(fd, 3, os.SEEK_SET)
        pwrite_all(fd, memoryview(b"abcd"), 6)
        pwrite_all(fd, bytearray(b"xy"), 0)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 3
    finally:
        os.close(fd)
    assert path.read_bytes() == b"xy....abcd"


def test_write_all_writes_every_byte_through_a_pipe_a_reader_drains():
    data = os.urandom(3 * 1024 * 1024 + 17)  # more than a pipe holds: the writer waits for the reader
    read_fd, write_fd = os.pipe()
    got = bytearray()

    def drain() -> None:
        while chunk := os.read(read_fd, 65536):
            got.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        write_all(write_fd, data)
    finally:
        os.close(write_fd)
        reader.join()
        os.close(read_fd)
    assert bytes(got) == data
