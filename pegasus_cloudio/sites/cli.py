"""Write a ready Pegasus catalog set for one staging mode (`pegasus-cloudio sites`).

``pegasus-cloudio sites --mode cloud-storage|vm-storage|submit-host [--provider s3|gcs|azure] ... --out DIR``
builds the set with the Pegasus Python API, writes it (each file atomically), then checks it
with Pegasus's own loaders (:mod:`.check`). Exit 0: written and clean; 1: a check failed or a
file could not be written; 2: a bad flag (one line naming it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Dict, List, Optional, Sequence

from pegasus_cloudio.sites.build import overlay_links, render
from pegasus_cloudio.sites.check import check_set
from pegasus_cloudio.sites.docs import extras, properties_header, readme, replicas_header
from pegasus_cloudio.sites.modes import Mode
from pegasus_cloudio.sites.options import SetOptions, UsageError, problems
from pegasus_cloudio.version import plain

EXECUTABLE = {"bin/pegasus-transfer"}
PRIVATE = {"credentials.conf.example", "boto.example"}
_INTS = ("threads", "stage_clusters", "cluster_size", "ssh_port")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags; values are validated in :func:`main` so every error is one line naming its flag."""
    add = parser.add_argument
    add("--mode", help="cloud-storage | vm-storage | submit-host")
    add("--provider", help="cloud-storage: s3 | gcs | azure")
    add("--out", help="directory to write the set into")
    add("--force", action="store_true", help="overwrite an existing set in --out")
    add("--work-dir", help="submit host directory for scratch/ outputs/ bin/ (default: --out)")
    add("--install-bin", help="directory of pegasus-cloudio-transfer on submit host and workers "
                              "(default: this installation's); workers without pip can get the one-file "
                              "drop-in: pegasus-cloudio worker-bundle DIR/pegasus-cloudio-transfer")
    add("--compute-site", default="condorpool", help="compute site name (default condorpool)")
    add("--staging-site", help="cloud-storage: bucket site name (default s3staging / gcsstaging / azurestaging)")
    add("--bucket", help="cloud-storage: bucket (Azure: container) for intermediate files")
    add("--prefix", default="scratch", help="cloud-storage: key prefix in the bucket (default scratch)")
    add("--identity", default="pegasus@amazon",
        help="s3: USER@SITE in the credentials file (default pegasus@amazon)")
    add("--endpoint", help="s3: endpoint URL, e.g. https://s3.us-west-2.amazonaws.com")
    add("--region", help="s3: region (optional)")
    add("--credentials", help="s3: Pegasus credentials file (default ~/.pegasus/credentials.conf)")
    add("--gcs-key", help="gcs: service-account JSON key (default ~/.pegasus/gcs-key.json)")
    add("--boto-config", help="gcs: boto file with a [Credentials] section (default ~/.boto)")
    add("--gcs-endpoint", help="gcs: JSON API endpoint (emulators only)")
    add("--account", help="azure: storage account (credentials: the jobs' AZURE_STORAGE_* environment)")
    add("--vm-scratch", default="/mnt/data/scratch",
        help="vm-storage: scratch directory on the VM disk (default /mnt/data/scratch)")
    add("--vm-host", help="vm-storage: USER@HOST when the VM is not the submit host")
    add("--submit-host", help="submit-host: USER@HOST the workers scp to")
    add("--ssh-key", help="submit-host / --vm-host: private key shipped to the jobs")
    add("--ssh-port", help="scp port (default 22)")
    add("--worker-package", default="installed", help="installed (default) | staged")
    add("--worker-pegasus-home", default="/usr", help="Pegasus install on the workers (default /usr)")
    add("--pegasus-bin", default="/usr/bin",
        help="the submit host's Pegasus bin, on PATH of local jobs after the shim (submit-host mode, "
             "--worker-package staged; default /usr/bin); another one (a tarball's) also gets the set a "
             "pegasus/ home of links to plan from, so jobs that run pegasus-transfer by name run the drop-in")
    add("--threads", default="8", help="PEGASUS_CLOUDIO_THREADS (default 8)")
    add("--cache-dir", help="PEGASUS_CLOUDIO_CACHE_DIR on workers (default: not set, so the drop-in's own "
                            "default, $XDG_CACHE_HOME/pegasus-cloudio else ~/.cache/pegasus-cloudio)")
    add("--bundle", dest="bundle", action="store_true", default=None,
        help="set PEGASUS_CLOUDIO_BUNDLE=1 (default: on for cloud-storage, off for the other modes)")
    add("--no-bundle", dest="bundle", action="store_false", help="do not bundle small files")
    add("--stager", metavar="SOCKET",
        help="PEGASUS_CLOUDIO_STAGER on workers: jobs hand their transfers to the node stager serving this "
             "socket, started on each worker with `pegasus-cloudio stager --socket SOCKET` (default: not set)")
    add("--p2p", metavar="REDIS_URL",
        help="share the workers' node caches peer to peer through this replica index (docs/p2p.md)")
    add("--p2p-token-file", default="~/.pegasus/p2p.token",
        help="pool token file on the workers: each user's own copy, mode 0600 (default ~/.pegasus/p2p.token)")
    add("--p2p-ca-file", default="/etc/pegasus-cloudio/pool-ca.crt", help="pool CA certificate on the workers (default /etc/pegasus-cloudio/pool-ca.crt)")
    add("--stage-clusters", default="4", help="pegasus.stagein/stageout.clusters (default 4)")
    add("--cluster-size", default="20", help="recommended clusters.size for small-file producers (default 20)")


def options_from_args(args: argparse.Namespace) -> SetOptions:
    """SetOptions from parsed flags (defaults filled in); UsageError names every bad flag."""
    bad = [] if args.out else ["--out is required"]
    home = os.path.expanduser("~")
    values: Dict[str, object] = {}
    for name in _INTS:
        raw = getattr(args, name)
        try:
            values[name] = int(raw) if raw is not None else None
        except ValueError:
            bad.append(f"--{name.replace('_', '-')} must be a whole number (got {raw!r})")
            values[name] = getattr(SetOptions, name, None)
    s3 = args.mode == Mode.CLOUD and args.provider == "s3"
    gcs = args.mode == Mode.CLOUD and args.provider == "gcs"
    opts = SetOptions(
        mode=args.mode, provider=args.provider, work_dir=args.work_dir or os.path.abspath(args.out or "."),
        install_bin=args.install_bin or _installed_bin(), compute_site=args.compute_site,
        staging_site=args.staging_site, bucket=args.bucket, prefix=args.prefix, identity=args.identity,
        endpoint=args.endpoint, region=args.region,
        credentials=args.credentials or (os.path.join(home, ".pegasus", "credentials.conf") if s3 else None),
        gcs_key=args.gcs_key or (os.path.join(home, ".pegasus", "gcs-key.json") if gcs else None),
        boto_config=args.boto_config or (os.path.join(home, ".boto") if gcs else None),
        gcs_endpoint=args.gcs_endpoint, account=args.account, vm_scratch=args.vm_scratch, vm_host=args.vm_host,
        submit_host=args.submit_host, ssh_key=args.ssh_key, worker_pegasus_home=args.worker_pegasus_home,
        pegasus_bin=args.pegasus_bin, worker_package=args.worker_package, cache_dir=args.cache_dir,
        bundle=args.bundle, p2p_redis=args.p2p, p2p_token_file=args.p2p_token_file,
        p2p_ca_file=args.p2p_ca_file, stager=args.stager, **values)  # type: ignore[arg-type]
    found = bad + problems(opts)
    if found:
        raise UsageError(*found)
    return opts


def _installed_bin() -> str:
    found = shutil.which("pegasus-cloudio-transfer")
    return os.path.dirname(os.path.abspath(found)) if found else os.path.dirname(os.path.abspath(sys.executable))


def main(args: argparse.Namespace) -> int:
    try:
        opts = options_from_args(args)
    except UsageError as err:
        sys.stderr.writelines(f"pegasus-cloudio sites: {problem}\n" for problem in err.args)
        return 2
    argv = _argv_of(args)
    try:
        written = write_set(opts, args.out, argv, force=args.force)
    except FileExistsError as err:
        sys.stderr.write(f"pegasus-cloudio sites: --out {args.out} already holds {err}; pass --force to "
                         "overwrite\n")
        return 2
    except OSError as err:
        sys.stderr.write(f"pegasus-cloudio sites: cannot write {err.filename}: {err.strerror}\n")
        return 1
    problems = check_set(args.out, opts)
    for problem in problems:
        sys.stderr.write(f"pegasus-cloudio sites: check failed: {problem}\n")
    if problems:
        return 1
    print(f"wrote {len(written)} files to {args.out}; plan with the command in {args.out}/README.md")
    return 0


def write_set(opts: SetOptions, out: str, argv: Sequence[str], force: bool = False) -> List[str]:
    """Write every file of the set into ``out`` (atomically each); returns the relative names."""
    files = render(opts, properties_header(opts), replicas_header())
    files.update(extras(opts))
    files["README.md"] = readme(opts, argv)
    links = overlay_links(opts)
    if not force:
        for name in list(files) + list(links):
            if os.path.lexists(os.path.join(out, name)):
                raise FileExistsError(name)
    for name, text in files.items():
        mode = 0o755 if name in EXECUTABLE else 0o600 if name in PRIVATE else 0o644
        _write_atomic(os.path.join(out, name), text, mode)
    for name, target in links.items():
        _link_atomic(os.path.join(out, name), target)
    return sorted(list(files) + list(links))


def _write_atomic(path: str, text: str, mode: int) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.part")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def _link_atomic(path: str, target: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.part")
    if os.path.lexists(temp):
        os.unlink(temp)
    os.symlink(target, temp)
    os.replace(temp, path)


def _argv_of(args: argparse.Namespace) -> List[str]:
    """The flags that differ from their defaults (for the README), in a stable order, without --out."""
    defaults = vars(_parser().parse_args([]))
    argv: List[str] = []
    for flag, value in sorted(vars(args).items()):
        if flag in ("out", "force") or flag not in defaults or value == defaults[flag]:
            continue
        if isinstance(value, bool):
            argv.append(f"--{flag.replace('_', '-')}" if value else f"--no-{flag.replace('_', '-')}")
        else:
            argv += [f"--{flag.replace('_', '-')}", str(value)]
    return argv


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pegasus-cloudio sites", description=plain(__doc__.splitlines()[0]))
    add_arguments(parser)
    return parser


def run(argv: Optional[Sequence[str]] = None) -> int:
    """Stand-alone entry (``python -m pegasus_cloudio.sites.cli``), same as ``pegasus-cloudio sites``."""
    return main(_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(run())
