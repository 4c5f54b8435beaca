"""The umbrella CLI imports only the chosen subcommand; every console script has --version."""

from __future__ import annotations

import os
import subprocess
import sys

from pegasus_cloudio.version import __version__

LAZY = """
import sys
from pegasus_cloudio import cli
try:
    code = cli.main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("cryptography", "boto3", "Pegasus")
               or m.startswith(("pegasus_cloudio_bench", "pegasus_cloudio_testbed", "pegasus_cloudio.sites")))
print("HEAVY", heavy)
sys.exit(code)
"""


def _py(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, **kwargs)  # type: ignore[call-overload, no-any-return]


def test_cache_and_help_import_no_bench_testbed_or_sites(tmp_path: object) -> None:
    for argv in (["cache", "stats", "--dir", str(tmp_path)], ["--help"], ["bench", "--help"]):
        done = _py("-c", LAZY, *argv)
        assert done.returncode == 0, done.stderr
        assert "HEAVY []" in done.stdout, (argv, done.stdout)


def test_top_level_help_lists_every_command_without_importing_it() -> None:
    done = _py("-m", "pegasus_cloudio.cli", "--help")
    for word in ("bench", "sites", "cache"):
        assert f"    {word}" in done.stdout
    assert "``" not in done.stdout


def test_missing_extra_is_one_line_naming_it() -> None:
    blocked = "import sys; sys.modules['Pegasus'] = None; from pegasus_cloudio import cli; " \
              "sys.exit(cli.main(['sites', '--mode', 'submit-host', '--out', 'x']))"
    done = _py("-c", blocked)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "pegasus-cloudio sites needs the Python package 'Pegasus', which is not installed: "
        "pip install 'pegasus-cloudio[sites]'"]


def test_every_console_script_module_prints_its_version() -> None:
    for module, prog in (("pegasus_cloudio.cli", "pegasus-cloudio"),
                         ("pegasus_cloudio.dropin", "pegasus-cloudio-transfer"),
                         ("pegasus_cloudio.s3cli.main", "pegasus-cloudio-s3"),
                         ("pegasus_cloudio.condor.plugin", "pegasus-cloudio-condor-plugin")):
        done = _py("-m", module, "--version")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"{prog} {__version__} (Python "), done.stdout


def test_plugin_help_is_plain_text() -> None:
    done = _py("-m", "pegasus_cloudio.condor.plugin", "-help")
    assert done.returncode == 0 and done.stdout.startswith("usage: pegasus-cloudio-condor-plugin")
    assert "``" not in done.stdout and ":class:" not in done.stdout


def test_invalid_thread_setting_is_one_error_naming_it(tmp_path: object) -> None:
    for name, value in (("PEGASUS_CLOUDIO_THREADS", "lots"), ("PEGASUS_TRANSFER_THREADS", "0")):
        done = _py("-m", "pegasus_cloudio.dropin", input="[]", cwd=tmp_path,
                   env=dict(os.environ, **{name: value}))
        assert done.returncode == 1
        [critical] = [line for line in done.stderr.splitlines() if "CRITICAL" in line]
        source = " (from the environment)" if name.startswith("PEGASUS_CLOUDIO_") else ""  # its own knob: where from
        assert f"{name}{source} must be a whole number above 0 (got {value!r})" in critical
        assert "using 8" not in done.stderr
