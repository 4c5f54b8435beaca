"""What creating a small file costs the kernel here: the floor under any client's CPU per GET.

    python3 scripts/file_create_cost.py [DIR ...] [--count 6000] [--rounds 3]

In each ``DIR`` (default: a new directory under the system's temp directory, then /dev/shm),
each round creates ``--count`` files of 300 B in a fresh directory, two ways, alternating: the
way a downloader that never leaves a partial file must (a temp name, write, close, rename: what
``transfer.atomic.atomic_write_bytes`` and s5cmd both do), and plainly (create, write, close:
the least any client can do). Prints the user and system CPU per file of each (microseconds)
and the medians. Issue 24's target of 0.25 ms of client CPU per small GET includes this cost;
on ext4 it varies widely from one minute to the next on a virtual machine, which is why the
benchmarks report it beside the figures it moves. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import tempfile
from typing import Callable, Dict, List, Tuple

_DATA = bytes(300)
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def _renamed(directory: str, count: int) -> None:
    for i in range(count):
        temp = f"{directory}/.f{i:05d}.part"
        fd = os.open(temp, _FLAGS, 0o666)
        os.write(fd, _DATA)
        os.close(fd)
        os.replace(temp, f"{directory}/f{i:05d}")


def _plain(directory: str, count: int) -> None:
    for i in range(count):
        fd = os.open(f"{directory}/f{i:05d}", _FLAGS, 0o666)
        os.write(fd, _DATA)
        os.close(fd)


def _cost(way: Callable[[str, int], None], parent: str, count: int) -> Tuple[float, float]:
    """(user, system) microseconds per file of one run of ``way`` in a fresh directory."""
    directory = tempfile.mkdtemp(prefix="create-", dir=parent)
    try:
        before = resource.getrusage(resource.RUSAGE_SELF)
        way(directory, count)
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        shutil.rmtree(directory)
    return ((after.ru_utime - before.ru_utime) / count * 1e6, (after.ru_stime - before.ru_stime) / count * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*")
    parser.add_argument("--count", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    dirs = args.dirs or [tempfile.gettempdir(), "/dev/shm"]
    ways: Dict[str, Callable[[str, int], None]] = {"temp + rename": _renamed, "plain": _plain}
    for parent in dirs:
        seen: Dict[str, List[float]] = {name: [] for name in ways}
        for round_ in range(1, args.rounds + 1):
            for name, way in ways.items():
                user, system = _cost(way, parent, args.count)
                seen[name].append(user + system)
                print(f"{parent}  round {round_}  {name:13s}  user {user:6.1f}  system {system:6.1f} us/file")
        for name, totals in seen.items():
            print(f"{parent}  median  {name:13s}  {statistics.median(totals):6.1f} us/file (user + system)")


if __name__ == "__main__":
    main()
