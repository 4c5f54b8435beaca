#!/usr/bin/env python3
"""A Montage-shaped workflow for trying the staging modes: many small files, one big fan-in.

``PRODUCERS`` jobs (like mProject) each read one header file and write ``FILES`` small files;
one job (like mConcatFit) reads all ``PRODUCERS x FILES`` of them. The producers carry the
Pegasus profile ``clusters.size`` so ``pegasus-plan --cluster horizontal`` runs them in
clustered jobs (fewer jobs, fewer staging calls).

Usage, with a catalog set written by ``pegasus-cloudio sites ... --out DIR``::

    python examples/montage_like/workflow.py --catalogs DIR --producers 100 --files 60

This adds the two transformations to ``DIR/transformations.yml``, the header file to
``DIR/replicas.yml`` (created as ``DIR/inputs/region.hdr``) and writes ``DIR/workflow.yml``;
then plan from ``DIR`` with the command in ``DIR/README.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence

from Pegasus import replica_catalog, transformation_catalog
from Pegasus.api import File, Job, Namespace, Transformation, TransformationSite, Workflow

HERE = os.path.dirname(os.path.abspath(__file__))


def build_workflow(producers: int, files: int) -> Workflow:
    """The abstract workflow: ``producers`` x ``files`` small files into one concatenation."""
    wf = Workflow("montage-like")
    header = File("region.hdr")
    small: List[File] = []
    for p in range(producers):
        outputs = [File(f"p{p:04d}_{i:03d}.fits") for i in range(files)]
        small += outputs
        wf.add_jobs(Job("project", namespace="montage", _id=f"project_{p:04d}")
                    .add_args(header, f"p{p:04d}", str(files))
                    .add_inputs(header)
                    .add_outputs(*outputs, stage_out=False, register_replica=False))
    result = File("fits.tbl")
    wf.add_jobs(Job("concat", namespace="montage", _id="concat")
                .add_args(result).add_inputs(*small).add_outputs(result, stage_out=True, register_replica=False))
    return wf


def transformations(cluster_size: int) -> List[Transformation]:
    """Both executables staged from the submit host; producers clustered horizontally."""
    project = Transformation("project", namespace="montage").add_sites(
        TransformationSite("local", os.path.join(HERE, "bin", "project.sh"), is_stageable=True))
    project.add_profiles(Namespace.PEGASUS, key="clusters.size", value=str(cluster_size))
    concat = Transformation("concat", namespace="montage").add_sites(
        TransformationSite("local", os.path.join(HERE, "bin", "concat.sh"), is_stageable=True))
    return [project, concat]


def add_to_catalogs(catalogs: str, cluster_size: int) -> None:
    """Merge the example's transformations and raw input into a `pegasus-cloudio sites` set."""
    tc_path, rc_path = os.path.join(catalogs, "transformations.yml"), os.path.join(catalogs, "replicas.yml")
    with open(tc_path, encoding="utf-8") as fh:
        tc = transformation_catalog.load(fh)
    for t in transformations(cluster_size):
        tc.transformations.pop(f"{t.namespace}::{t.name}::{t.version}", None)
        tc.add_transformations(t)
    tc.write(tc_path)
    header = os.path.join(catalogs, "inputs", "region.hdr")
    os.makedirs(os.path.dirname(header), exist_ok=True)
    with open(header, "w", encoding="utf-8") as fh:
        fh.write("SIMPLE  = T\nNAXIS   = 2\nCTYPE1  = 'RA---TAN'\nCTYPE2  = 'DEC--TAN'\nEND\n")
    with open(rc_path, encoding="utf-8") as fh:
        rc = replica_catalog.load(fh)
    rc.entries.pop(("region.hdr", False), None)
    rc.add_replica("local", "region.hdr", header)
    rc.write(rc_path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalogs", required=True, help="directory written by `pegasus-cloudio sites`")
    parser.add_argument("--producers", type=int, default=100, help="producer jobs (default 100)")
    parser.add_argument("--files", type=int, default=60, help="small files per producer (default 60)")
    parser.add_argument("--cluster-size", type=int, default=20, help="producers per clustered job (default 20)")
    args = parser.parse_args(argv)
    if min(args.producers, args.files, args.cluster_size) < 1:
        parser.error("--producers, --files and --cluster-size must be at least 1")
    add_to_catalogs(args.catalogs, args.cluster_size)
    build_workflow(args.producers, args.files).write(os.path.join(args.catalogs, "workflow.yml"))
    print(f"wrote {args.catalogs}/workflow.yml: {args.producers} producers x {args.files} files -> 1 concat job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
