#!/usr/bin/env python3
"""How a workflow engine other than Pegasus stages one task's data with the ``transfer`` library.

A task declares input and output keys under a store URL. The engine

1. downloads every input into a private work directory (one engine run: parallel, retried,
   each file written atomically),
2. runs the task there,
3. uploads the outputs (one more engine run) and reports per-file results.

Usage::

    python examples/custom_engine/stage_task.py --store s3://USER@SITE/BUCKET/PREFIX --work DIR
    python examples/custom_engine/stage_task.py --demo      # on an embedded MinIO (pegasus_cloudio_testbed)

Credentials come from the Pegasus credentials file (``$PEGASUS_CREDENTIALS``), as for the
drop-in; ``--demo`` writes one for the MinIO it starts.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from transfer import Engine, Result, Session, Transfer, parse_url


@dataclass(frozen=True)
class Task:
    """What the engine knows about a task: its data (keys under the store) and its code."""

    name: str
    inputs: Sequence[str]
    outputs: Sequence[str]
    run: Callable[[str], None]  # called with the work directory


def stage(engine: Engine, pairs: Sequence[tuple]) -> List[Result]:
    """Copy (source URL, destination URL) pairs; raise with every failure if any file failed."""
    results = engine.run([Transfer((parse_url(src),), parse_url(dst)) for src, dst in pairs])
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeError("; ".join(str(r.error) for r in failed))
    return results


def run_task(task: Task, store: str, work: str, session: Session) -> List[Result]:
    """Stage in, run, stage out. Returns the upload results."""
    engine = Engine(session)
    os.makedirs(work, exist_ok=True)
    stage(engine, [(f"{store}/{key}", f"file://{work}/{key}") for key in task.inputs])
    task.run(work)
    return stage(engine, [(f"file://{work}/{key}", f"{store}/{key}") for key in task.outputs])


def word_count(work: str) -> None:
    """The demo task: count the words of every input in work/in/ into work/counts.txt."""
    inputs = os.path.join(work, "in")
    lines = []
    for name in sorted(os.listdir(inputs)):
        with open(os.path.join(inputs, name), encoding="utf-8") as fh:
            lines.append(f"{name} {len(fh.read().split())}\n")
    with open(os.path.join(work, "counts.txt"), "w", encoding="utf-8") as fh:
        fh.writelines(lines)


def demo_task(count: int) -> Task:
    return Task("word-count", [f"in/{i:03d}.txt" for i in range(count)], ["counts.txt"], word_count)


def demo(count: int = 20) -> int:
    """Start MinIO, seed inputs, run the task, print what was uploaded."""
    from pegasus_cloudio_testbed.minio import MinioServer

    with MinioServer() as minio, tempfile.TemporaryDirectory() as tmp:
        creds = minio.write_pegasus_credentials(os.path.join(tmp, "credentials.conf"))
        env = dict(os.environ, PEGASUS_CREDENTIALS=str(creds))
        store = "s3://test@minio/demo-bucket/task1"
        with Session(env=env) as session:
            seed = os.path.join(tmp, "seed")
            os.makedirs(seed)
            task = demo_task(count)
            for i, key in enumerate(task.inputs):
                with open(os.path.join(seed, os.path.basename(key)), "w", encoding="utf-8") as fh:
                    fh.write("word " * (i + 1))
            session.backend(parse_url(store)).make_dirs(parse_url(store))
            stage(Engine(session), [(f"file://{seed}/{os.path.basename(k)}", f"{store}/{k}") for k in task.inputs])
            for result in run_task(task, store, os.path.join(tmp, "work"), session):
                print(f"uploaded {result.op.dest} ({result.bytes} bytes, {result.attempts} attempt(s))")  # type: ignore[union-attr]
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="s3://USER@SITE/BUCKET/PREFIX holding in/NNN.txt")
    parser.add_argument("--work", help="work directory for the task")
    parser.add_argument("--count", type=int, default=20, help="number of inputs in/000.txt ... (default 20)")
    parser.add_argument("--demo", action="store_true", help="run against an embedded MinIO")
    args = parser.parse_args(argv)
    if args.demo:
        return demo(args.count)
    if not args.store or not args.work:
        parser.error("--store and --work are required (or use --demo)")
    with Session() as session:
        for result in run_task(demo_task(args.count), args.store.rstrip("/"), args.work, session):
            print(f"uploaded {result.op.dest} ({result.bytes} bytes)")  # type: ignore[union-attr]
    return 0


if __name__ == "__main__":
    sys.exit(main())
