"""The catalog templates shipped in ``site-catalogs/``: one generator command line each.

``python -m pegasus_cloudio.sites.templates [ROOT]`` regenerates them (default ROOT:
``site-catalogs`` of the current directory); tests check that this reproduces the
committed files byte for byte, so templates and generator never drift apart.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional, Sequence

from pegasus_cloudio.sites import cli

COMMON = ["--work-dir", "/home/user/wf", "--install-bin", "/opt/pegasus-cloudio/bin"]
TEMPLATES: Dict[str, List[str]] = {
    "s3-cloud-storage": ["--mode", "cloud-storage", "--provider", "s3", "--bucket", "my-pegasus-bucket",
                         "--endpoint", "https://s3.us-west-2.amazonaws.com", "--region", "us-west-2",
                         "--identity", "pegasus@amazon", "--credentials", "/home/user/.pegasus/credentials.conf"],
    "gcs-cloud-storage": ["--mode", "cloud-storage", "--provider", "gcs", "--bucket", "my-pegasus-bucket",
                          "--gcs-key", "/home/user/.pegasus/gcs-key.json", "--boto-config", "/home/user/.boto"],
    "azure-cloud-storage": ["--mode", "cloud-storage", "--provider", "azure", "--account", "mystorageaccount",
                            "--bucket", "my-pegasus-container"],
    "vm-storage": ["--mode", "vm-storage", "--vm-scratch", "/mnt/data/scratch"],
    "submit-host-scp": ["--mode", "submit-host", "--submit-host", "pegasus@submit.example.org",
                        "--ssh-key", "/home/user/.ssh/workflow_id_rsa"],
}


def argv_for(name: str, out: str) -> List[str]:
    return TEMPLATES[name] + COMMON + ["--out", out, "--force"]


def regenerate(root: str) -> int:
    """Write every template under ``root``; returns the first non-zero exit code, or 0."""
    for name in TEMPLATES:
        code = cli.run(argv_for(name, os.path.join(root, name)))
        if code:
            return code
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="site-catalogs")
    return regenerate(parser.parse_args(argv).root)


if __name__ == "__main__":
    sys.exit(main())
