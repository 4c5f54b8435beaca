"""The scheme registry is the one list of URL schemes: every row names a backend module that
exists, and no other module of the library spells out a list of scheme names of its own."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from transfer import schemes

REPO = Path(__file__).resolve().parents[1]
RUNTIME = ("transfer", "pegasus_cloudio", "snakemake_storage_plugin_pegasus_cloudio")


def test_every_row_names_a_backend_module_that_exists() -> None:
    for name, row in schemes.SCHEMES.items():
        assert row.name == name
        assert importlib.util.find_spec(row.module) is not None, row
        assert row.family in ("local", "s3", "gcs", "azure", "http", "ssh"), row


def test_the_derived_sets_follow_the_rows() -> None:
    assert schemes.S3 == {"s3", "s3s"} and schemes.HTTP == {"http", "https"}
    assert schemes.OBJECT_STORES == {"s3", "s3s", "gs", "az"} and schemes.LOCAL == {"file", "symlink", "moveto"}
    assert schemes.PLUGIN == ("s3", "gs", "az", "http", "https")
    assert schemes.family("s3s") == "s3" and schemes.family("nope") is None


# Names that are also grammar or transport, not capabilities: pegasus-transfer's local URL forms
# (file, symlink, moveto) and an endpoint URL's http/https.
GRAMMAR = schemes.LOCAL | schemes.HTTP


def _scheme_lists(path: Path) -> list[str]:
    """Tuple, list and set literals in ``path`` holding two or more scheme names, one of them a
    store's (s3, gs, scp, ...): a list of schemes that should have been a registry column."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in schemes.SCHEMES]
            if len(names) >= 2 and set(names) - GRAMMAR:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {names}")
    return found


def test_no_module_but_the_registry_lists_schemes() -> None:
    # Allowed: the staging modes (each mode's schemes a catalog of that mode may use),
    # and pegasus-s3's URI prefixes, which are its command-line syntax, not a capability.
    allowed = {"transfer/schemes.py", "pegasus_cloudio/sites/modes.py", "pegasus_cloudio/s3cli/uri.py"}
    found = [hit for top in RUNTIME for path in sorted((REPO / top).rglob("*.py"))
             if str(path.relative_to(REPO)) not in allowed and "testbed" not in path.parts
             and "bench" not in path.parts for hit in _scheme_lists(path)]
    assert found == []


def test_a_schemes_own_settings_are_knobs_from_its_row_alone(tmp_path: Path) -> None:
    """A backend's own settings live in its registry row (a new backend touches no knob list):
    each is in the knob table, the config file accepts it, the environment does not warn of
    it, and looking up a general knob does not import the registry."""
    import subprocess
    import sys

    from transfer import knobs

    own = schemes.knob_rows()
    assert {row[0] for row in own} >= {"AZURE_CREDENTIAL", "GCS_ANONYMOUS"}
    assert all(row in knobs.TABLE and knobs.PREFIX + row[0] in knobs.KNOWN for row in own)
    assert not {row[0] for row in own} & {row[0] for row in knobs.GENERAL}
    conf = tmp_path / "cloudio.conf"
    conf.write_text("PEGASUS_CLOUDIO_AZURE_CREDENTIAL = none\n")
    assert knobs.read_config_file({"PEGASUS_CLOUDIO_CONFIG": str(conf)}) == {"PEGASUS_CLOUDIO_AZURE_CREDENTIAL": "none"}
    assert knobs.unknown_names({"PEGASUS_CLOUDIO_GCS_ANONYMOUS": "1", "PEGASUS_CLOUDIO_AZURE_CREDENTAL": "x"}) == \
        {"PEGASUS_CLOUDIO_AZURE_CREDENTAL": "PEGASUS_CLOUDIO_AZURE_CREDENTIAL"}
    probe = ("import sys; from transfer import knobs; "
             "knobs.layered({'PEGASUS_CLOUDIO_THREADS': '4'}, config_file=False); "
             "print('transfer.schemes' in sys.modules, knobs.is_known('PEGASUS_CLOUDIO_AZURE_CREDENTIAL'), "
             "'transfer.schemes' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.split() == ["False", "True", "True"], done
