"""Debian roots holding HTCondor, built once per machine and cached.

Two suites (`ROOTS`): Debian 13 ``trixie`` (`SUITE`, HTCondor 23.9 from ``minicondor``, with
Java and Pegasus's Python modules for the planner) and Debian ``testing`` (`TESTING_SUITE`,
HTCondor 25.x, only what the plugin tests need: `TESTING_PACKAGES`). Each function takes the
suite (default `SUITE`) and builds or finds that suite's root the same way.

`build_root` runs ``mmdebstrap --variant=apt --include=<PACKAGES>`` into a temporary
directory beside the cache and renames it into place, so a root is either complete or absent;
concurrent builders (several pytest processes, several worktrees) serialise on an ``flock``
and the losers find the winner's root. The cache directory (``/var/cache/pegasus-cloudio``,
or ``$PEGASUS_CLOUDIO_POOL_CACHE``) holds one root per package list: the directory name ends
with a digest of the suite, the packages and the submitter account, so extending
`PACKAGES` builds a new root and never changes one a running pool uses. (A ``testing`` root is
the suite as it was on the day it was built; it is rebuilt only when its digest changes.)

Apt sources come from this machine's own ``/etc/apt/sources.list.d/*.sources`` (deb822) or
``/etc/apt/sources.list``, with the release suite renamed to the root's suite and the ``-updates``
and ``-security`` suites dropped (the root is a test fixture: its package set should change
only when `PACKAGES` does); they are piped to mmdebstrap on stdin, so no mirror host is
written in this repository. A ``testing`` Release file is valid for a week only, and a mirror
that keeps a dated copy serves one that has expired: its sources say ``Check-Valid-Until: no``
(apt still verifies the signature).

The root also holds the non-root submitter account `SUBMITTER` (uid `SUBMITTER_UID`) with a
``*`` password field, which an sshd with ``UsePAM no`` accepts for key logins, unlike the
locked ``!`` that ``useradd`` writes.

Command line (the Makefile's ``pool`` step): ``python -m pegasus_cloudio_testbed.condor_root
[SUITE ...]`` builds the roots of the suites named (default: every suite in `ROOTS`, one after
the other) if missing and prints their paths.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence

__all__ = ["PACKAGES", "ROOTS", "SUITE", "SUBMITTER", "SUBMITTER_UID", "TESTING_PACKAGES",
           "TESTING_SUITE", "apt_sources", "build_root", "cache_dir", "root_path"]

SUITE = "trixie"
# What the root holds; others extend this one constant (a new list builds a new root).
PACKAGES: Sequence[str] = (
    "minicondor",                # HTCondor 23.x: master, collector, negotiator, schedd, startd
    "python3",                   # the worker bundle and the plugin run under the root's Python
    "openjdk-21-jre-headless",   # pegasus-plan
    "python3-yaml", "python3-sqlalchemy", "python3-git",  # pegasus-plan/-run/-monitord/-statistics
    "openssh-client",
    "openssh-server",            # an sshd in the root for submit-host mode (tests/test_pegasus_pool.py)
    "procps",                    # ps/pgrep for the tests' process checks
    "python3-venv",              # the transfer plugin's venv (system site packages: classad2)
)
TESTING_SUITE = "testing"
# The plugin tests' root on HTCondor 25.x (tests/test_condor_plugin_pool.py): no planner, no sshd.
TESTING_PACKAGES: Sequence[str] = (
    "minicondor",                # HTCondor 25.x; its condor package holds classad2 for python3
    "python3", "python3-venv",   # the plugin's venv (system site packages)
    "procps",
)
# Every root `make pool` builds: suite -> packages.
ROOTS: Mapping[str, Sequence[str]] = {SUITE: PACKAGES, TESTING_SUITE: TESTING_PACKAGES}
_SHORT_LIVED = frozenset({TESTING_SUITE})   # suites whose Release files carry a Valid-Until
SUBMITTER = "cloudio"
SUBMITTER_UID = 2420
CACHE_ENV = "PEGASUS_CLOUDIO_POOL_CACHE"
DEFAULT_CACHE = "/var/cache/pegasus-cloudio"
_SOURCES_DIR = "/etc/apt/sources.list.d"
_SOURCES_LIST = "/etc/apt/sources.list"
_FORMAT = "1"   # bump when the build steps below change what a root holds


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def root_path(packages: Sequence[str] = PACKAGES, cache: Optional[Path] = None, *,
              suite: str = SUITE) -> Path:
    """Where the root of ``suite`` with ``packages`` lives (built or not)."""
    text = "\n".join([_FORMAT, suite, SUBMITTER, str(SUBMITTER_UID), *sorted(set(packages))])
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return (cache or cache_dir()) / f"condor-root-{suite}-{digest}"


def apt_sources(sources_dir: str = _SOURCES_DIR, sources_list: str = _SOURCES_LIST, *,
                suite: str = SUITE) -> str:
    """deb822 sources for ``suite``, derived from this machine's apt sources.

    Raises RuntimeError when the machine names no Debian release suite to rename."""
    stanzas = [s for path in sorted(glob.glob(os.path.join(sources_dir, "*.sources")))
               for s in _deb822_stanzas(Path(path).read_text())]
    if os.path.exists(sources_list):
        stanzas += _one_line_stanzas(Path(sources_list).read_text())
    release = _release_codename()
    out = []
    for fields in stanzas:
        suites = [s for s in fields.get("Suites", "").split() if s in (release, suite)]
        if not suites or "deb" not in fields.get("Types", "").split():
            continue
        fields = dict(fields, Types="deb", Suites=suite)
        if suite in _SHORT_LIVED:
            fields["Check-Valid-Until"] = "no"
        out.append("\n".join(f"{k}: {v}" for k, v in fields.items()))
    if not out:
        raise RuntimeError(f"no apt source for Debian {release!r} in {sources_dir}/*.sources "
                           f"or {sources_list}: cannot derive {suite} sources")
    return "\n\n".join(out) + "\n"


def _release_codename() -> str:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return SUITE
    found = re.search(r"^VERSION_CODENAME=\"?([a-z]+)", text, re.M)
    return found.group(1) if found else SUITE


def _deb822_stanzas(text: str) -> Iterator[Dict[str, str]]:
    for block in re.split(r"\n\s*\n", text):
        fields: Dict[str, str] = {}
        last = ""
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if line[0] in " \t" and last:
                fields[last] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            last = key.strip()
            fields[last] = value.strip()
        if fields.get("Enabled", "yes").lower() != "no" and "URIs" in fields:
            yield fields


def _one_line_stanzas(text: str) -> Iterator[Dict[str, str]]:
    for line in text.splitlines():
        found = re.match(r"\s*deb\s+(?:\[([^]]*)\]\s+)?(\S+)\s+(\S+)\s+([^#]*)", line)
        if not found:
            continue
        options = dict(o.split("=", 1) for o in (found.group(1) or "").split() if "=" in o)
        stanza = {"Types": "deb", "URIs": found.group(2), "Suites": found.group(3),
                  "Components": found.group(4).strip()}
        if "signed-by" in options:
            stanza["Signed-By"] = options["signed-by"]
        yield stanza


def build_root(packages: Sequence[str] = PACKAGES, cache: Optional[Path] = None,
               log: Optional[Path] = None, *, suite: str = SUITE) -> Path:
    """The cached root of ``suite`` for ``packages``, built first if missing (minutes; a cache
    hit costs one lock). Raises RuntimeError naming mmdebstrap's log when the build fails."""
    final = root_path(packages, cache, suite=suite)
    if (final / "etc" / "condor").is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / ".build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "etc" / "condor").is_dir():
            return final
        for stale in final.parent.glob(f".{final.name}.*"):
            shutil.rmtree(stale, ignore_errors=True)
        building = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        log = log or final.parent / f"{final.name}.build.log"
        try:
            _mmdebstrap(suite, packages, building / "root", log)
            os.chmod(building / "root", 0o755)
            os.rename(building / "root", final)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return final


def _mmdebstrap(suite: str, packages: Sequence[str], target: Path, log: Path) -> None:
    hook = (f'chroot "$1" useradd --uid {SUBMITTER_UID} --user-group --create-home '
            f'--shell /bin/bash {SUBMITTER} && chroot "$1" usermod -p "*" {SUBMITTER}')
    command: List[str] = ["mmdebstrap", "--variant=apt", "--mode=root",
                          f"--include={','.join(packages)}", f"--customize-hook={hook}",
                          suite, str(target), "-"]
    with open(log, "wb") as out:
        done = subprocess.run(command, input=apt_sources(suite=suite).encode(), stdout=out,
                              stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-5:]
        raise RuntimeError(f"mmdebstrap exited {done.returncode} building {target} "
                           f"(log {log}): " + " | ".join(tail))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Build the roots of the suites in ``argv`` (default: all of `ROOTS`) if missing; print
    their paths. Exit 2 for a suite not in `ROOTS`, 1 when a build fails."""
    suites = list(sys.argv[1:] if argv is None else argv) or list(ROOTS)
    unknown = [s for s in suites if s not in ROOTS]
    if unknown:
        print(f"condor root: unknown suite {unknown[0]!r} (known: {', '.join(ROOTS)})", file=sys.stderr)
        return 2
    for suite in suites:
        try:
            print(build_root(ROOTS[suite], suite=suite), flush=True)
        except (RuntimeError, OSError) as exc:
            print(f"condor root ({suite}): {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
