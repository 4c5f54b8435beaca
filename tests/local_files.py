"""Local files of random bytes, the sources of upload tests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List


def files(directory: Path, count: int, size: int = 300, name: str = "f{:03d}.dat") -> List[Path]:
    """``count`` files of ``size`` random bytes in ``directory`` (made as needed), named by
    ``name`` formatted with 0, 1, ...; their paths in that order."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = directory / name.format(i)
        path.write_bytes(os.urandom(size))
        paths.append(path)
    return paths
