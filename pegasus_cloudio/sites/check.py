"""Check a written catalog set the way the planner will read it.

:func:`check_set` returns a list of problems (empty = good):

* every file loads with Pegasus's own loaders (``Pegasus.site_catalog.load``,
  ``Pegasus.transformation_catalog.load``, ``Pegasus.replica_catalog.load``,
  ``Pegasus.api.Properties.load``) and every property key is one Pegasus knows;
* every profile value is a string (the sc-5.0/tc-5.0 schemas reject YAML booleans, and the
  planner lower-cases nothing else for us);
* the mode's required directories and file servers exist: scratch and output storage on
  ``local``, a shared-scratch directory with a file server of the right scheme on the staging
  site, credentials profiles for that scheme, and ``pegasus::transfer`` (version-less,
  installed, absolute path) on ``local`` and the compute site;
* the ``pegasus-transfer`` shim carries the marker that stops the drop-in delegating to itself,
  and the overlay Pegasus home (when the set has one) runs the planner and resolves
  ``pegasus-transfer`` to that shim.

The Pegasus JSON schemas are not shipped by any Pegasus wheel, so no schema validation is done.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

from Pegasus import replica_catalog, site_catalog, transformation_catalog
from Pegasus import yaml as pegasus_yaml
from Pegasus.api import Properties

from transfer import schemes

from pegasus_cloudio.sites.build import SHIM_MARKER, data_configuration, staging_site
from pegasus_cloudio.sites.modes import Mode
from pegasus_cloudio.sites.options import SetOptions

LOADERS = {"sites.yml": site_catalog.load, "transformations.yml": transformation_catalog.load,
           "replicas.yml": replica_catalog.load}


def check_set(directory: str, opts: SetOptions) -> List[str]:
    """Problems found in the set written to ``directory`` for ``opts``."""
    problems: List[str] = []
    docs: Dict[str, Any] = {}
    for name, loader in LOADERS.items():
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as fh:
                loader(fh)
            with open(path, encoding="utf-8") as fh:
                docs[name] = pegasus_yaml.load(fh)
        except Exception as err:  # noqa: BLE001 - any loader failure is a finding
            problems.append(f"{name}: Pegasus loader failed: {type(err).__name__}: {err}")
    props = _properties(os.path.join(directory, "pegasus.properties"), problems)
    if len(docs) < len(LOADERS) or props is None:
        return problems
    for where, value in _profile_values(docs["sites.yml"], "sites.yml"):
        problems.append(f"{where}: profile value {value!r} is not a string")
    for where, value in _profile_values(docs["transformations.yml"], "transformations.yml"):
        problems.append(f"{where}: profile value {value!r} is not a string")
    problems += _check_sites(docs["sites.yml"], opts)
    problems += _check_transformations(docs["transformations.yml"], opts)
    if props.get("pegasus.data.configuration") != data_configuration(opts):
        problems.append(f"pegasus.properties: pegasus.data.configuration must be {data_configuration(opts)}")
    problems += _check_shim(os.path.join(directory, "bin", "pegasus-transfer"))
    if opts.needs_overlay:
        problems += _check_overlay(directory)
    return problems


def _check_overlay(directory: str) -> List[str]:
    """``pegasus/bin`` runs the planner and resolves ``pegasus-transfer`` to the shim."""
    bin_dir = os.path.join(directory, "pegasus", "bin")
    problems = [] if os.path.isfile(os.path.join(bin_dir, "pegasus-plan")) else [
        "pegasus/bin/pegasus-plan: missing or a dangling link"]
    shim = os.path.join(directory, "bin", "pegasus-transfer")
    linked = os.path.join(bin_dir, "pegasus-transfer")
    if not (os.path.exists(linked) and os.path.exists(shim) and os.path.samefile(linked, shim)):
        problems.append("pegasus/bin/pegasus-transfer: must be the set's bin/pegasus-transfer")
    return problems


def _properties(path: str, problems: List[str]) -> Optional[Dict[str, str]]:
    try:
        loaded = Properties.load(path)
    except Exception as err:  # noqa: BLE001
        problems.append(f"pegasus.properties: Pegasus loader failed: {type(err).__name__}: {err}")
        return None
    values = dict(loaded._conf.defaults())  # noqa: SLF001 - Properties keeps them in DEFAULT
    problems += [f"pegasus.properties: unknown property {k}" for k in values if not Properties._check_key(k)]
    return values


def _profile_values(doc: Any, where: str) -> Iterator[Tuple[str, Any]]:
    """(location, value) of every profile value that is not a string."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "profiles" and isinstance(value, dict):
                for namespace, entries in value.items():
                    for name, item in (entries or {}).items():
                        if not isinstance(item, str):
                            yield f"{where}: {namespace}.{name}", item
            else:
                yield from _profile_values(value, where)
    elif isinstance(doc, list):
        for item in doc:
            yield from _profile_values(item, where)


def _directories(site: Dict[str, Any], kind: str) -> List[Dict[str, Any]]:
    return [d for d in site.get("directories") or [] if d.get("type") == kind and d.get("fileServers")]


def _check_sites(doc: Dict[str, Any], opts: SetOptions) -> List[str]:
    sites = {s["name"]: s for s in doc.get("sites") or []}
    problems = [f"sites.yml: site '{n}' is missing" for n in ("local", opts.compute_site, staging_site(opts))
                if n not in sites]
    if problems:
        return problems
    for kind in ("sharedScratch", "localStorage"):
        if not _directories(sites["local"], kind):
            problems.append(f"sites.yml: site 'local' needs a {kind} directory with a file server")
    staging = sites[staging_site(opts)]
    scratch = _directories(staging, "sharedScratch")
    if not scratch:
        return problems + [f"sites.yml: staging site '{staging['name']}' needs a sharedScratch directory "
                           "with a file server"]
    wanted = Mode(opts.mode).scratch_schemes(opts.provider)
    for server in scratch[0]["fileServers"]:
        scheme = server["url"].split(":", 1)[0]
        if scheme not in wanted:
            problems.append(f"sites.yml: {server['url']} should use {' or '.join(wanted)}://")
        problems += _credential_problems(staging, scheme, server["url"])
    if opts.mode == Mode.VM and not scratch[0].get("sharedFileSystem"):
        problems.append("sites.yml: the VM scratch directory must have sharedFileSystem: true")
    return problems


def _credential_problems(site: Dict[str, Any], scheme: str, url: str) -> List[str]:
    keys = {k.lower() for k in ((site.get("profiles") or {}).get("pegasus") or {})}
    row = schemes.SCHEMES.get(scheme)
    needed = row.site_profiles if row is not None else ()
    problems = [f"sites.yml: site '{site['name']}' needs the pegasus profile {k} for {scheme}://"
                for k in needed if k not in keys]
    if scheme == "scp" and "@" not in url.split("/")[2]:
        problems.append(f"sites.yml: {url} needs USER@ (the planner requires it for scp)")
    return problems


def _check_transformations(doc: Dict[str, Any], opts: SetOptions) -> List[str]:
    problems = []
    entries = [t for t in doc.get("transformations") or []
               if t.get("namespace") == "pegasus" and t.get("name") == "transfer"]
    if len(entries) != 1 or "version" in entries[0]:
        return ["transformations.yml: exactly one pegasus::transfer without a version is needed"]
    sites = {s["name"]: s for s in entries[0].get("sites") or []}
    for name in ("local", opts.compute_site):
        site = sites.get(name)
        if site is None or site.get("type") != "installed" or not os.path.isabs(site.get("pfn", "")):
            problems.append(f"transformations.yml: pegasus::transfer needs an installed entry with an "
                            f"absolute pfn on site '{name}'")
    return problems


def _check_shim(path: str) -> List[str]:
    try:
        with open(path, "rb") as fh:
            text = fh.read(4096)
    except OSError as err:
        return [f"bin/pegasus-transfer: {err.strerror}"]
    problems = [] if SHIM_MARKER.encode() in text else ["bin/pegasus-transfer: marker line missing"]
    if not os.access(path, os.X_OK):
        problems.append("bin/pegasus-transfer: not executable")
    return problems
