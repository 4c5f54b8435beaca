"""A custom workflow engine staging a task's many small outputs as one bundle, and the next
task's inputs out of it, with the ``transfer`` library and no Pegasus.

    python examples/bundles_custom_engine.py SCRATCH_URL WORKDIR

SCRATCH_URL is an object-store directory such as ``s3://joe@mysite/bucket/run1`` (credentials
as for pegasus-transfer: $PEGASUS_CREDENTIALS). Without arguments the script prints usage.
"""

from __future__ import annotations

import os
import sys

from transfer import Engine, Session, Settings, Transfer, parse_url
from transfer.bundles import pack_files, unbundle


def stage_out(outputs, scratch_url, session):
    """Upload a task's outputs; with bundling on, many small files become one object."""
    ops = [Transfer((parse_url(path),), parse_url(f"{scratch_url}/{os.path.basename(path)}")) for path in outputs]
    return Engine(session).run(ops)


def stage_in(names, scratch_url, workdir, session):
    """Fetch the next task's inputs; bundled members are found and fetched transparently."""
    ops = [Transfer((parse_url(f"{scratch_url}/{name}"),), parse_url(os.path.join(workdir, name))) for name in names]
    return Engine(session).run(ops)


def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    scratch_url, workdir = argv
    producer, consumer = os.path.join(workdir, "task1"), os.path.join(workdir, "task2")
    os.makedirs(producer, exist_ok=True)
    outputs = []
    for i in range(50):  # the producer task writes 50 small files
        path = os.path.join(producer, f"part{i:03d}.txt")
        with open(path, "w") as fh:
            fh.write(f"partial result {i}\n")
        outputs.append(path)
    with Session(Settings.from_env().replace(bundle=True)) as session:
        failed = [r for r in stage_out(outputs, scratch_url, session) if not r.ok]
        failed += [r for r in stage_in([os.path.basename(p) for p in outputs], scratch_url, consumer, session)
                   if not r.ok]
    for result in failed:
        print(f"failed: {result.error}", file=sys.stderr)
    # Bundles are also usable offline, e.g. to archive a task's outputs:
    archive = os.path.join(workdir, "task1.pcb")
    pack_files([(os.path.basename(p), p) for p in outputs], archive)
    unbundle(archive, os.path.join(workdir, "restored"), names=["part007.txt"])
    print(f"staged {len(outputs)} files out and back in; {len(failed)} failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
