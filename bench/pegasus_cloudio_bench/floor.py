"""The floor for staging N small files: one GET of one object holding all their bytes, then
writing the N files locally (atomically, as every staging path must). Run as a process:
``python -m pegasus_cloudio_bench.floor URL DEST_DIR COUNT SIZE`` (credentials from the
environment, as for the drop-in)."""

from __future__ import annotations

import io
import os
import sys
from typing import Optional, Sequence

from transfer import Session, parse_url
from transfer.atomic import AtomicFile


def main(argv: Optional[Sequence[str]] = None) -> int:
    url, dest, count, size = (argv or sys.argv[1:])[:4]
    with Session() as session:
        source = parse_url(url, site_label="minio")
        sink = io.BytesIO()
        session.backend(source).get(source, sink)
    data = sink.getvalue()
    os.makedirs(dest, exist_ok=True)
    step = int(size)
    for i in range(int(count)):
        with AtomicFile(os.path.join(dest, f"f{i:05d}.dat")) as out:
            out.file.write(data[i * step:(i + 1) * step])
            out.commit(step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
