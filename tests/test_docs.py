"""The docs match the code: no "forthcoming" for shipped features, no links outside the
repository, paths they name exist, fences close, one cache default, defaults shown in --help,
and every shell command of README.md and docs/user-guide.md runs as written (cloud URLs
against the embedded MinIO; the planner's command against the set's README, which the real
planner was checked against; `make test` is CI's own command)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import boto3
import pytest

from installed import REPO, SKIP, clean_env, constraints_file, spec, transfer
from pegasus_cloudio.cache import cli as cache_cli
from pegasus_cloudio.sites import cli as sites_cli
from pegasus_cloudio import worker_bundle
from pegasus_cloudio.dropin.main import build_parser as dropin_parser
from transfer.cache.config import default_directory

MARKDOWN = sorted([REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("site-catalogs/**/*.md")])
REPO_PATH = re.compile(r"`((?:docs|examples|site-catalogs|requirements|scripts|tests|transfer|pegasus_cloudio)"
                       r"/[\w./-]*)`")
CACHE_DEFAULT = "~/.cache/pegasus-cloudio"


def shell_commands(path: Path) -> List[str]:
    """The commands of the ```sh blocks: continuation lines joined, comments dropped."""
    commands: List[str] = []
    lang, pending = None, ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            lang = None if lang is not None else line[3:].strip()
            continue
        if lang != "sh":
            continue
        text = re.sub(r"(^|\s+)#(\s.*)?$", "", line).rstrip()
        if text.endswith("\\"):
            pending += text[:-1] + " "
        elif text or pending:
            commands.append(" ".join((pending + text).split()))
            pending = ""
    return commands


def test_no_forthcoming_for_shipped_features() -> None:
    for path in MARKDOWN:
        assert "forthcoming" not in path.read_text(encoding="utf-8").lower(), path


def test_nothing_points_outside_the_repository_and_named_paths_exist() -> None:
    for path in MARKDOWN:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"(^|[\s`(\[])\.\./", text, re.M), f"{path} points outside its directory"
        for link in re.findall(r"\]\(([^)#]+)\)", text):
            assert link.startswith("https://") or (path.parent / link).resolve().is_relative_to(REPO), (path, link)
        for named in REPO_PATH.findall(text):
            assert (REPO / named).exists(), f"{path.name} names {named}, which does not exist"


def test_code_fences_open_and_close_on_their_own_lines() -> None:
    for path in MARKDOWN:
        lines = path.read_text(encoding="utf-8").splitlines()
        assert not [line for line in lines if "```" in line and not line.lstrip().startswith("```")], path
        assert sum(line.lstrip().startswith("```") for line in lines) % 2 == 0, path


def test_one_cache_default_everywhere() -> None:
    assert default_directory({"HOME": "/home/u"}) == "/home/u/.cache/pegasus-cloudio"
    sources = [*MARKDOWN, *REPO.glob("site-catalogs/**/*.yml"), *REPO.glob("pegasus_cloudio/**/*.py")]
    for path in sources:
        assert "/var/tmp/pegasus-cloudio" not in path.read_text(encoding="utf-8"), path
    parser = argparse.ArgumentParser()
    cache_cli.add_arguments(parser)
    [actions] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert CACHE_DEFAULT in " ".join(actions.choices["stats"].format_help().split())


def _parsers() -> Dict[str, argparse.ArgumentParser]:
    found = {"pegasus-cloudio-transfer": dropin_parser()}
    for name, module in (("sites", sites_cli), ("worker-bundle", worker_bundle)):
        parser = argparse.ArgumentParser(prog=name)
        module.add_arguments(parser)  # type: ignore[attr-defined]
        found[name] = parser
    return found


def test_every_default_is_shown_in_help() -> None:
    for name, parser in _parsers().items():
        for action in parser._actions:
            if action.default in (None, False, argparse.SUPPRESS) or not action.option_strings \
                    or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
                continue
            assert "default" in (action.help or ""), f"{name} {action.option_strings[0]}: no default in help"
    [bundle] = [a for a in _parsers()["sites"]._actions if "--bundle" in a.option_strings]
    assert "(default: on for cloud-storage, off for the other modes)" in (bundle.help or "")


# --------------------------------------------------------------------------- commands, run


def test_readme_and_user_guide_have_the_commands_this_test_knows() -> None:
    commands = shell_commands(REPO / "README.md") + shell_commands(REPO / "docs" / "user-guide.md")
    assert "make bench" in commands and "pip install ." in commands
    assert any(c.startswith("pegasus-plan ") for c in commands)


class DocRunner:
    """Runs one document's commands in order, as a user would in one shell."""

    def __init__(self, root: Path, minio: object, substitutions: Dict[str, str]) -> None:
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        self.cwd = root
        self.substitutions = substitutions
        python = root / "python-bin"
        python.mkdir()
        (python / "python3").symlink_to(getattr(sys, "_base_executable", sys.executable))
        self.env = clean_env(str(python), {"HOME": str(self.home), "PIP_CONSTRAINT": str(
            constraints_file(root / "constraints.txt")), "PIP_QUIET": "1"})
        self.minio = minio

    def activate(self, venv_bin: Path) -> None:
        self.env["PATH"] = f"{venv_bin}{os.pathsep}{self.env['PATH']}"

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        for old, new in self.substitutions.items():
            command = command.replace(old, new)
        if command.startswith("cd "):
            self.cwd = Path(os.path.expanduser(command[3:].replace("~", str(self.home), 1)))
            return subprocess.CompletedProcess(command, 0, "", "")
        done = subprocess.run(["bash", "-c", command], cwd=self.cwd, env=self.env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
        return done


@pytest.fixture
def doc_env(tmp_path: Path, minio) -> Tuple[Path, object]:  # type: ignore[no-untyped-def]
    src = tmp_path / "pegasus-cloudio"
    shutil.copytree(REPO, src, ignore=SKIP)
    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    if "bucket" not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket="bucket")
    return src, minio


def _credentials(runner: DocRunner) -> None:
    (runner.home / ".pegasus").mkdir(mode=0o700)
    runner.minio.write_pegasus_credentials(runner.home / ".pegasus" / "credentials.conf",  # type: ignore[attr-defined]
                                           site="amazon", user="joe")


def test_readme_commands_run(doc_env: Tuple[Path, object], tmp_path: Path) -> None:
    src, minio = doc_env
    runner = DocRunner(tmp_path, minio, {"/shared/bin": str(tmp_path / "shared" / "bin")})
    runner.cwd = src
    venv = tmp_path / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    runner.activate(venv / "bin")  # the user's active venv
    _credentials(runner)
    (src / "up.txt").write_text("from the README\n")
    (src / "transfers.json").write_text(spec(transfer(f"file://{src}/up.txt", "s3://joe@amazon/bucket/readme/up.txt",
                                                      "up.txt")))
    for command in shell_commands(REPO / "README.md"):
        if command == "make test":
            assert "make test" in (REPO / ".ci" / "run").read_text()  # CI runs it
        elif command.startswith("make bench"):
            # small, and with the venv this suite runs in (made by `make test`) taken as made
            small = "--count 12 --stock-sample 4 --allow-small-sample --no-s5cmd --json"
            done = subprocess.run(["make", "-C", str(REPO), "-o", ".venv/.installed", "bench", f"ARGS={small}"],
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0 and '"benchmark": "small-files"' in done.stdout, done.stderr[-2000:]
        else:
            done = runner.run(command)
            if command.startswith("pegasus-cloudio-s3 ls"):
                assert "readme/up.txt" in done.stdout, done.stdout
    bundle = tmp_path / "shared" / "bin" / "pegasus-cloudio-transfer"
    assert os.access(bundle, os.X_OK)
    assert f"{bundle}" in (runner.home / "wf" / "transformations.yml").read_text()


def test_user_guide_commands_run(doc_env: Tuple[Path, object], tmp_path: Path) -> None:
    src, minio = doc_env
    opt = tmp_path / "opt" / "pegasus-cloudio"
    runner = DocRunner(tmp_path, minio, {"/opt/pegasus-cloudio": str(opt), "/path/to/pegasus-cloudio": str(src)})
    runner.activate(opt / "bin")  # the guide's commands after the install assume it is on PATH
    for command in shell_commands(REPO / "docs" / "user-guide.md"):
        if command.startswith("pegasus-plan "):
            readme = " ".join((runner.cwd / "README.md").read_text().split())
            assert command in readme, "the guide's plan command differs from the one the set prescribes"
        else:
            done = runner.run(command)
            if command.endswith("--version"):
                assert done.stdout.startswith("pegasus-cloudio 0.1.0"), done.stdout
    assert (opt / "bin" / "pegasus-cloudio-transfer.pyz").stat().st_size > 50_000
    assert (runner.home / "wf" / "sites.yml").is_file()
    assert f"{opt}/bin/pegasus-cloudio-transfer" in (runner.home / "wf" / "transformations.yml").read_text()
