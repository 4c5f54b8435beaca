"""`pegasus-cloudio sites`: every mode's set loads through the Pegasus Python API, passes the
checks, matches the committed templates; bad flags are one line naming the flag (exit 2)."""

import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from Pegasus import site_catalog, transformation_catalog
from Pegasus.api import Properties

from pegasus_cloudio.dropin.stock import find_stock_transfer
from pegasus_cloudio.sites import cli
from pegasus_cloudio.sites.check import check_set
from pegasus_cloudio.sites.templates import TEMPLATES, argv_for

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "pegasus_cloudio.cli", "sites"]
VENV_BIN = os.path.dirname(sys.executable)


def generate(name, out, *extra):
    """Generate template ``name`` into ``out``; returns (rc, parsed options)."""
    argv = argv_for(name, str(out)) + list(extra)
    args = cli._parser().parse_args(argv)
    return cli.main(args), cli.options_from_args(args)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_mode_loads_through_the_pegasus_api_and_passes_the_checks(name, tmp_path):
    rc, opts = generate(name, tmp_path)
    assert rc == 0
    assert check_set(str(tmp_path), opts) == []
    with open(tmp_path / "sites.yml") as fh:
        sites = site_catalog.load(fh)
    with open(tmp_path / "transformations.yml") as fh:
        tc = transformation_catalog.load(fh)
    assert {"local", "condorpool"} <= set(sites.sites)
    transfer = tc.transformations["pegasus::transfer::None"]
    assert {s.name: s.pfn for s in transfer.sites.values()} == {
        "local": "/opt/pegasus-cloudio/bin/pegasus-cloudio-transfer",
        "condorpool": "/opt/pegasus-cloudio/bin/pegasus-cloudio-transfer"}
    env = sites.sites["condorpool"].profiles["env"]
    assert env["PEGASUS_CLOUDIO_THREADS"] == "8"
    assert "PEGASUS_CLOUDIO_CACHE_DIR" not in env  # one cache default: the drop-in's own
    props = Properties.load(str(tmp_path / "pegasus.properties"))
    assert props["pegasus.transfer.worker.package"] == "false"


def test_modes_put_scratch_where_they_say(tmp_path):
    layouts = {"s3-cloud-storage": ("s3staging", "s3://pegasus@amazon/my-pegasus-bucket/scratch"),
               "gcs-cloud-storage": ("gcsstaging", "gs://my-pegasus-bucket/scratch"),
               "azure-cloud-storage": ("azurestaging", "az://mystorageaccount/my-pegasus-container/scratch"),
               "vm-storage": ("condorpool", "file:///mnt/data/scratch"),
               "submit-host-scp": ("local", "scp://pegasus@submit.example.org/home/user/wf/scratch")}
    for name, (site, url) in layouts.items():
        assert generate(name, tmp_path / name)[0] == 0
        with open(tmp_path / name / "sites.yml") as fh:
            sites = site_catalog.load(fh)
        scratch = [d for d in sites.sites[site].directories if d.directory_type == "sharedScratch"]
        assert [fs.url for fs in scratch[0].file_servers] == [url], name
    bundled = Properties.load(str(tmp_path / "vm-storage" / "pegasus.properties"))
    assert bundled["pegasus.data.configuration"] == "sharedfs"
    assert "PEGASUS_CLOUDIO_BUNDLE: '1'" in (tmp_path / "s3-cloud-storage" / "sites.yml").read_text()
    assert "PEGASUS_CLOUDIO_BUNDLE" not in (tmp_path / "submit-host-scp" / "sites.yml").read_text()


def test_committed_templates_match_the_generator(tmp_path):
    for name in TEMPLATES:
        assert generate(name, tmp_path / name)[0] == 0
        committed = REPO / "site-catalogs" / name
        for root, _dirs, files in os.walk(tmp_path / name):
            for f in files:
                rel = os.path.relpath(os.path.join(root, f), tmp_path / name)
                assert filecmp.cmp(os.path.join(root, f), committed / rel, shallow=False), f"{name}/{rel} drifted"
        made = sorted(str(p.relative_to(tmp_path / name)) for p in (tmp_path / name).rglob("*") if p.is_file())
        kept = sorted(str(p.relative_to(committed)) for p in committed.rglob("*") if p.is_file())
        assert made == kept
        assert os.access(committed / "bin" / "pegasus-transfer", os.X_OK)


@pytest.mark.parametrize("argv, flag", [
    (["--mode", "cloud-storage", "--provider", "s3"], "--bucket"),
    (["--mode", "cloud-storage", "--provider", "ftp", "--bucket", "b1b"], "--provider"),
    (["--mode", "cloud-storage", "--provider", "azure", "--bucket", "b1b"], "--account"),
    (["--mode", "cloud-storage", "--provider", "azure", "--account", "Mine", "--bucket", "b1b"], "--account"),
    (["--mode", "cloud-storage", "--provider", "azure", "--account", "mine", "--bucket", "my_box"], "--bucket"),
    (["--mode", "cloud-storage", "--provider", "azure", "--account", "mine", "--bucket", "a--b"], "--bucket"),
    (["--mode", "cloud-storage", "--provider", "s3", "--bucket", "b1b", "--account", "mine"], "--account"),
    (["--mode", "vm-storage", "--account", "mine"], "--account"),
    (["--mode", "hpc"], "--mode"),
    (["--mode", "vm-storage", "--provider", "gcs"], "--provider"),
    (["--mode", "vm-storage", "--threads", "many"], "--threads"),
    (["--mode", "vm-storage", "--work-dir", "relative/dir"], "--work-dir"),
    (["--mode", "submit-host", "--ssh-key", "/k"], "--submit-host"),
    (["--mode", "cloud-storage", "--provider", "s3", "--bucket", "Bad_Bucket!"], "--bucket"),
    (["--mode", "vm-storage", "--compute-site", "local"], "--compute-site"),
])
def test_bad_flags_are_one_line_naming_the_flag(argv, flag, tmp_path, capsys):
    args = cli._parser().parse_args(argv + ["--out", str(tmp_path / "out")])
    assert cli.main(args) == 2
    lines = capsys.readouterr().err.splitlines()
    assert all(line.startswith("pegasus-cloudio sites: --") for line in lines)
    assert any(line.startswith(f"pegasus-cloudio sites: {flag}") for line in lines), lines
    assert not (tmp_path / "out").exists()


def test_every_missing_option_is_reported_at_once(capsys):
    args = cli._parser().parse_args(["--mode", "cloud-storage", "--provider", "s3", "--threads", "x"])
    assert cli.main(args) == 2
    flags = [line.split()[2] for line in capsys.readouterr().err.splitlines()]
    assert flags == ["--out", "--threads", "--bucket", "--endpoint"]


def test_submit_host_puts_the_shim_first_on_local_path_and_cache_dir_is_opt_in(tmp_path):
    assert generate("submit-host-scp", tmp_path / "a", "--cache-dir", "/scratch/cache")[0] == 0
    with open(tmp_path / "a" / "sites.yml") as fh:
        sites = site_catalog.load(fh)
    assert sites.sites["local"].profiles["env"]["PATH"].split(":")[:2] == ["/home/user/wf/bin", "/usr/bin"]
    assert sites.sites["condorpool"].profiles["env"]["PEGASUS_CLOUDIO_CACHE_DIR"] == "/scratch/cache"
    readme = (tmp_path / "a" / "README.md").read_text()
    assert "stage_worker_local_" in readme and "worker-bundle" in readme and "forthcoming" not in readme


def test_the_umbrella_command_wires_sites(tmp_path):
    done = subprocess.run(CLI + ["--mode", "vm-storage", "--out", str(tmp_path), "--install-bin", VENV_BIN],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "sites.yml").is_file() and str(tmp_path) in (tmp_path / "sites.yml").read_text()
    again = subprocess.run(CLI + ["--mode", "vm-storage", "--out", str(tmp_path)], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 2 and "--force" in again.stderr and again.stderr.count("\n") == 1
    bad = subprocess.run(CLI + ["--mode", "nope", "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--mode" in bad.stderr


def test_checks_catch_broken_sets(tmp_path):
    rc, opts = generate("s3-cloud-storage", tmp_path)
    assert rc == 0
    sites = tmp_path / "sites.yml"
    sites.write_text(sites.read_text().replace("PEGASUS_CLOUDIO_THREADS: '8'", "PEGASUS_CLOUDIO_THREADS: 8")
                     .replace("pegasus_credentials:", "other_key:"))
    tc = tmp_path / "transformations.yml"
    tc.write_text(tc.read_text().replace("pfn: /opt/pegasus-cloudio/bin/pegasus-cloudio-transfer", "pfn: relative", 1))
    (tmp_path / "pegasus.properties").write_text("pegasus.data.configuration = condorio\npegasus.no.such = 1\n")
    shim = tmp_path / "bin" / "pegasus-transfer"
    shim.write_text("#!/bin/sh\nexec pegasus-transfer \"$@\"\n")
    problems = "\n".join(check_set(str(tmp_path), opts))
    for expected in ("is not a string", "pegasus_credentials", "absolute pfn on site 'local'",
                     "pegasus.data.configuration must be nonsharedfs", "unknown property pegasus.no.such",
                     "marker line missing"):
        assert expected in problems
    (tmp_path / "replicas.yml").write_text("replicas: [{lfn: x}]\n")
    assert "replicas.yml: Pegasus loader failed" in "\n".join(check_set(str(tmp_path), opts))


def test_shim_runs_the_dropin_and_is_never_taken_for_the_stock_tool(tmp_path):
    rc, _ = generate("vm-storage", tmp_path, "--install-bin", VENV_BIN)
    assert rc == 0
    shim = tmp_path / "bin" / "pegasus-transfer"
    (tmp_path / "a").write_text("a")
    spec = json.dumps([{"type": "transfer", "lfn": "a", "src_urls": [{"site_label": "local", "url": f"file://{tmp_path}/a"}],
                        "dest_urls": [{"site_label": "local", "url": f"file://{tmp_path}/copy/a"}]}])
    done = subprocess.run([str(shim), "--threads", "2"], input=spec, capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull})
    assert done.returncode == 0 and "All transfers completed successfully." in done.stderr
    assert (tmp_path / "copy" / "a").read_text() == "a"
    assert find_stock_transfer({"PATH": f"{tmp_path / 'bin'}:/nonexistent"}) is None


def test_vm_storage_on_a_separate_vm_uses_scp_with_a_shipped_key(tmp_path):
    rc, opts = generate("vm-storage", tmp_path, "--vm-host", "pegasus@vm.example.org", "--ssh-key", "/home/user/.ssh/k",
                        "--ssh-port", "2222")
    assert rc == 0 and check_set(str(tmp_path), opts) == []
    with open(tmp_path / "sites.yml") as fh:
        vm = site_catalog.load(fh).sites["condorpool"]
    assert vm.directories[0].file_servers[0].url == "scp://pegasus@vm.example.org:2222/mnt/data/scratch"
    assert vm.profiles["pegasus"]["SSH_PRIVATE_KEY"] == "/home/user/.ssh/k"
    assert "auxillary.local" not in vm.profiles["pegasus"]


def test_staged_worker_package_puts_the_shim_first_on_local_path(tmp_path):
    rc, opts = generate("s3-cloud-storage", tmp_path, "--worker-package", "staged")
    assert rc == 0 and check_set(str(tmp_path), opts) == []
    with open(tmp_path / "sites.yml") as fh:
        sites = site_catalog.load(fh).sites
    assert sites["local"].profiles["env"]["PATH"].startswith("/home/user/wf/bin:/usr/bin")
    assert "PEGASUS_HOME" not in sites["condorpool"].profiles["env"]
    assert "pegasus.transfer.worker.package" not in (tmp_path / "pegasus.properties").read_text().split("\n\n", 1)[1]


def test_stager_socket_goes_to_workers_and_the_readme(tmp_path, capsys):
    assert generate("s3-cloud-storage", tmp_path / "a", "--stager", "/run/user/1000/pc/stager.sock")[0] == 0
    with open(tmp_path / "a" / "sites.yml") as fh:
        sites = site_catalog.load(fh)
    assert sites.sites["condorpool"].profiles["env"]["PEGASUS_CLOUDIO_STAGER"] == "/run/user/1000/pc/stager.sock"
    assert "PEGASUS_CLOUDIO_STAGER" not in sites.sites["local"].profiles.get("env", {})
    assert "pegasus-cloudio stager --socket /run/user/1000/pc/stager.sock" in (tmp_path / "a" / "README.md").read_text()
    capsys.readouterr()
    assert cli.main(cli._parser().parse_args(argv_for("s3-cloud-storage", str(tmp_path / "b")) +
                                             ["--stager", "relative.sock"])) == 2
    assert "--stager must be an absolute path (got 'relative.sock')" in capsys.readouterr().err


def _fake_pegasus(root: Path) -> Path:
    """A Pegasus tarball's layout: bin/ with tools, lib/, share/."""
    for name in ("pegasus-plan", "pegasus-kickstart", "pegasus-transfer"):
        tool = root / "bin" / name
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.write_text(f"#!/bin/sh\necho {name}\n")
        tool.chmod(0o755)
    (root / "lib" / "pegasus").mkdir(parents=True)
    (root / "share" / "pegasus" / "sh").mkdir(parents=True)
    return root / "bin"


def test_tarball_pegasus_gets_an_overlay_home_whose_pegasus_transfer_is_the_shim(tmp_path):
    pegasus_bin = _fake_pegasus(tmp_path / "pegasus-5.1.2")
    rc, opts = generate("submit-host-scp", tmp_path / "set", "--pegasus-bin", str(pegasus_bin))
    assert rc == 0 and check_set(str(tmp_path / "set"), opts) == []
    overlay = tmp_path / "set" / "pegasus"
    assert os.readlink(overlay / "bin" / "pegasus-plan") == str(pegasus_bin / "pegasus-plan")
    assert os.readlink(overlay / "lib") == str(tmp_path / "pegasus-5.1.2" / "lib")
    assert (overlay / "share" / "pegasus" / "sh").is_dir()
    assert os.path.samefile(overlay / "bin" / "pegasus-transfer", tmp_path / "set" / "bin" / "pegasus-transfer")
    readme = (tmp_path / "set" / "README.md").read_text()
    assert "\npegasus/bin/pegasus-plan --conf pegasus.properties" in readme and "`pegasus/`" in readme
    # Packages (/usr/bin) and modes that never run pegasus-transfer by name need no overlay.
    assert generate("submit-host-scp", tmp_path / "usr")[0] == 0 and not (tmp_path / "usr" / "pegasus").exists()
    assert generate("s3-cloud-storage", tmp_path / "s3", "--pegasus-bin", str(pegasus_bin))[0] == 0
    assert not (tmp_path / "s3" / "pegasus").exists()


def test_pegasus_bin_without_a_planner_is_one_line_naming_the_flag(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    argv = argv_for("submit-host-scp", str(tmp_path / "set")) + ["--pegasus-bin", str(tmp_path / "empty")]
    assert cli.main(cli._parser().parse_args(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--pegasus-bin {tmp_path / 'empty'} holds no pegasus-plan" in err
    assert not (tmp_path / "set").exists()


def _readme_block(readme: str, after: str) -> str:
    """The first ```sh block after the line starting with ``after``."""
    rest = readme[readme.index(after):]
    return rest.split("```sh\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_readme_says_how_workers_get_the_tool_and_regenerates_its_set(name, tmp_path):
    """No index serves pegasus-cloudio: the README installs the wheel into a venv at the path the
    catalogs name; its "Generated by" command, run in the set's directory, writes the same set."""
    out = tmp_path / "set"
    assert generate(name, out)[0] == 0
    readme = (out / "README.md").read_text()
    assert "pip install pegasus-cloudio" not in readme and "No package index serves pegasus-cloudio" in readme
    workers = _readme_block(readme, "## Workers")
    assert workers.startswith("python3 -m venv /opt/pegasus-cloudio\n"), workers
    assert "/opt/pegasus-cloudio/bin/pip install '/path/to/pegasus_cloudio-" in workers
    assert "same path on each of them" in readme
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    command = _readme_block(readme, "Generated by").strip()
    assert command.startswith("pegasus-cloudio sites ") and command.endswith(" --out . --force")
    done = subprocess.run(CLI + command.split()[2:], cwd=out, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_readmes_of_sets_without_a_bucket_speak_of_files(tmp_path):
    for name in ("vm-storage", "submit-host-scp"):
        assert generate(name, tmp_path / name)[0] == 0
        assert "object" not in (tmp_path / name / "README.md").read_text(), name


@pytest.mark.parametrize("argv, says", [
    (["--identity", "Me@Amazon"], "--identity Me@Amazon: the site part must be lower case (amazon)"),
    (["--endpoint", "s3.amazonaws.com"], "--endpoint must be an https:// or http:// URL (got 's3.amazonaws.com'; "
                                         "did you mean https://s3.amazonaws.com?)"),
    (["--bucket", "My_Bucket"], "--bucket is not a valid bucket name (got 'My_Bucket'): use 3-63 lower-case"),
])
def test_s3_flags_a_user_gets_wrong_say_why(argv, says, tmp_path):
    done = subprocess.run(CLI + argv_for("s3-cloud-storage", str(tmp_path / "out")) + argv, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_bad_flag_prints_the_sites_usage_not_the_top_level_one(tmp_path):
    done = subprocess.run(CLI + ["--mode", "vm-storage", "--out", str(tmp_path / "o"), "--no-such-flag"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: pegasus-cloudio sites ") and "COMMAND" not in done.stderr, done.stderr
    assert "unrecognized arguments: --no-such-flag" in done.stderr
    assert not (tmp_path / "o").exists()


def test_cloud_storage_readmes_say_when_bundles_and_the_cache_remove_request_load(tmp_path):
    assert generate("s3-cloud-storage", tmp_path / "s3")[0] == 0
    s3 = " ".join((tmp_path / "s3" / "README.md").read_text().split())
    assert "## Many jobs on one bucket" in s3 and "5,500 GETs" in s3 and "bundles are on in this set" in s3
    assert "node cache on when the jobs of a node read the same inputs" in s3
    assert generate("s3-cloud-storage", tmp_path / "plain", "--no-bundle")[0] == 0
    assert "regenerate with `--bundle`" in (tmp_path / "plain" / "README.md").read_text()
    assert generate("submit-host-scp", tmp_path / "scp")[0] == 0
    assert "Many jobs on one bucket" not in (tmp_path / "scp" / "README.md").read_text()


def test_the_readmes_worker_bundle_command_run_literally_keeps_the_submit_hosts_tool(tmp_path):
    """The README said `pegasus-cloudio worker-bundle <the catalogs' tool path>` on the submit
    host: run as written, it replaced the submit host's installed pegasus-cloudio-transfer (the
    C front end) with the Python bundle. It now writes beside it and says where to copy it."""
    import re
    install = tmp_path / "venv" / "bin"
    install.mkdir(parents=True)
    tool = install / "pegasus-cloudio-transfer"
    tool.write_bytes(b"the installed front end")
    assert generate("s3-cloud-storage", tmp_path / "wf", "--install-bin", str(install))[0] == 0
    readme = (tmp_path / "wf" / "README.md").read_text()
    command = re.search(r"`pegasus-cloudio (worker-bundle [^`]+)`", readme).group(1).split()
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", *command], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert tool.read_bytes() == b"the installed front end"
    bundle = Path(command[1])
    assert bundle.parent == install and f"copy it to every worker as `{tool}`" in readme, readme
    ran = subprocess.run(["python3", str(bundle), "--version"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and "pegasus-cloudio" in ran.stdout + ran.stderr, ran
