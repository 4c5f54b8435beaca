"""One row per URL scheme: every place that needs to know the schemes reads this table.

A row holds what the code elsewhere used to spell out as its own list of scheme names (compare
fsspec's ``known_implementations``, which keeps the class and the install hint together):

``module``
    the backend module serving the scheme, imported on first use by :mod:`transfer.backends`;
``family``
    what kind of store it is: ``"local"``, ``"s3"``, ``"gcs"``, ``"azure"``, ``"http"`` or ``"ssh"``;
    ``s3``/``s3s`` are one family (Pegasus writes both; the endpoint decides TLS);
``extra``
    the ``pegasus-cloudio[...]`` extra that installs its SDK, or None (standard library);
``object_store``
    a flat object namespace with directories by convention: bundles can serve it;
``exact_path``
    Pegasus hands such URLs to the store unparsed, so a key keeps its ``//``;
``plugin``
    the HTCondor plugin announces it among its methods;
``site_profiles``
    the Pegasus profiles a site catalog needs for it (checked by ``pegasus-cloudio sites``);
``pace_root``
    where the store's request limit applies (:func:`transfer.pacing.prefix_key`): the path
    segments before the object key (1: the bucket in an S3 path; 0: GCS, whose bucket is the
    host), or None: no key prefix to follow, the requests are paced by the key's directory;
``pace_depth``
    the key's leading directories that name the prefix the store limits: S3 partitions by key
    prefix and scales a busy one by splitting it, which no client sees, so the first directory
    under the bucket (the layout of one workflow's files); GCS documents its starting limit per
    bucket, Azure its target per storage account (0);
``read_rate``
    requests/s the store documents for reads per such prefix (the pool limiter's ceiling,
    :mod:`transfer.pacing_pool`), or None;
``https_hosts``
    host suffixes of ``https://`` URLs that name this scheme's objects, the store's own spelling
    (``https://ACCOUNT.blob.core.windows.net/C/B`` is ``az://ACCOUNT/C/B``): parsed as this scheme;
``knobs``
    the settings the backend's own modules read (``PEGASUS_CLOUDIO_<NAME>``, rows as
    :data:`transfer.knobs.TABLE`'s: name, default, unit, sources, what it does), which
    :mod:`transfer.knobs` lists, checks names against and documents beside the general ones;
    a row shared by two schemes of a family is listed once. A setting the library's
    :class:`transfer.Settings` carries to the backend as a plain value is a general knob.

A new backend adds its row here and its own modules; nothing else lists schemes or their settings. This module
imports nothing but :mod:`transfer.lean`: every job step parses URLs, and so reads it.
"""

from __future__ import annotations

from transfer.lean import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, FrozenSet, Optional, Tuple


@record(frozen=True)
class Scheme:
    """One URL scheme and what it brings (see the module docstring for each field)."""

    name: str
    module: str
    family: str
    extra: Optional[str] = None
    object_store: bool = False
    exact_path: bool = False
    plugin: bool = False
    site_profiles: Tuple[str, ...] = ()
    pace_root: Optional[int] = None
    pace_depth: int = 0
    read_rate: Optional[float] = None
    https_hosts: Tuple[str, ...] = ()
    knobs: Tuple[Tuple[str, str, str, str, str], ...] = ()


_LOCAL, _S3, _HTTP = "transfer.backends.local", "transfer.backends.s3", "transfer.backends.http"
_S3_PROFILES = ("pegasus_credentials",)
# GET/HEAD per second per prefix (S3); object reads per second per bucket at first (GCS); requests per second
# per storage account (Azure: its documented target; the account is the URL's host)
_S3_READS, _GCS_READS, _AZURE_READS = 5500.0, 5000.0, 20000.0
_EF = "env, file"

SCHEMES: Dict[str, Scheme] = {row.name: row for row in (
    Scheme("file", _LOCAL, "local"),
    Scheme("symlink", _LOCAL, "local"),
    Scheme("moveto", _LOCAL, "local"),
    Scheme("s3", _S3, "s3", object_store=True, exact_path=True, plugin=True, site_profiles=_S3_PROFILES,
           pace_root=1, pace_depth=1, read_rate=_S3_READS),
    Scheme("s3s", _S3, "s3", object_store=True, exact_path=True, site_profiles=_S3_PROFILES,
           pace_root=1, pace_depth=1, read_rate=_S3_READS),
    Scheme("gs", "transfer.backends.gcs", "gcs", extra="gcs", object_store=True, plugin=True,
           site_profiles=("boto_config", "google_pkcs12"), pace_root=0, pace_depth=0, read_rate=_GCS_READS,
           knobs=(("GCS_ANONYMOUS", "0", "flag", _EF, "GCS without credentials (public buckets)"),)),
    Scheme("az", "transfer.backends.azure", "azure", object_store=True, plugin=True,
           https_hosts=(".blob.core.windows.net",), pace_root=0, pace_depth=0, read_rate=_AZURE_READS,
           knobs=(("AZURE_CREDENTIAL", "", "name", _EF,
                   "az:// without a key or SAS: `managed-identity`, `workload-identity`, `cli` or `default` (the "
                   "`[azure]` extra's azure-identity), `none`; unset: workload identity when AZURE_FEDERATED_TOKEN_FILE, "
                   "AZURE_CLIENT_ID and AZURE_TENANT_ID are all set, else anonymous (docs/azure.md)"),)),
    Scheme("http", _HTTP, "http", plugin=True),
    Scheme("https", _HTTP, "http", plugin=True),
    Scheme("scp", "transfer.backends.sftp", "ssh", extra="sftp", site_profiles=("ssh_private_key",)),
    Scheme("sftp", "transfer.backends.sftp", "ssh", extra="sftp"),
)}


def _names(**wanted: object) -> FrozenSet[str]:
    return frozenset(name for name, row in SCHEMES.items()
                     if all(getattr(row, key) == value for key, value in wanted.items()))


LOCAL: FrozenSet[str] = _names(family="local")
OBJECT_STORES: FrozenSet[str] = _names(object_store=True)
EXACT_PATH: FrozenSet[str] = _names(exact_path=True)
S3: FrozenSet[str] = _names(family="s3")
HTTP: FrozenSet[str] = _names(family="http")
PLUGIN: Tuple[str, ...] = tuple(name for name, row in SCHEMES.items() if row.plugin)


_HTTPS_HOSTS: Tuple[Tuple[str, str], ...] = tuple((suffix, name) for name, row in SCHEMES.items()
                                                  for suffix in row.https_hosts)


def https_alias(host: str) -> Optional[Tuple[str, str]]:
    """(scheme, authority) of an ``https://`` URL's ``host`` when a row claims it: the first label
    before a suffix in ``https_hosts`` (one label, no port or user), else None."""
    lowered = host.lower()
    for suffix, name in _HTTPS_HOSTS:
        label = lowered[:-len(suffix)]
        if lowered.endswith(suffix) and label and "." not in label and ":" not in label and "@" not in label:
            return name, label
    return None


def knob_rows() -> Tuple[Tuple[str, str, str, str, str], ...]:
    """Every row's ``knobs``, in the registry's order, each name once."""
    seen: Dict[str, Tuple[str, str, str, str, str]] = {}
    for row in SCHEMES.values():
        for knob in row.knobs:
            seen.setdefault(knob[0], knob)
    return tuple(seen.values())


def family(scheme: str) -> Optional[str]:
    """The family of ``scheme`` (``"s3"`` for both ``s3`` and ``s3s``), None when unknown."""
    row = SCHEMES.get(scheme)
    return row.family if row is not None else None
