"""Pegasus's Go ``pegasus-transfer`` (the stock tool of Pegasus 6) as a contestant.

The development line of Pegasus rewrote ``pegasus-transfer`` in Go (one static binary, S3
through aws-sdk-go-v2 with one client per site and identity, ``--threads`` workers over
groups of up to 100 transfers, each group one transfer after another). It reads the same
transfer JSON and the same Pegasus credentials file as the Python tool Pegasus 5 ships, so
every scenario gives it the input it gives ours and the Python tool, in the same run.

The binary is the pinned build of :mod:`pegasus_cloudio_testbed.tools` (built on first use).
"""

from __future__ import annotations

from typing import Dict, List, Mapping

from pegasus_cloudio_testbed.tools import ensure_go_transfer

__all__ = ["GO", "STOCK_NOTE", "go_argv", "go_env"]

GO = "Go pegasus-transfer"
STOCK_NOTE = ("'stock pegasus-transfer' is the Python tool Pegasus 5 ships; "
              "'Go pegasus-transfer' is Pegasus's Go rewrite (commit b261f8c80), the stock tool to come")


def go_argv(threads: int) -> List[str]:
    """The Go tool with ``threads`` workers (its ``--threads``, as the Python tool's)."""
    return [str(ensure_go_transfer()), "--threads", str(threads)]


def go_env(env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` for the Go tool: its SDK never asks an instance-metadata service (static keys only)."""
    return dict(env, AWS_EC2_METADATA_DISABLED="true")
