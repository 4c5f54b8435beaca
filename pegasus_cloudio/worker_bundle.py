"""``pegasus-cloudio worker-bundle OUT``: the drop-in as one executable file for worker nodes.

For sites where nobody may ``pip install`` on the nodes. OUT is a zipapp (PEP 441) holding
the ``pegasus-cloudio-transfer`` drop-in and the parts of the ``transfer`` library it runs, with a
``#!/usr/bin/env python3`` line: copy it anywhere (e.g. as ``bin/pegasus-cloudio-transfer``
of ``pegasus-cloudio sites --install-bin``) and run it with the worker's system ``python3``
(3.9 or later; RHEL 9's is 3.9). The core is pure standard library, so a zipapp is enough:
file://, s3://, http(s):// URLs, the node cache and bundles work as in the installed package.
gs:// and scp:// need their SDKs (compiled wheels) on the worker; without them the job fails
with one line naming what to install. The file is written atomically (mode 0755).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import zipapp
from pathlib import Path
from types import ModuleType
from typing import Iterator, Tuple

import pegasus_cloudio
import transfer
from pegasus_cloudio.version import __version__

DEFAULT_INTERPRETER = "/usr/bin/env python3"
# package -> the parts of it the drop-in needs ("" = all of it)
CONTENTS: Tuple[Tuple[ModuleType, Tuple[str, ...]], ...] = (
    (transfer, ("",)),
    (pegasus_cloudio, ("__init__.py", "version.py", "ending.py", "dropin")),
)
# what the drop-in never imports: the faces for other engines, each needing its engine's package
# (fsspec, Snakemake, Parsl), which a worker's bare python3 lacks; the library's own plain API
# (Client, AsyncClient and the listing behind them), for programs, not jobs
LEFT_OUT = ("transfer/fsspec_*.py", "transfer/integrations/*", "transfer/client.py", "transfer/aio.py",
            "transfer/listing.py")
MAIN = f'''"""pegasus-cloudio-transfer {__version__}, a single-file drop-in for pegasus-transfer."""
import sys

if sys.version_info < (3, 9):
    sys.stderr.write("pegasus-cloudio-transfer needs Python 3.9 or later; this is %s\\n"
                     % sys.version.split()[0])
    sys.exit(2)
from pegasus_cloudio.dropin.launch import run_here

run_here()
'''


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT", help="file to write, e.g. pegasus-cloudio-transfer.pyz")
    parser.add_argument("--python", default=DEFAULT_INTERPRETER,
                        help=f"interpreter line of the file (default: {DEFAULT_INTERPRETER})")


def main(args: argparse.Namespace) -> int:
    try:
        size = build(Path(args.out), args.python)
    except OSError as err:
        sys.stderr.write(f"pegasus-cloudio worker-bundle: cannot write {args.out}: {err.strerror or err}\n")
        return 1
    print(f"wrote {args.out} ({size // 1024} KiB): run it with python3 >= 3.9, e.g. as "
          "bin/pegasus-cloudio-transfer of pegasus-cloudio sites --install-bin")
    return 0


def build(out: Path, interpreter: str = DEFAULT_INTERPRETER) -> int:
    """Write the zipapp to ``out`` atomically; returns its size in bytes."""
    with tempfile.TemporaryDirectory(prefix="worker-bundle-") as staging:
        root = Path(staging) / "app"
        for source, relative in _sources():
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        (root / "__main__.py").write_text(MAIN, encoding="utf-8")
        out.parent.mkdir(parents=True, exist_ok=True)
        temp = out.parent / f".{out.name}.{os.getpid()}.part"
        try:
            zipapp.create_archive(root, temp, interpreter=interpreter, compressed=True)
            os.chmod(temp, 0o755)
            os.replace(temp, out)
        finally:
            if temp.exists():
                temp.unlink()
    return out.stat().st_size


def _sources() -> Iterator[Tuple[Path, Path]]:
    """(file, path inside the archive) for every Python file the drop-in needs."""
    for package, parts in CONTENTS:
        base = Path(str(package.__file__)).parent
        for part in parts:
            path = base / part
            files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
            for file in files:
                inside = Path(base.name) / file.relative_to(base)
                if not any(inside.match(pattern) for pattern in LEFT_OUT):
                    yield file, inside
