"""What a catalog set is generated from, validated flag by flag.

:class:`SetOptions` is the one input of the builder; :func:`validate` raises
:class:`UsageError` naming every offending flag (the CLI prints one line each, exit 2).
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from pegasus_cloudio.sites.modes import MODES, Mode
from transfer.lean import record

PROVIDERS = ("s3", "gcs", "azure")
WORKER_PACKAGE = ("installed", "staged")
_SITE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]$")
_USER_HOST = re.compile(r"^[A-Za-z0-9_][\w.\-]*@[A-Za-z0-9][\w.\-]*$")
_IDENTITY = re.compile(r"^[\w.\-]+@[\w.\-]+$")
_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")  # Azure's storage account names
_CONTAINER = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9\-]{1,61}[a-z0-9]$")  # and container names


class UsageError(ValueError):
    """Bad flags: ``args`` holds one message per problem, each starting with the flag's name."""


@record(frozen=True)
class SetOptions:
    """Inputs of one catalog set. Paths are absolute paths on the host that uses them.

    mode:            cloud-storage | vm-storage | submit-host.
    provider:        s3 | gcs | azure (cloud-storage only).
    work_dir:        submit host: ``scratch/`` and ``outputs/`` of site ``local`` live here.
    install_bin:     directory holding ``pegasus-cloudio-transfer`` on the submit host and workers.
    compute_site:    name of the HTCondor pool site.
    staging_site:    cloud-storage: name of the bucket site.
    bucket, prefix:  cloud-storage: where intermediate files go (Azure: the container).
    account:         Azure: the storage account (``az://ACCOUNT/CONTAINER/PREFIX``); its credentials
                     come from the jobs' environment (docs/azure.md), never from the set.
    identity:        S3: ``USER@SITE`` of the Pegasus credentials file.
    endpoint, region: S3: written to ``credentials.conf.example``.
    credentials:     S3: the Pegasus credentials file (shipped to jobs by the planner).
    gcs_key, boto_config: GCS: service-account key and boto file (the 5.1.3 planner needs both).
    gcs_endpoint:    GCS: JSON API endpoint (emulators), set as PEGASUS_CLOUDIO_GCS_ENDPOINT.
    vm_scratch:      vm-storage: the VM's local-disk scratch directory.
    vm_host:         vm-storage: ``USER@HOST`` of a VM that is not the submit host (scp access).
    submit_host:     submit-host: ``USER@HOST`` workers reach the submit host as (scp).
    ssh_key, ssh_port: private key (shipped to jobs) and port for scp.
    worker_pegasus_home: Pegasus install on the workers (used when the worker package is not staged).
    pegasus_bin:     the submit host's Pegasus ``bin`` (on PATH of local jobs behind the shim, see
                     :attr:`shim_on_path`). Not ``/usr/bin`` (a tarball install): the set also gets
                     the overlay :attr:`overlay_dir` to plan from (see :attr:`needs_overlay`).
    worker_package:  installed (default: no worker-package staging, every invocation is ours) |
                     staged (the planner's default; create-dir/cleanup/stage-worker stay stock).
    threads, cache_dir, bundle: PEGASUS_CLOUDIO_THREADS / _CACHE_DIR / _BUNDLE env profiles
                     (no cache_dir: the drop-in's own default, ``~/.cache/pegasus-cloudio``).
    stager:          PEGASUS_CLOUDIO_STAGER on workers: the node stager's socket (docs/user-guide.md).
    p2p_redis, p2p_token_file, p2p_ca_file: peer-to-peer sharing between the workers' caches
                     (PEGASUS_CLOUDIO_P2P_REDIS / _TOKEN_FILE / _CA_FILE on the compute site; off
                     without p2p_redis). See docs/p2p.md.
    stage_clusters:  pegasus.stagein/stageout.clusters.
    cluster_size:    recommended horizontal clusters.size for small-file producers.
    """

    mode: str
    work_dir: str
    install_bin: str
    provider: Optional[str] = None
    compute_site: str = "condorpool"
    staging_site: Optional[str] = None
    bucket: Optional[str] = None
    prefix: str = "scratch"
    identity: str = "pegasus@amazon"
    endpoint: Optional[str] = None
    region: Optional[str] = None
    credentials: Optional[str] = None
    gcs_key: Optional[str] = None
    boto_config: Optional[str] = None
    gcs_endpoint: Optional[str] = None
    account: Optional[str] = None
    vm_scratch: str = "/mnt/data/scratch"
    vm_host: Optional[str] = None
    submit_host: Optional[str] = None
    ssh_key: Optional[str] = None
    ssh_port: Optional[int] = None
    worker_pegasus_home: str = "/usr"
    pegasus_bin: str = "/usr/bin"
    worker_package: str = "installed"
    threads: int = 8
    cache_dir: Optional[str] = None
    bundle: Optional[bool] = None
    p2p_redis: Optional[str] = None
    p2p_token_file: str = "/etc/pegasus-cloudio/pool.token"
    p2p_ca_file: str = "/etc/pegasus-cloudio/pool-ca.crt"
    stager: Optional[str] = None
    stage_clusters: int = 4
    cluster_size: int = 20

    @property
    def bundling(self) -> bool:
        """Bundling defaults to on for object stores only."""
        return Mode(self.mode).object_store if self.bundle is None else self.bundle

    @property
    def staging(self) -> str:
        if self.staging_site:
            return self.staging_site
        return f"{self.provider or 's3'}staging"

    @property
    def transfer_tool(self) -> str:
        return os.path.join(self.install_bin, "pegasus-cloudio-transfer")

    @property
    def shim_on_path(self) -> bool:
        """Whether local jobs get the shim first on PATH: when Pegasus runs ``pegasus-transfer`` by
        name on ``local`` (worker package staged, or submit-host mode's stage-worker job)."""
        return self.worker_package == "staged" or self.mode == Mode.SUBMIT

    @property
    def needs_overlay(self) -> bool:
        """Whether the set needs its own Pegasus home to plan from. ``pegasus-lite-local.sh`` puts
        ``$PEGASUS_BIN_DIR`` (the directory ``pegasus-plan`` ran from) first on PATH unless it is
        ``/usr/bin``, ahead of the shim; planning from the overlay makes that directory hold the shim."""
        return self.shim_on_path and os.path.normpath(self.pegasus_bin) != "/usr/bin"

    @property
    def overlay_dir(self) -> str:
        """The overlay Pegasus home: ``bin/`` links every tool of :attr:`pegasus_bin` but
        ``pegasus-transfer`` (the shim); its other entries link those beside :attr:`pegasus_bin`."""
        return os.path.join(self.work_dir, "pegasus")

    @property
    def shim_dir(self) -> str:
        """Where the generated ``pegasus-transfer`` shim lives (``bin/`` of the set)."""
        return os.path.join(self.work_dir, "bin")


def validate(opts: SetOptions) -> None:
    """Raise UsageError listing every bad or missing flag (one problem per line)."""
    found = problems(opts)
    if found:
        raise UsageError(*found)


def problems(opts: SetOptions) -> List[str]:
    """Every bad or missing flag, each a message starting with the flag's name."""
    out: List[str] = []
    _choice(out, "--mode", opts.mode, MODES)
    _choice(out, "--worker-package", opts.worker_package, WORKER_PACKAGE)
    for flag, value in (("--work-dir", opts.work_dir), ("--install-bin", opts.install_bin),
                        ("--worker-pegasus-home", opts.worker_pegasus_home), ("--cache-dir", opts.cache_dir),
                        ("--pegasus-bin", opts.pegasus_bin),
                        ("--vm-scratch", opts.vm_scratch), ("--credentials", opts.credentials),
                        ("--gcs-key", opts.gcs_key), ("--boto-config", opts.boto_config),
                        ("--ssh-key", opts.ssh_key), ("--p2p-token-file", opts.p2p_token_file),
                        ("--p2p-ca-file", opts.p2p_ca_file), ("--stager", opts.stager)):
        per_user = flag == "--p2p-token-file" and str(value).startswith("~/")  # each user's own copy
        if value is not None and not os.path.isabs(value) and not per_user:
            out.append(f"{flag} must be an absolute path (got {value!r})")
    for flag, site in (("--compute-site", opts.compute_site), ("--staging-site", opts.staging_site)):
        if site is not None and (not _SITE.match(site) or site == "local"):
            out.append(f"{flag} must be a site name of letters, digits and _ other than 'local' (got {site!r})")
    for flag, number, low in (("--threads", opts.threads, 1), ("--stage-clusters", opts.stage_clusters, 1),
                              ("--cluster-size", opts.cluster_size, 1)):
        if number < low:
            out.append(f"{flag} must be at least {low} (got {number})")
    if opts.needs_overlay and os.path.isabs(opts.pegasus_bin) and not os.path.isfile(
            os.path.join(opts.pegasus_bin, "pegasus-plan")):
        out.append(f"--pegasus-bin {opts.pegasus_bin} holds no pegasus-plan (the submit host's Pegasus bin)")
    if opts.p2p_redis and urlsplit(opts.p2p_redis).password:  # the message must not repeat it
        out.append("--p2p must not carry the Redis password: the URL goes into every job's environment, "
                   "which every pool user can read (condor_q -l); set PEGASUS_CLOUDIO_P2P_REDIS in the "
                   "workers' jobs.conf instead (docs/p2p.md)")
    if opts.ssh_port is not None and not 0 < opts.ssh_port < 65536:
        out.append(f"--ssh-port must be a TCP port (got {opts.ssh_port})")
    if opts.mode in MODES:
        {Mode.CLOUD: _cloud, Mode.VM: _vm, Mode.SUBMIT: _submit}[Mode(opts.mode)](opts, out)
    return out


def _choice(out: List[str], flag: str, value: Optional[str], choices: Tuple[str, ...]) -> bool:
    if value in choices:
        return True
    out.append(f"{flag} must be one of {', '.join(choices)} (got {value!r})")
    return False


def _only(out: List[str], mode: str, flags: Dict[str, object]) -> None:
    out.extend(f"{flag} applies only to --mode {mode}" for flag, value in flags.items() if value is not None)


def _cloud(opts: SetOptions, out: List[str]) -> None:
    provider_ok = _choice(out, "--provider", opts.provider, PROVIDERS)
    _only(out, Mode.VM.value, {"--vm-host": opts.vm_host})
    _only(out, Mode.SUBMIT.value, {"--submit-host": opts.submit_host, "--ssh-key": opts.ssh_key})
    if not opts.bucket:
        out.append("--bucket is required for --mode cloud-storage")
    elif not _BUCKET.match(opts.bucket) or ".." in opts.bucket:
        out.append(f"--bucket is not a valid bucket name (got {opts.bucket!r}): use 3-63 lower-case "
                       "letters, digits, '.' or '-', starting and ending with a letter or digit, no '..'")
    if opts.prefix.startswith("/") or not opts.prefix.strip("/"):
        out.append(f"--prefix must be a relative key prefix such as 'scratch' (got {opts.prefix!r})")
    if not provider_ok:
        return
    if opts.provider != "azure":
        _only(out, "cloud-storage --provider azure", {"--account": opts.account})
    if opts.provider != "gcs":
        _only(out, "cloud-storage --provider gcs", {"--gcs-key": opts.gcs_key, "--boto-config": opts.boto_config,
                                                    "--gcs-endpoint": opts.gcs_endpoint})
    if opts.provider == "s3":
        if not _IDENTITY.match(opts.identity):
            out.append(f"--identity must be USER@SITE (got {opts.identity!r})")
        elif opts.identity.split("@", 1)[1] != opts.identity.split("@", 1)[1].lower():
            site = opts.identity.split("@", 1)[1]
            out.append(f"--identity {opts.identity}: the site part must be lower case ({site.lower()}): "
                       f"Pegasus lower-cases an URL's host, so s3://{opts.identity}/ looks up the section "
                       f"[{site.lower()}], never [{site}]")
        if not opts.endpoint:
            out.append("--endpoint is required for --provider s3 (an https:// URL)")
        elif not opts.endpoint.startswith(("https://", "http://")):
            out.append(f"--endpoint must be an https:// or http:// URL (got {opts.endpoint!r}; "
                       f"did you mean https://{opts.endpoint}?)")
        if not opts.credentials:
            out.append("--credentials is required for --provider s3 (absolute path)")
        return
    _only(out, "cloud-storage --provider s3", {"--endpoint": opts.endpoint, "--region": opts.region,
                                               "--credentials": opts.credentials})
    if opts.provider == "gcs" and (not opts.gcs_key or not opts.boto_config):
        out.append("--gcs-key and --boto-config are required for --provider gcs (absolute paths)")
    if opts.provider == "azure":
        _azure(opts, out)


def _azure(opts: SetOptions, out: List[str]) -> None:
    if not opts.account or not _ACCOUNT.match(opts.account):
        out.append(f"--account is required for --provider azure: the storage account, 3 to 24 lower-case "
                   f"letters and digits (got {opts.account!r})")
    if opts.bucket and _BUCKET.match(opts.bucket) and not _CONTAINER.match(opts.bucket):
        out.append(f"--bucket is no Azure container name (got {opts.bucket!r}): use 3-63 lower-case letters, "
                   "digits and single '-', starting and ending with a letter or digit")


def _vm(opts: SetOptions, out: List[str]) -> None:
    _only(out, Mode.CLOUD.value, {"--provider": opts.provider, "--bucket": opts.bucket,
                                 "--staging-site": opts.staging_site, "--account": opts.account})
    _only(out, Mode.SUBMIT.value, {"--submit-host": opts.submit_host})
    if opts.vm_host is not None:
        if not _USER_HOST.match(opts.vm_host):
            out.append(f"--vm-host must be USER@HOST (got {opts.vm_host!r})")
        if not opts.ssh_key:
            out.append("--ssh-key is required with --vm-host")


def _submit(opts: SetOptions, out: List[str]) -> None:
    _only(out, Mode.CLOUD.value, {"--provider": opts.provider, "--bucket": opts.bucket,
                                 "--staging-site": opts.staging_site, "--account": opts.account})
    _only(out, Mode.VM.value, {"--vm-host": opts.vm_host})
    if not opts.submit_host or not _USER_HOST.match(opts.submit_host):
        out.append("--submit-host USER@HOST is required for --mode submit-host "
                   "(the planner requires the user part of scp URLs)")
    if not opts.ssh_key:
        out.append("--ssh-key is required for --mode submit-host (absolute path)")
