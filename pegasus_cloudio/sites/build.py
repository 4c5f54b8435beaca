"""Build a catalog set with the Pegasus Python API and render it as text, deterministically.

:func:`render` returns ``{relative file name: text}``: ``sites.yml``, ``transformations.yml``,
``replicas.yml``, ``pegasus.properties`` and the ``bin/pegasus-transfer`` shim. The same
options always give byte-identical files (the API's ``x-pegasus`` creation stamp is replaced
by a fixed one), so the templates in ``site-catalogs/`` can be checked for drift.

Every set points ``pegasus::transfer`` (and, so that create-dir and cleanup jobs run it too,
``pegasus::dirmanager`` and ``pegasus::cleanup``) on ``local`` and the compute site at the
drop-in by absolute path, and sets the drop-in's knobs as ``env`` profiles (all strings).
"""

from __future__ import annotations

import io
import os
from typing import Dict, List, Optional, Tuple

from Pegasus import yaml as pegasus_yaml
from Pegasus.api import (
    OS,
    Arch,
    Directory,
    FileServer,
    Namespace,
    Operation,
    Properties,
    ReplicaCatalog,
    Site,
    SiteCatalog,
    Transformation,
    TransformationCatalog,
    TransformationSite,
)

from pegasus_cloudio.sites.modes import Mode
from pegasus_cloudio.sites.options import SetOptions

STAMP = {"apiLang": "python", "createdBy": "pegasus-cloudio sites"}
SHIM_MARKER = "pegasus-cloudio drop-in"
TRANSFER_TRANSFORMATIONS = ("transfer", "dirmanager", "cleanup")


def data_configuration(opts: SetOptions) -> str:
    return Mode(opts.mode).data_configuration


def staging_site(opts: SetOptions) -> str:
    """The site whose scratch holds intermediate files."""
    return {Mode.CLOUD: opts.staging, Mode.VM: opts.compute_site, Mode.SUBMIT: "local"}[Mode(opts.mode)]


def scp_url(user_host: str, port: Optional[int], path: str) -> str:
    return f"scp://{user_host}{f':{port}' if port else ''}{path}"


# -- sites ------------------------------------------------------------------------------------

def local_site(opts: SetOptions) -> Site:
    scratch, outputs = os.path.join(opts.work_dir, "scratch"), os.path.join(opts.work_dir, "outputs")
    scratch_url = "file://" + scratch
    if opts.mode == Mode.SUBMIT:
        scratch_url = scp_url(opts.submit_host or "", opts.ssh_port, scratch)
    site = Site("local", arch=Arch.X86_64, os_type=OS.LINUX).add_directories(
        Directory(Directory.SHARED_SCRATCH, scratch).add_file_servers(FileServer(scratch_url, Operation.ALL)),
        Directory(Directory.LOCAL_STORAGE, outputs).add_file_servers(
            FileServer("file://" + outputs, Operation.ALL)))
    if opts.mode == Mode.SUBMIT:
        site.add_profiles(Namespace.PEGASUS, key="SSH_PRIVATE_KEY", value=opts.ssh_key)
    site.add_env(**_env(opts, worker=False))
    return site


def compute_site(opts: SetOptions) -> Site:
    site = Site(opts.compute_site, arch=Arch.X86_64, os_type=OS.LINUX)
    site.add_pegasus_profile(style="condor")
    site.add_condor_profile(universe="vanilla")
    if opts.mode == Mode.VM:
        url = "file://" + opts.vm_scratch
        if opts.vm_host:
            url = scp_url(opts.vm_host, opts.ssh_port, opts.vm_scratch)
            site.add_profiles(Namespace.PEGASUS, key="SSH_PRIVATE_KEY", value=opts.ssh_key)
        site.add_directories(Directory(Directory.SHARED_SCRATCH, opts.vm_scratch, shared_file_system=True)
                             .add_file_servers(FileServer(url, Operation.ALL)))
        site.add_profiles(Namespace.PEGASUS, key="data.configuration", value="sharedfs")
        if not opts.vm_host:
            site.add_profiles(Namespace.PEGASUS, key="auxillary.local", value="true")
    site.add_env(**_env(opts, worker=True))
    return site


def bucket_site(opts: SetOptions) -> Site:
    path = f"/{opts.bucket}/{opts.prefix.strip('/')}"
    if opts.provider == "gcs":
        url = f"gs://{opts.bucket}/{opts.prefix.strip('/')}"
    elif opts.provider == "azure":  # no credential profile: Pegasus has none for Azure (docs/azure.md)
        url = f"az://{opts.account}{path}"
    else:
        url = f"s3://{opts.identity}{path}"
    site = Site(opts.staging).add_directories(
        Directory(Directory.SHARED_SCRATCH, path).add_file_servers(FileServer(url, Operation.ALL)))
    if opts.provider == "gcs":
        site.add_profiles(Namespace.PEGASUS, key="BOTO_CONFIG", value=opts.boto_config)
        site.add_profiles(Namespace.PEGASUS, key="GOOGLE_PKCS12", value=opts.gcs_key)
    elif opts.provider == "s3":
        site.add_profiles(Namespace.PEGASUS, key="pegasus_credentials", value=opts.credentials)
    return site


def _env(opts: SetOptions, *, worker: bool) -> Dict[str, str]:
    """The drop-in's knobs as env profiles (strings only, as the schema wants).

    With the worker package staged, local jobs that run ``pegasus-transfer`` by name get the
    shim first on PATH; with Pegasus installed on the workers, PEGASUS_HOME says where.
    """
    env = {"PEGASUS_CLOUDIO_THREADS": str(opts.threads)}
    if opts.bundling:
        env["PEGASUS_CLOUDIO_BUNDLE"] = "1"
    if opts.gcs_endpoint:
        env["PEGASUS_CLOUDIO_GCS_ENDPOINT"] = opts.gcs_endpoint
    if worker:
        if opts.cache_dir:
            env["PEGASUS_CLOUDIO_CACHE_DIR"] = opts.cache_dir
        if opts.stager:
            env["PEGASUS_CLOUDIO_STAGER"] = opts.stager
        if opts.p2p_redis:
            env.update(PEGASUS_CLOUDIO_P2P_REDIS=opts.p2p_redis, PEGASUS_CLOUDIO_P2P_TOKEN_FILE=opts.p2p_token_file,
                       PEGASUS_CLOUDIO_P2P_CA_FILE=opts.p2p_ca_file)
        if opts.worker_package == "installed":
            env["PEGASUS_HOME"] = opts.worker_pegasus_home
    elif opts.shim_on_path:
        env["PATH"] = ":".join(dict.fromkeys([opts.shim_dir, opts.pegasus_bin, "/usr/local/bin", "/usr/bin",
                                              "/bin"]))
    return env


def site_catalog(opts: SetOptions) -> SiteCatalog:
    catalog = SiteCatalog().add_sites(local_site(opts), compute_site(opts))
    if opts.mode == Mode.CLOUD:
        catalog.add_sites(bucket_site(opts))
    return catalog


# -- transformations, replicas, properties ---------------------------------------------------

def transformation_catalog(opts: SetOptions) -> TransformationCatalog:
    """``pegasus::transfer`` (no version: the planner looks it up with version null) and friends."""
    catalog = TransformationCatalog()
    for name in TRANSFER_TRANSFORMATIONS:
        transformation = Transformation(name, namespace="pegasus")
        for site in ("local", opts.compute_site):
            transformation.add_sites(TransformationSite(site, opts.transfer_tool, is_stageable=False))
        catalog.add_transformations(transformation)
    return catalog


def properties(opts: SetOptions) -> List[Tuple[str, str]]:
    """(key, value) pairs, in file order."""
    pairs = [
        ("pegasus.catalog.site.file", "sites.yml"),
        ("pegasus.catalog.transformation.file", "transformations.yml"),
        ("pegasus.catalog.replica", "YAML"),
        ("pegasus.catalog.replica.file", "replicas.yml"),
        ("pegasus.data.configuration", data_configuration(opts)),
        ("pegasus.transfer.threads", str(opts.threads)),
        ("pegasus.stagein.clusters", str(opts.stage_clusters)),
        ("pegasus.stageout.clusters", str(opts.stage_clusters)),
        ("pegasus.integrity.checking", "full"),
    ]
    if opts.worker_package == "installed":
        pairs.append(("pegasus.transfer.worker.package", "false"))
    return pairs


def _yaml_text(writable: object) -> str:
    buffer = io.StringIO()
    writable.write(buffer)  # type: ignore[attr-defined]
    data = pegasus_yaml.load(buffer.getvalue())
    data["x-pegasus"] = dict(STAMP)
    return str(pegasus_yaml.dump(data, sort_keys=False, allow_unicode=True))


def _properties_text(opts: SetOptions, header: str) -> str:
    props = Properties()
    for key, value in properties(opts):
        props[key] = value
    buffer = io.StringIO()
    props.write(buffer)
    return header + buffer.getvalue().rstrip("\n") + "\n"


def shim_text(opts: SetOptions) -> str:
    """``pegasus-transfer`` for basename invocations; the marker stops self-delegation."""
    return ("#!/bin/sh\n"
            f"# {SHIM_MARKER}: this pegasus-transfer runs pegasus-cloudio-transfer (same options and input).\n"
            "# Generated by `pegasus-cloudio sites`; keep it first on PATH only where Pegasus runs\n"
            "# pegasus-transfer by name (create-dir, cleanup and stage-worker jobs).\n"
            f"exec {opts.transfer_tool} \"$@\"\n")


def overlay_links(opts: SetOptions) -> Dict[str, str]:
    """``{relative link name: target}`` of the overlay Pegasus home (empty unless
    :attr:`SetOptions.needs_overlay`): ``pegasus/bin/<tool>`` -> the install's tool,
    ``pegasus/bin/pegasus-transfer`` -> the set's shim, ``pegasus/<entry>`` -> the install's
    other top-level entries (``lib``, ``share``, ``etc``), so the Pegasus tools run from the
    overlay find everything where they look (relative to ``$0``). Raises FileNotFoundError
    when ``pegasus_bin`` holds no ``pegasus-plan``."""
    if not opts.needs_overlay:
        return {}
    if not os.path.isfile(os.path.join(opts.pegasus_bin, "pegasus-plan")):
        raise FileNotFoundError(os.path.join(opts.pegasus_bin, "pegasus-plan"))
    home = os.path.dirname(os.path.normpath(opts.pegasus_bin))
    links = {f"pegasus/{name}": os.path.join(home, name) for name in sorted(os.listdir(home))
             if name != os.path.basename(os.path.normpath(opts.pegasus_bin)) and not name.startswith(".")}
    for name in sorted(os.listdir(opts.pegasus_bin)):
        links[f"pegasus/bin/{name}"] = os.path.join(opts.pegasus_bin, name)
    links["pegasus/bin/pegasus-transfer"] = "../../bin/pegasus-transfer"
    return links


def render(opts: SetOptions, properties_header: str = "", replicas_header: str = "") -> Dict[str, str]:
    """All files of the set, by relative name."""
    return {
        "sites.yml": _yaml_text(site_catalog(opts)),
        "transformations.yml": _yaml_text(transformation_catalog(opts)),
        "replicas.yml": replicas_header + _yaml_text(ReplicaCatalog()),
        "pegasus.properties": _properties_text(opts, properties_header),
        "bin/pegasus-transfer": shim_text(opts),
    }
