"""The test bed's Go tool cache: a current stamp is reused, another pin rebuilds, the command
and the tools dir honour the environment, a slow build goes on and says so, Ctrl-C is one line,
and the pinned Go source is found and checked before Go runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pegasus_cloudio_testbed import tools


def _fake_tool(root: Path, name: str, stamp: str) -> Path:
    binary = root / "bin" / name
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\necho fake\n")
    binary.chmod(0o755)
    (root / "stamps").mkdir()
    (root / "stamps" / f"{name}.json").write_text(stamp)
    return binary


class BuildStarted(Exception):
    pass


def _refuse_build(message: str) -> None:
    raise BuildStarted(message)


def test_tool_with_current_stamp_is_reused(tmp_path: Path) -> None:
    binary = _fake_tool(tmp_path, "s5cmd", tools.PINS["s5cmd"].stamp_text())
    assert tools.ensure_tool("s5cmd", directory=tmp_path, progress=_refuse_build) == binary


def test_tool_with_a_different_pin_is_rebuilt(tmp_path: Path) -> None:
    _fake_tool(tmp_path, "s5cmd", tools.PINS["s5cmd"].stamp_text().replace("v2.3.0", "v2.2.0"))
    with pytest.raises(BuildStarted, match=r"building s5cmd \(pinned github.com/peak/s5cmd/v2@v2.3.0\)"):
        tools.ensure_tool("s5cmd", directory=tmp_path, progress=_refuse_build)


def test_tools_cli_and_tools_dir_honour_the_environment(tmp_path: Path) -> None:
    binary = _fake_tool(tmp_path, "s5cmd", tools.PINS["s5cmd"].stamp_text())
    env = dict(os.environ, PEGASUS_CLOUDIO_TOOLS_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio_testbed.tools", "s5cmd"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"s5cmd: {binary}"
    repo = Path(tools.__file__).resolve().parents[2]
    if "PEGASUS_CLOUDIO_TOOLS_DIR" not in os.environ:
        assert tools.tools_dir() == repo / ".tools"


def _scripted_go(tmp_path: Path) -> Path:
    """A ``go`` that stands for a slow toolchain: ``mod download`` answers at once, ``build``
    waits until the test creates ``release`` (a build on a busy machine), then writes the binary."""
    bin_dir = tmp_path / "gobin"
    bin_dir.mkdir()
    module = tmp_path / "module"
    module.mkdir()
    go = bin_dir / "go"
    go.write_text(f"""#!/bin/sh
case "$1" in
  mod) echo '{{"Dir": "{module}", "Origin": {{"Hash": "abcdef1"}}}}' ;;
  build) while [ ! -e {tmp_path}/release ]; do sleep 0.05; done
         while [ "$1" != "-o" ]; do shift; done; printf '#!/bin/sh\\n' > "$2"; chmod +x "$2" ;;
esac
""")
    go.chmod(0o755)
    return bin_dir


def _tools_build(tmp_path: Path, every: float) -> "subprocess.Popen[str]":
    code = (f"from pegasus_cloudio_testbed import tools; from pathlib import Path; "
            f"print(tools.ensure_tool('s5cmd', directory=Path({str(tmp_path / 'tools')!r}), progress_every={every}))")
    env = dict(os.environ, PATH=f"{_scripted_go(tmp_path)}:{os.environ['PATH']}")
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_a_slow_tool_build_goes_on_and_says_so(tmp_path: Path) -> None:
    """No fixed time limit (a busy machine's build took over 1,800 s and was killed): the build
    says it still runs, and finishes when the toolchain does."""
    proc = _tools_build(tmp_path, every=0.2)
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert first.startswith("building s5cmd"), first
    said = proc.stderr.readline()
    assert said.startswith("... still building s5cmd (") and "nothing is wrong" in said, said
    (tmp_path / "release").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == str(tmp_path / "tools" / "bin" / "s5cmd")


def test_ctrl_c_in_a_tool_build_is_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=f"{_scripted_go(tmp_path)}:{os.environ['PATH']}",
               PEGASUS_CLOUDIO_TOOLS_DIR=str(tmp_path / "tools"))
    proc = subprocess.Popen([sys.executable, "-m", "pegasus_cloudio_testbed.tools", "s5cmd"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    assert proc.stderr.readline().startswith("building s5cmd")
    proc.send_signal(signal.SIGINT)
    (tmp_path / "release").touch()  # the scripted go is not in a terminal's process group: let it end
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.count("\n") == 1 and "interrupted while building s5cmd" in err and "Traceback" not in err, err
    assert not (tmp_path / "tools" / "bin" / "s5cmd").exists()


def test_stamps_of_pins_without_a_source_keep_their_earlier_text() -> None:
    """Adding SourcePin must not turn every built MinIO and s5cmd stale (a rebuild each, or two
    checkouts of different ages sharing one tools dir rebuilding them in turn)."""
    assert tools.PINS["minio"].stamp_text() == (
        '{"ldflags": [], "method": "install", "module": "github.com/minio/minio", "name": "minio", '
        '"package": "", "version": "v0.0.0-20260212201848-7aac2a2c5b7c"}\n')
    go = json.loads(tools.PINS["pegasus-transfer-go"].stamp_text())
    assert go["source"]["archive_sha256"] == "a9bfc735e1c808c8c86f396ae577dc7bfb186d80cebd0e17c6a32214fd035b29"


def test_go_transfer_source_is_found_beside_the_checkout_or_where_the_environment_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tools.PINS["pegasus-transfer-go"].source
    assert source is not None
    found = tools.shared_dir(source.directory)
    assert (found / source.archive).is_file() and (found / source.gomod).is_file()
    monkeypatch.setenv("PEGASUS_CLOUDIO_SHARED_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match=f"{tmp_path}/pegasus-transfer-go: no such directory"):
        tools.shared_dir(source.directory)


def test_go_transfer_source_with_a_wrong_digest_is_refused_before_go_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tools.PINS["pegasus-transfer-go"].source
    assert source is not None
    shared = tmp_path / "shared" / source.directory
    shared.mkdir(parents=True)
    (shared / source.archive).write_bytes(b"not the pinned archive")
    (shared / source.gomod).write_bytes(b"module x\n")
    monkeypatch.setenv("PEGASUS_CLOUDIO_SHARED_DIR", str(tmp_path / "shared"))
    with pytest.raises(RuntimeError, match=f"{shared / source.archive}: sha256 [0-9a-f]{{64}}, expected "
                                           f"{source.archive_sha256} \\(not the pinned file\\)"):
        tools.ensure_tool("pegasus-transfer-go", directory=tmp_path / "tools", progress=lambda _: None)
    assert not (tmp_path / "tools" / "bin" / "pegasus-transfer-go").exists()
