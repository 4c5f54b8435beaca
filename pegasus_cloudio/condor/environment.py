"""How settings and credentials reach the plugin on the execute node.

The plugin's effective environment is built from three layers, later ones winning:

1. the node configuration file named by ``PEGASUS_CLOUDIO_CONDOR_CONFIG`` (default
   ``/etc/pegasus-cloudio/condor-plugin.conf``, used if it exists): ``NAME = value`` lines,
   ``#`` comments; relative paths are taken from the file's directory; refused unless owned
   by root (or the plugin's user) and writable by its owner only;
2. the plugin's own environment (the starter's, e.g. ``PEGASUS_CREDENTIALS`` set by the
   administrator);
3. job environment variables ``<PLUGIN>_<NAME>`` of the job's ``environment`` submit
   command, read from the job ad (``$_CONDOR_JOB_AD``, see :mod:`.jobenv`: works on every
   HTCondor version) and from the plugin's environment (the starter copies them there from
   24.3 on; the same values). ``<PLUGIN>`` is derived from the plugin's file name exactly as
   HTCondor does it (see :func:`plugin_name`): installed as ``cloudio_plugin`` it is
   ``CLOUDIO``, so ``CLOUDIO_PEGASUS_CREDENTIALS=creds.conf`` sets ``PEGASUS_CREDENTIALS``.
   Relative paths are taken from the job's sandbox.

A GCS key of the node (layers 1-2) is used only with the node's GCS endpoint: when the job
(layer 3, or the job user's settings file) names the endpoint (``STORAGE_EMULATOR_HOST``,
``PEGASUS_CLOUDIO_GCS_ENDPOINT``), the node's keys are dropped (:func:`keep_node_keys_home`),
since the bearer token minted from them would go to a host of the job's choosing.

``HOME`` is kept only if the plugin's user owns it (:func:`_own_home`).

Only the names in :data:`ALLOWED` (and the ``PEGASUS_CREDENTIALS_<site>``,
``GOOGLE_PKCS12_<site>`` and ``PEGASUS_CLOUDIO_*`` families) are taken from layers 1 and 3. Secrets never are: a job's
environment is visible to anyone who can ``condor_q -l`` it, so keys belong in a credentials
file (permission-checked by the library); variables refused are reported by name only.
"""

from __future__ import annotations

import os
import pwd
from typing import Dict, List, Mapping, Optional, Set, Tuple

from pegasus_cloudio.condor.jobenv import job_environment
from transfer.knobs import PREFIX, is_known, uncommented
from transfer.lean import field, record
from transfer.named_files import OWN_LINKS, UnsafeFile, is_missing, read_file

NODE_CONFIG_VAR = "PEGASUS_CLOUDIO_CONDOR_CONFIG"
DEFAULT_NODE_CONFIG = "/etc/pegasus-cloudio/condor-plugin.conf"
METHODS_VAR = "PEGASUS_CLOUDIO_CONDOR_METHODS"
MAX_NODE_CONFIG_BYTES = 1 << 20

ALLOWED = frozenset({
    "PEGASUS_CREDENTIALS", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
    "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_PKCS12", "GOOGLE_CLOUD_PROJECT", "STORAGE_EMULATOR_HOST",
})
SITE_FAMILIES = ("PEGASUS_CREDENTIALS_", "GOOGLE_PKCS12_")  # <site> keeps its case
ALLOWED_FAMILIES = SITE_FAMILIES + ("PEGASUS_CLOUDIO_",)
PATH_VALUED = frozenset({
    "PEGASUS_CREDENTIALS", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_PKCS12", "PEGASUS_CLOUDIO_CA_BUNDLE", "PEGASUS_CLOUDIO_CONFIG", "PEGASUS_CLOUDIO_SSH_KNOWN_HOSTS",
})

PLUGIN_ENV = "the plugin's environment"
GCS_ENDPOINTS = ("PEGASUS_CLOUDIO_GCS_ENDPOINT", "STORAGE_EMULATOR_HOST")
GCS_KEYS = ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_PKCS12")  # and GOOGLE_PKCS12_<site>


class NodeConfigError(ValueError):
    """The node configuration file is unreadable or malformed (message names file and line)."""


def plugin_name(argv0: str) -> str:
    """HTCondor's name for a plugin at ``argv0``: basename cut at ``_plugin`` or the extension.

    ``/usr/libexec/condor/cloudio_plugin`` -> ``CLOUDIO``; ``my_plugin.py`` -> ``MY``;
    ``fetch.py`` -> ``FETCH``. The starter passes job variables ``<name>_*`` to the plugin.
    """
    base = os.path.basename(argv0)
    cut = base.find("_plugin")
    if cut < 0:
        dot = base.rfind(".")
        cut = dot if dot > 0 else len(base)
    return base[:cut].upper()


def accepted_name(name: str) -> Optional[str]:
    """The canonical variable for ``name`` if the plugin takes it from a config layer, else None.

    Names in :data:`ALLOWED` compare case-insensitively; in ``PEGASUS_CREDENTIALS_<site>`` and
    ``GOOGLE_PKCS12_<site>`` the site keeps its case (Pegasus site labels are case-sensitive).
    """
    upper = name.upper()
    if upper in ALLOWED:
        return upper
    for family in ALLOWED_FAMILIES:
        if upper.startswith(family) and len(name) > len(family):
            tail = name[len(family):]
            return family + (tail if family in SITE_FAMILIES else tail.upper())
    return None


@record
class PluginEnvironment:
    """The environment the transfer library sees, and where each taken variable came from."""

    env: Dict[str, str]
    origins: Dict[str, str] = field(default_factory=dict)
    refused: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)  # one line each, for the plugin's output
    from_node: Set[str] = field(default_factory=set)  # names whose value the node set (layers 1-2)

    def origin(self, name: str) -> str:
        """Human-readable source of ``name`` (e.g. "CLOUDIO_PEGASUS_CREDENTIALS in the job environment")."""
        return self.origins.get(name, PLUGIN_ENV)


def build_environment(process_env: Mapping[str, str], argv0: str, sandbox: str) -> PluginEnvironment:
    """Merge node file < process environment < ``<PLUGIN>_*`` job variables (see module doc).

    Raises NodeConfigError when the node file exists but cannot be used, JobAdError when
    the job ad named by ``_CONDOR_JOB_AD`` cannot be read.
    """
    result = PluginEnvironment(env={})
    config_path = process_env.get(NODE_CONFIG_VAR) or DEFAULT_NODE_CONFIG
    for name, value in read_node_config(config_path, explicit=bool(process_env.get(NODE_CONFIG_VAR))):
        result.env[name] = value
        result.origins[name] = f"node configuration {config_path}"
    result.env.update(process_env)
    for name in process_env:
        result.origins.pop(name, None)
    _own_home(result.env)
    prefix = plugin_name(argv0) + "_"
    # From 24.3 the starter copies the job's <PLUGIN>_* variables here, under those names.
    result.from_node = {name for name in result.env if not name.upper().startswith(prefix)}
    job_vars = {k: v for k, v in job_environment(process_env, result.warnings).items()
                if k.upper().startswith(prefix)}
    job_vars.update((k, v) for k, v in process_env.items() if k.upper().startswith(prefix))
    for raw, value in sorted(job_vars.items()):
        if not raw.upper().startswith(prefix) or len(raw) == len(prefix):
            continue
        target = accepted_name(raw[len(prefix):])
        if target is None:
            result.refused.append(raw)
            continue
        result.env[target] = _resolve(target, value, sandbox)
        result.origins[target] = f"{raw} in the job environment"
        result.from_node.discard(target)
    return result


def keep_node_keys_home(penv: PluginEnvironment) -> List[str]:
    """Drop the node's GCS keys from ``penv.env`` when the GCS endpoint in effect is not the
    node's; returns one line per key dropped (names only). Call on the final environment."""
    endpoint = next((name for name in GCS_ENDPOINTS if penv.env.get(name, "").strip()), None)
    if endpoint is None or endpoint in penv.from_node:
        return []
    chosen_by = penv.origins.get(endpoint, f"{endpoint} of the job user's settings file")
    notes = []
    for name in sorted(n for n in penv.env if n.startswith(GCS_KEYS) and n in penv.from_node):
        del penv.env[name]
        notes.append(f"not using the node's GCS key {name}: the GCS endpoint is chosen by {chosen_by}, "
                     "and the node's credentials go to the node's endpoint only")
    return notes


def configured_methods(process_env: Mapping[str, str]) -> Optional[str]:
    """The administrator's ``PEGASUS_CLOUDIO_CONDOR_METHODS``: plugin environment, then node file.

    Never raises (the ``-classad`` query must answer): an unusable node file counts as unset.
    """
    if process_env.get(METHODS_VAR):
        return process_env[METHODS_VAR]
    path = process_env.get(NODE_CONFIG_VAR) or DEFAULT_NODE_CONFIG
    try:
        return dict(read_node_config(path)).get(METHODS_VAR)
    except NodeConfigError:
        return None


def read_node_config(path: str, explicit: bool = False) -> List[Tuple[str, str]]:
    """``(name, value)`` pairs of a node configuration file; [] if absent and not ``explicit``."""
    try:
        data, st = read_file(path, MAX_NODE_CONFIG_BYTES, OWN_LINKS)
        _check_node_owned(path, st)
        lines = data.decode("utf-8").splitlines()
    except UnsafeFile as err:
        if not is_missing(err):
            raise NodeConfigError(f"cannot read node configuration {path}: {err.strerror}") from None
        if explicit:
            raise NodeConfigError(f"node configuration {path} not found (named by {NODE_CONFIG_VAR})") from None
        return []
    except UnicodeDecodeError:
        raise NodeConfigError(f"cannot read node configuration {path}: not UTF-8 text") from None
    pairs = []
    base = os.path.dirname(os.path.abspath(path))
    for number, line in enumerate(lines, 1):
        text = uncommented(line)
        if not text:
            continue
        name, sep, value = text.partition("=")
        target = accepted_name(name.strip()) if sep else None
        if target is not None and target.startswith(PREFIX) and not is_known(target):
            raise NodeConfigError(f"{path} line {number}: no setting is named {target}")
        if target is None:
            raise NodeConfigError(f"{path} line {number}: expected NAME = value with NAME one of "
                                  f"PEGASUS_CREDENTIALS[_<site>], PEGASUS_CLOUDIO_*, AWS_REGION, ...")
        pairs.append((target, _resolve(target, value.strip(), base)))
    return pairs


def _own_home(env: Dict[str, str]) -> None:
    """``HOME`` only if the plugin's user or root owns it, else that user's home from the
    password database: the starter hands on its own ``HOME`` (whoever started
    ``condor_master``), and the files found in another user's home (``~/.pegasus``, ``~/.aws``)
    would choose this job's credentials, endpoints and CA. Root's (``/root`` from a master
    started in a root shell) is the administrator's, trusted like the node's files."""
    uid = os.getuid()
    try:
        if env.get("HOME") and os.stat(env["HOME"]).st_uid in (uid, 0):
            return
    except OSError:
        pass
    try:
        env["HOME"] = pwd.getpwuid(uid).pw_dir
    except KeyError:
        env.pop("HOME", None)


def _check_node_owned(path: str, st: os.stat_result) -> None:
    """NodeConfigError unless only root (or the plugin's own user) can change the node file: it
    names every job's credentials, endpoints and CA, so no other pool user may write it."""
    if st.st_uid not in (0, os.getuid()):
        raise NodeConfigError(f"node configuration {path} is owned by uid {st.st_uid}, not root; "
                              f"fix with: chown root {path}")
    if st.st_mode & 0o022:
        raise NodeConfigError(f"node configuration {path} is writable by group/others (mode "
                              f"{st.st_mode & 0o7777:04o}); fix with: chmod 644 {path}")


def _resolve(name: str, value: str, base: str) -> str:
    """Path-valued variables: relative values are taken from ``base``."""
    path_valued = name in PATH_VALUED or name.startswith(SITE_FAMILIES)
    if path_valued and value and not os.path.isabs(value):
        return os.path.join(base, value)
    return value
