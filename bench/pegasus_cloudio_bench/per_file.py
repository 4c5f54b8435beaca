"""What the per-file baseline drivers (:mod:`~pegasus_cloudio_bench.naive_gcs`,
:mod:`~pegasus_cloudio_bench.naive_azcli`, :mod:`~pegasus_cloudio_bench.naive_azure`) share:
their command line (``--threads T`` and ``get|put``, the items ``[[bucket, key, path], ...]`` as
JSON on stdin) and their pool. Standard library only: a driver's every child imports it too.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Sequence

Item = Sequence[str]  # [bucket or container, key or blob, local path]


def parser(module: str) -> argparse.ArgumentParser:
    """The driver's parser for ``python -m module``, with ``--threads`` (default 1)."""
    parsed = argparse.ArgumentParser(prog=f"python -m {module}")
    parsed.add_argument("--threads", type=int, default=1)
    return parsed


def add_direction(parsed: argparse.ArgumentParser) -> None:
    """The positional ``get|put`` of a driver whose items come on stdin."""
    parsed.add_argument("direction", choices=("get", "put"), help="items [[bucket, key, path], ...] on stdin")


def items_on_stdin() -> List[Item]:
    return json.load(sys.stdin)  # type: ignore[no-any-return]


def each(one: Callable[[Item], int], threads: int, items: Sequence[Item]) -> int:
    """``one(item)`` for every item, ``threads`` at a time: 1 if any returned non-zero, else 0."""
    with ThreadPoolExecutor(threads) as pool:
        codes = list(pool.map(one, items))
    return 1 if any(codes) else 0
