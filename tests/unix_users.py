"""New Unix users for the tests that play other users of a shared node (root only)."""

from __future__ import annotations

import contextlib
import pwd
import secrets
import subprocess
from typing import Iterator, List


@contextlib.contextmanager
def new_users(count: int = 2) -> Iterator[List[pwd.struct_passwd]]:
    """``count`` new system users (no home, no login shell), named ``pcio<letter><tag>``;
    removed afterwards, also when creating one of them failed."""
    tag = secrets.token_hex(3)
    made: List[str] = []
    try:
        for label in "abcdefgh"[:count]:
            name = f"pcio{label}{tag}"
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                           check=True, capture_output=True)
            made.append(name)
        yield [pwd.getpwnam(name) for name in made]
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True, check=False)
