"""The three staging modes, each with what the builder, the checker and the READMEs need to
know of it: one member per mode, where the code used to compare strings in six modules.

A member is also its string (``Mode.CLOUD == "cloud-storage"``), so options parsed from the
command line compare with it before they are validated.
"""

from __future__ import annotations

import enum
from typing import Optional, Tuple

from transfer import schemes


class Mode(str, enum.Enum):
    """Where a workflow's intermediate files live."""

    CLOUD = "cloud-storage"   # a bucket (S3, GCS or an Azure container); the planner stages through it
    VM = "vm-storage"         # the worker VM's disk, shared by its jobs (sharedfs)
    SUBMIT = "submit-host"    # the submit host's scratch, reached over scp

    @property
    def heading(self) -> str:
        """The set's README and properties title."""
        return {Mode.CLOUD: "intermediate files in a cloud bucket",
                Mode.VM: "intermediate files on the worker VM's disk",
                Mode.SUBMIT: "intermediate files on the submit host (scp)"}[self]

    @property
    def data_configuration(self) -> str:
        """Pegasus's ``pegasus.data.configuration`` for the mode."""
        return "sharedfs" if self is Mode.VM else "nonsharedfs"

    @property
    def object_store(self) -> bool:
        """Intermediate files are objects in a bucket (bundles are on by default)."""
        return self is Mode.CLOUD

    def scratch_schemes(self, provider: Optional[str]) -> Tuple[str, ...]:
        """The URL schemes the staging site's scratch file servers may use."""
        if self is Mode.CLOUD:
            family = provider or "s3"  # the providers are named as their scheme families
            return tuple(name for name, row in schemes.SCHEMES.items() if row.family == family)
        return ("file", "scp") if self is Mode.VM else ("scp",)


MODES: Tuple[str, ...] = tuple(mode.value for mode in Mode)
