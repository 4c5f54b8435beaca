"""What `pip install` gives a user: the wheel is built from the sdist, holds every package, and
installs (not editable, from no source tree) into fresh venvs, bare and with ``[all]``. Every
console script then answers --version/--help, ``sites`` writes every mode's set, ``cache stats``
works, and the installed drop-ins move files to and from MinIO, run from outside the checkout."""

from __future__ import annotations

import functools
import http.server
import subprocess
import tarfile
import threading
import time
import uuid
import zipfile
from pathlib import Path
from typing import Dict, Tuple

import pytest

from installed import (REPO, constraints_file, archive_packages, build_sdist_and_wheel, clean_env, make_venv, run,
                       source_packages, spec, transfer, wheel_packages)
from pegasus_cloudio.sites.templates import TEMPLATES, argv_for
from pegasus_cloudio.version import __version__

SCRIPTS = ("pegasus-cloudio", "pegasus-cloudio-transfer", "pegasus-cloudio-s3", "pegasus-cloudio-condor-plugin")
Venv = Tuple[Path, Dict[str, str]]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Path]:
    return build_sdist_and_wheel(tmp_path_factory.mktemp("dist"))


def _install(root: Path, requirement: str, *pip_args: str) -> Venv:
    bin_dir = make_venv(root / "venv")
    env = clean_env(str(bin_dir))
    done = run([str(bin_dir / "pip"), "install", "--quiet", *pip_args, requirement], env, root, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return bin_dir, env


@pytest.fixture(scope="module")
def bare(built: Tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The wheel alone: no index, so the core must need no third-party package."""
    return _install(tmp_path_factory.mktemp("bare"), str(built[1]), "--no-index")


@pytest.fixture(scope="module")
def full(built: Tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """``[all]`` from the package index, held to the development lock by constraints."""
    root = tmp_path_factory.mktemp("full")
    return _install(root, f"{built[1]}[all]", "-c", str(constraints_file(root / "constraints.txt")))



def test_sdist_and_wheel_hold_every_package_of_the_source_tree(built: Tuple[Path, Path]) -> None:
    sdist, wheel = built
    expected = source_packages()
    assert {"transfer.http", "transfer.backends", "pegasus_cloudio.dropin"} <= expected
    assert wheel_packages(wheel) == expected
    with tarfile.open(sdist) as tf:
        assert archive_packages(tf.getnames(), f"pegasus_cloudio-{__version__}/") == expected


def test_the_worker_wheel_carries_no_test_bed_and_no_benchmarks(built: Tuple[Path, Path]) -> None:
    sdist, wheel = built
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert any(n.startswith("transfer/") for n in names)
    assert not [n for n in names if "testbed" in n or "bench" in n.split("/")[0] or "/bench/" in n], names
    with zipfile.ZipFile(wheel) as zf:
        requires = [line for line in zf.read(next(n for n in names if n.endswith("/METADATA"))).decode().splitlines()
                    if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert requires == [], requires  # a worker's plain install pulls in nothing


def test_installed_code_comes_from_the_venv_not_the_checkout(bare: Venv, tmp_path: Path) -> None:
    bin_dir, env = bare
    code = "import transfer, pegasus_cloudio; print(transfer.__file__); print(pegasus_cloudio.__file__)"
    done = run([str(bin_dir / "python"), "-c", code], env, tmp_path)
    for line in done.stdout.splitlines():
        assert line.startswith(str(bin_dir.parent)), line


@pytest.mark.parametrize("which", ["bare", "full"])
def test_every_console_script_answers_version_and_help(which: str, request: pytest.FixtureRequest,
                                                       tmp_path: Path) -> None:
    bin_dir, env = request.getfixturevalue(which)
    for script in SCRIPTS:
        version = run([str(bin_dir / script), "--version"], env, tmp_path)
        assert version.returncode == 0 and version.stdout.startswith(f"{script} {__version__} "), version
        shown = run([str(bin_dir / script), "--help"], env, tmp_path)
        assert shown.returncode == 0 and shown.stdout.startswith("usage:"), shown
        assert "``" not in shown.stdout


def test_bare_install_names_the_extra_for_what_it_lacks(bare: Venv, tmp_path: Path) -> None:
    bin_dir, env = bare
    for argv, fix in ((["sites", "--mode", "vm-storage", "--out", "x"], "pip install 'pegasus-cloudio[sites]'"),
                      (["bench", "small-files", "--help"], "pip install ./bench (pegasus-cloudio-bench, from a "
                                                            "pegasus-cloudio checkout)")):
        done = run([str(bin_dir / "pegasus-cloudio"), *argv], env, tmp_path)
        assert done.returncode == 2
        [line] = done.stderr.splitlines()
        assert line.endswith(fix), line
    assert not (tmp_path / "x").exists()
    (tmp_path / "in").write_bytes(b"x")
    for url, extra in (("gs://bucket/key", "gcs"), ("scp://user@127.0.0.1/tmp/key", "sftp")):
        done = run([str(bin_dir / "pegasus-cloudio-transfer")], env, tmp_path,
                   stdin=spec(transfer(f"file://{tmp_path}/in", url, "in")))
        assert done.returncode == 1
        assert f"pip install 'pegasus-cloudio[{extra}]'" in done.stderr, done.stderr


def test_bare_cache_stats(bare: Venv, tmp_path: Path) -> None:
    bin_dir, env = bare
    done = run([str(bin_dir / "pegasus-cloudio"), "cache", "stats", "--dir", str(tmp_path / "c")], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "hits" in done.stdout and str(tmp_path / "c") in done.stdout


def test_full_install_writes_every_sites_mode(full: Venv, tmp_path: Path) -> None:
    bin_dir, env = full
    for name in sorted(TEMPLATES):
        done = run([str(bin_dir / "pegasus-cloudio"), "sites", *argv_for(name, str(tmp_path / name))], env, tmp_path)
        assert done.returncode == 0, (name, done.stderr)
        assert (tmp_path / name / "sites.yml").is_file() and (tmp_path / name / "README.md").is_file()


def test_installed_dropins_round_trip_through_minio(bare: Venv, s3_env: Dict[str, str], bucket: str,
                                                    tmp_path: Path) -> None:
    bin_dir, env = bare
    env = dict(env, **s3_env)
    payload = uuid.uuid4().bytes * 1000
    (tmp_path / "up").write_bytes(payload)
    url = f"s3://test@minio/{bucket}/installed/up"
    out = run([str(bin_dir / "pegasus-cloudio-transfer")], env, tmp_path,
              stdin=spec(transfer(f"file://{tmp_path}/up", url, "up")))
    assert out.returncode == 0, out.stderr
    listed = run([str(bin_dir / "pegasus-cloudio-s3"), "ls", f"s3://test@minio/{bucket}"], env, tmp_path)
    assert listed.returncode == 0 and "installed/up" in listed.stdout, listed
    back = run([str(bin_dir / "pegasus-cloudio-transfer")], env, tmp_path,
               stdin=spec(transfer(url, f"file://{tmp_path}/down", "up")))
    assert back.returncode == 0, back.stderr
    assert (tmp_path / "down").read_bytes() == payload


def test_full_install_adds_gs_urls(full: Venv, gcs_env: Dict[str, str], gcs_bucket: str, tmp_path: Path) -> None:
    bin_dir, env = full
    env = dict(env, **gcs_env)
    (tmp_path / "up").write_bytes(b"to gcs and back")
    url = f"gs://{gcs_bucket}/installed/up"
    for src, dst in ((f"file://{tmp_path}/up", url), (url, f"file://{tmp_path}/down")):
        done = run([str(bin_dir / "pegasus-cloudio-transfer")], env, tmp_path, stdin=spec(transfer(src, dst, "up")))
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "down").read_bytes() == b"to gcs and back"


def test_bare_install_downloads_over_http(bare: Venv, tmp_path: Path) -> None:
    bin_dir, env = bare
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "f").write_bytes(b"over http")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "served"))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/f"
        done = run([str(bin_dir / "pegasus-cloudio-transfer")], env, tmp_path,
                   stdin=spec(transfer(url, f"file://{tmp_path}/got", "f")))
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "got").read_bytes() == b"over http"


def test_installed_dropin_hands_jobs_to_an_installed_stager(bare: Venv, s3_env: Dict[str, str], bucket: str,
                                                            tmp_path: Path) -> None:
    """The bare install's stager (no extra needed) runs the installed drop-in's S3 job."""
    bin_dir, env = bare
    env = dict(env, **s3_env)
    sock_dir = tmp_path / "run"
    sock_dir.mkdir(mode=0o700)
    socket_path = sock_dir / "stager.sock"
    log = (tmp_path / "stager.log").open("wb")
    stager = subprocess.Popen([str(bin_dir / "pegasus-cloudio"), "stager", "--socket", str(socket_path)],
                              env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not socket_path.exists():
            assert stager.poll() is None and time.monotonic() < deadline, (tmp_path / "stager.log").read_text()
            time.sleep(0.05)
        (tmp_path / "up").write_bytes(b"through the stager")
        url = f"s3://test@minio/{bucket}/stager/up"
        job_env = dict(env, PEGASUS_CLOUDIO_STAGER=str(socket_path))
        for src, dst in ((f"file://{tmp_path}/up", url), (url, f"file://{tmp_path}/down")):
            done = run([str(bin_dir / "pegasus-cloudio-transfer")], job_env, tmp_path, stdin=spec(transfer(src, dst, "up")))
            assert done.returncode == 0 and "node stager" not in done.stderr, done.stderr
        assert (tmp_path / "down").read_bytes() == b"through the stager"
        # a job's command ends at its answer; its copy may still be finishing (the node cache's
        # inserts after the answer): the stager logs each copy it reaps
        deadline = time.monotonic() + 30
        while (tmp_path / "stager.log").read_text().count(" exited 0 ") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stager.terminate()
        stager.wait(timeout=30)
        log.close()
    text = (tmp_path / "stager.log").read_text()
    assert text.count(" exited 0 ") == 2, text
    assert not socket_path.exists()  # a clean stop removes its socket


def test_a_workers_install_follows_the_generated_readme(built: Tuple[Path, Path], tmp_path: Path) -> None:
    """The first-day path: generate a set naming a tool path, then do on a "worker" exactly what
    the set's README says (its sh block, the wheel in place of /path/to/...; no index, which
    serves no pegasus-cloudio anyway), and the tool the catalogs name moves a file."""
    import shlex
    import sys
    worker = tmp_path / "opt" / "pegasus-cloudio"
    out = tmp_path / "set"
    done = run([sys.executable, "-m", "pegasus_cloudio.cli", "sites", "--mode", "vm-storage", "--out", str(out),
                "--install-bin", str(worker / "bin")], clean_env(str(Path(sys.executable).parent)), tmp_path)
    assert done.returncode == 0, done.stderr
    readme = (out / "README.md").read_text()
    block = readme[readme.index("## Workers"):].split("```sh\n", 1)[1].split("```", 1)[0]
    wheel = built[1]
    for line in block.strip().splitlines():
        argv = shlex.split(line.split("   #", 1)[0])
        argv = [wheel.as_posix() if a.startswith("/path/to/pegasus_cloudio-") else a for a in argv]
        if argv[1:2] == ["install"]:
            argv.insert(2, "--no-index")
        step = run(argv, clean_env(str(worker / "bin")), tmp_path, timeout=600)
        assert step.returncode == 0, (line, step.stderr[-2000:])
    tool = (out / "transformations.yml").read_text().split("pfn: ", 1)[1].split()[0]
    assert tool == str(worker / "bin" / "pegasus-cloudio-transfer")
    (tmp_path / "in").write_text("first day")
    moved = run([tool], clean_env(str(worker / "bin"), {"PEGASUS_CLOUDIO_CACHE_DIR": "off"}), tmp_path,
                stdin=spec(transfer(f"file://{tmp_path}/in", f"file://{tmp_path}/out", "in")))
    assert moved.returncode == 0, moved.stderr
    assert (tmp_path / "out").read_text() == "first day"
