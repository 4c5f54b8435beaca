"""The native front end (``native/pegasus_cloudio_transfer.c``), installed from the wheel as
``pegasus-cloudio-transfer``, against the Python client it replaces on the stager's hot path
(``pegasus-cloudio-transfer-py`` with ``PEGASUS_CLOUDIO_STAGER`` set): the same exit codes,
stderr lines and files for every way a hand-off ends (served, failed, refused, unreachable,
another user's stager, SIGTERM, a request over the limit); no Python in the client of a job
the stager took; the Python drop-in exec'd, unchanged, when no stager is named; arguments and
a large environment delivered intact; the internal variables seen by no job."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import pytest

from installed import SKIP, run
from pegasus_cloudio.stager import wire
from pegasus_cloudio_testbed.stager import StagerProcess
from test_stager import _parts, _stalled_get, entry, job_env, served, stager, wait_for  # noqa: F401 (stager)

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "native" / "pegasus_cloudio_transfer.c"
STRICT = ["-std=c99", "-pedantic", "-O2", "-Wall", "-Wextra", "-Werror", "-Wshadow", "-Wformat=2"]
INTERNAL = ("_PEGASUS_CLOUDIO_NATIVE", "_PEGASUS_CLOUDIO_STAGER_TRIED")
NOBODY = 65534
Outcome = Tuple[int, List[str], Dict[str, bytes]]

# A listener whose SO_PEERCRED says uid 65534 (listen() records it), reporting what it received.
FOREIGN_LISTENER = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
os.setgid(65534); os.setuid(65534)
s.listen(8)
print("listening", flush=True)
for _ in range(int(sys.argv[2])):
    conn, _ = s.accept()
    conn.settimeout(10)
    print(len(conn.recv(1 << 16)), flush=True)
    conn.close()
"""
# A stock pegasus-transfer that records its environment (NUL-separated), arguments and parent.
RECORDING_STOCK = """#!/bin/sh
env -0 > "$RECORD_DIR/env.$$"
printf '%s\\0' "$@" > "$RECORD_DIR/argv.$$"
echo "$PPID" > "$RECORD_DIR/parent.$$"
"""
GSIFTP = json.dumps([entry("gsiftp://grid.example/x", "file://{job}/g")])  # a job for the stock tool


def outcome(done: "subprocess.CompletedProcess[bytes]", job: Path) -> Outcome:
    """Exit code, stderr lines (the job's directory, log times and rates made uniform) and the
    job directory's files."""
    lines = []
    for line in done.stderr.decode().replace(str(job), "JOB").splitlines():
        line = re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", "", line)
        lines.append(re.sub(r" in [\d.]+ seconds\. Rate: .*", " in T", line))
    files = {str(p.relative_to(job)): p.read_bytes() for p in sorted(job.rglob("*")) if p.is_file()}
    return done.returncode, lines, files


def run_both(clients: Dict[str, List[str]], tmp_path: Path, spec: str, env: Dict[str, str],
             argv: Sequence[str] = (), prefix: Sequence[str] = ()) -> Dict[str, Outcome]:
    """The same job (``spec`` may name ``{job}``, its own directory) with each client; asserts
    the outcomes are equal and returns them."""
    found = {}
    for name, command in clients.items():
        job = tmp_path / name
        job.mkdir(parents=True)
        (job / "in.dat").write_bytes(b"input")
        done = subprocess.run([*prefix, *command, *argv], input=spec.replace("{job}", str(job)).encode(), env=env,
                              cwd=job, capture_output=True, timeout=120)
        found[name] = outcome(done, job)
        (job / "in.dat").unlink()
    first, *others = found.values()
    assert all(other == first for other in others), found
    return found


@pytest.fixture
def clients(native_dropin: List[str], python_dropin: List[str]) -> Dict[str, List[str]]:
    return {"native": native_dropin, "python": python_dropin}


def copy_spec(src: str = "in.dat") -> str:
    return json.dumps([entry(f"file://{{job}}/{src}", "file://{job}/out/copy.dat")])


def warnings(result: Outcome) -> List[str]:
    return [line for line in result[1] if line.startswith("pegasus-transfer: ")]


def test_the_installed_command_is_a_native_program_beside_the_python_drop_in(dropin_bin: Path) -> None:
    native, script = dropin_bin / "pegasus-cloudio-transfer", dropin_bin / "pegasus-cloudio-transfer-py"
    assert native.read_bytes()[:4] == b"\x7fELF"
    first = script.read_bytes().split(b"\n", 1)[0]
    assert first.startswith(b"#!") and first.endswith(b"/python")
    [wheel_meta] = dropin_bin.parent.glob("lib/python*/site-packages/pegasus_cloudio-*.dist-info/WHEEL")
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert f"Tag: py3-none-{platform}" in wheel_meta.read_text().splitlines()


def _exe_while_stalled(command: List[str], stager: StagerProcess, proxied: tuple, minio: object, bucket: str,
                       tmp_path: Path, use_stager: bool) -> Tuple[str, str]:
    """The program and children of a job's client process while its download stalls; the job
    is then stopped with SIGTERM and must end with exit 1 and no partial file."""
    proxy, env = proxied
    tmp_path.mkdir()
    job, spec = _stalled_get(proxy, minio, bucket, tmp_path)
    job_environment = job_env(stager.socket_path, **env)
    if not use_stager:
        job_environment = no_stager(job_environment)
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.PIPE, cwd=job, env=job_environment)
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(json.dumps(spec).encode())
    proc.stdin.close()
    wait_for(lambda: bool(_parts(job)) and os.path.getsize(_parts(job)[0]) > 0, "a partial download")
    exe = os.readlink(f"/proc/{proc.pid}/exe")
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().strip()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 1
    assert b"Exiting due to signal 15" in proc.stderr.read() and _parts(job) == []
    return exe, children


def test_a_job_the_stager_takes_starts_no_python_in_the_client(native_dropin: List[str], stager: StagerProcess,
                                                               proxied: tuple, minio: object, bucket: str,
                                                               tmp_path: Path) -> None:
    """While the stager runs the job, the client is the native program with no child; without
    the variable the same process (exec'd, same pid) is Python running the job itself."""
    native = os.path.realpath(native_dropin[0])
    exe, children = _exe_while_stalled(native_dropin, stager, proxied, minio, bucket, tmp_path / "a", True)
    assert exe == native and children == ""
    wait_for(lambda: len(served(stager)) == 1, "the stager's log of the job")
    exe, _ = _exe_while_stalled(native_dropin, stager, proxied, minio, bucket, tmp_path / "b", False)
    assert exe != native and os.path.basename(exe).startswith("python"), exe
    assert len(served(stager)) == 1


def test_both_clients_agree_on_a_served_job_and_a_failed_one(clients: Dict[str, List[str]], stager: StagerProcess,
                                                             tmp_path: Path) -> None:
    env = job_env(stager.socket_path)
    ok = run_both(clients, tmp_path / "ok", copy_spec(), env, ["--threads", "2"])
    assert ok["native"][0] == 0 and ok["native"][2]["out/copy.dat"] == b"input"
    assert ok["python"][2]["out/copy.dat"] == b"input" and not warnings(ok["native"])
    failed = run_both(clients, tmp_path / "failed", copy_spec("absent.dat"), env)
    assert failed["native"][0] == 1 and any("absent.dat" in line for line in failed["native"][1])
    assert "out/copy.dat" not in failed["native"][2]
    wait_for(lambda: len(served(stager)) == 4, "the stager's log of the four jobs")


def test_both_clients_run_a_refused_job_themselves_after_one_warning(clients: Dict[str, List[str]],
                                                                      tmp_path: Path) -> None:
    """The stager refuses a job from another mount namespace: one line, then the job runs in
    the client (the native one's Python fallback does not try the stager again)."""
    with StagerProcess() as daemon:
        prefix = ["unshare", "--mount", "--propagation", "private"]
        found = run_both(clients, tmp_path, copy_spec(), job_env(daemon.socket_path), prefix=prefix)
        assert not served(daemon)
    code, _, files = found["native"]
    [line] = warnings(found["native"])
    assert code == 0 and files["out/copy.dat"] == b"input"
    assert line.startswith(f"pegasus-transfer: node stager {daemon.socket_path} refused the job: ")
    assert "another mount namespace" in line and line.endswith("; transferring in this process")


def test_both_clients_say_the_same_when_no_stager_answers(clients: Dict[str, List[str]], tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"  # a socket file nobody listens on
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(stale))
    long_path = "/tmp/" + "x" * 120 + ".sock"
    cases = {"absent": (str(tmp_path / "absent.sock"), "No such file or directory"),
             "stale": (str(stale), "Connection refused"), "long": (long_path, "AF_UNIX path too long")}
    for name, (path, why) in cases.items():
        found = run_both(clients, tmp_path / name, copy_spec(), job_env(f"  {path}\t"))  # stripped, as Python does
        [line] = warnings(found["native"])
        assert line == (f"pegasus-transfer: node stager {path} (PEGASUS_CLOUDIO_STAGER) not reachable ({why}); "
                        "transferring in this process")
        assert found["native"][0] == 0 and found["native"][2]["out/copy.dat"] == b"input"


class ScriptedStager:
    """A stand-in for the stager on a Unix socket: takes each request whole (its descriptors
    closed, what each names noted in ``descriptors``), answers with the bytes ``reply`` holds,
    and hangs up."""

    def __init__(self, path: Path) -> None:
        self.reply = b""
        self.requests: List[int] = []
        self.descriptors: List[List[os.stat_result]] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                header, fds, _, _ = socket.recv_fds(conn, wire.LENGTH_BYTES, 8)
                self.descriptors.append([os.fstat(fd) for fd in fds])
                for fd in fds:
                    os.close(fd)
                size, got = int.from_bytes(header, "big"), 0
                while got < size:
                    chunk = conn.recv(size - got)
                    if not chunk:
                        break
                    got += len(chunk)
                self.requests.append(got)
                conn.sendall(self.reply)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self.sock.close()
        self.thread.join(timeout=10)


def test_both_clients_read_every_reply_alike(clients: Dict[str, List[str]], tmp_path: Path) -> None:
    """Replies a real stager rarely sends: a refusal whose text is over MAX_REASON and not valid
    UTF-8 (read up to the limit, invalid bytes shown as U+FFFD as Python decodes them), a
    hang-up before or after the pid, an exit code first, exit codes past 255 and negative."""
    start = b"bad \xff\xfe, cut \xe2\x82, ok \xc3\xa9, surrogate \xed\xa0\x80, "
    reason = start + b"x" * (wire.MAX_REASON - 2 - len(start)) + b"\xe2\x82\xac tail"  # the limit cuts the euro sign
    cases = {"refusal": (wire.reply(wire.REFUSED, len(reason)) + reason, 0),
             "hang-up": (b"", 0), "exit first": (wire.reply(wire.EXIT, 3), 0),
             "pid, hang-up": (wire.reply(wire.PID, 999_999), 1),
             "exit 300": (wire.reply(wire.PID, 999_999) + wire.reply(wire.EXIT, 300), 44),
             "exit -1": (wire.reply(wire.PID, 999_999) + wire.reply(wire.EXIT, -1), 255)}
    path = tmp_path / "scripted.sock"
    scripted = ScriptedStager(path)
    lines = {}
    try:
        for name, (reply, code) in cases.items():
            scripted.reply = reply
            found = run_both(clients, tmp_path / name.replace(" ", "-"), copy_spec(), job_env(path))
            assert found["native"][0] == code, (name, found["native"][1])
            assert ("out/copy.dat" in found["native"][2]) == (code == 0), name  # run in-process after a no
            lines[name] = warnings(found["native"])
    finally:
        scripted.close()
    assert len(scripted.requests) == 2 * len(cases) and min(scripted.requests) > 0
    shown = reason[:wire.MAX_REASON].decode("utf-8", "replace")
    assert lines["refusal"] == [f"pegasus-transfer: node stager {path} refused the job: {shown}; "
                                "transferring in this process"]
    assert "\ufffd" in shown and shown.endswith("x\ufffd")  # the euro sign cut at the limit
    assert lines["hang-up"] == lines["exit first"] == [
        f"pegasus-transfer: node stager {path} did not take the job (it closed the connection); "
        "transferring in this process"]
    assert lines["pid, hang-up"] == ["pegasus-transfer: the node stager's process 999999 ended without an exit status"]
    assert lines["exit 300"] == lines["exit -1"] == []


def test_both_clients_send_their_streams_and_working_directory(clients: Dict[str, List[str]], tmp_path: Path) -> None:
    """Four descriptors (``wire.DESCRIPTORS``): stdin, stdout, stderr and the job's directory,
    which the stager's process enters by descriptor, not by the path or the client's pid."""
    path = tmp_path / "scripted.sock"
    scripted = ScriptedStager(path)
    scripted.reply = wire.refusal("scripted")
    try:
        run_both(clients, tmp_path / "jobs", copy_spec(), job_env(path))
    finally:
        scripted.close()
    assert len(scripted.descriptors) == 2 and all(len(sent) == wire.DESCRIPTORS for sent in scripted.descriptors)
    for name, sent in zip(clients, scripted.descriptors):
        job = os.stat(tmp_path / "jobs" / name)
        assert (sent[3].st_dev, sent[3].st_ino) == (job.st_dev, job.st_ino), name
        assert [stat.S_ISDIR(s.st_mode) for s in sent] == [False, False, False, True], name


def test_a_client_with_closed_streams_runs_the_job_itself(clients: Dict[str, List[str]], stager: StagerProcess,
                                                         tmp_path: Path) -> None:
    """With stdin and stdout closed, the socket takes fd 0 and fd 1 stays closed: the working
    directory's descriptor must not take it (it would go out as the job's stdout), so the send
    fails with EBADF and the job runs in the client, as before that descriptor was sent."""
    for name, command in clients.items():
        job = tmp_path / name
        job.mkdir()
        (job / "in.dat").write_bytes(b"input")
        (job / "spec.json").write_text(copy_spec().replace("{job}", str(job)))
        done = subprocess.run(["sh", "-c", 'exec "$@" <&- >&-', "sh", *command, "-f", "spec.json"],
                              env=job_env(stager.socket_path), cwd=job, capture_output=True, timeout=120)
        code, lines, files = outcome(done, job)
        assert code == 0 and files["out/copy.dat"] == b"input", (name, lines)
        assert warnings((code, lines, files)) == [
            f"pegasus-transfer: node stager {stager.socket_path} did not take the job (Bad file descriptor); "
            "transferring in this process"], name
    wait_for(lambda: len(served(stager)) == 2, "the stager's log of the two abandoned connections")
    assert all(" exited 2 (" in line for line in served(stager))  # a copy that got no request


def test_neither_client_sends_anything_to_another_users_stager(clients: Dict[str, List[str]], tmp_path: Path) -> None:
    where = Path(tempfile.mkdtemp(prefix="foreign-stager-"))
    path = where / "s.sock"
    listener = subprocess.Popen([sys.executable, "-c", FOREIGN_LISTENER, str(path), str(len(clients))],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None and listener.stdout.readline() == "listening\n"
        found = run_both(clients, tmp_path, copy_spec(), job_env(path))
        received = [listener.stdout.readline().strip() for _ in clients]
    finally:
        listener.kill()
        listener.wait()
        path.unlink(missing_ok=True)
        where.rmdir()
    assert received == ["0"] * len(clients)  # no request, no environment
    [line] = warnings(found["native"])
    assert line == (f"pegasus-transfer: node stager {path} runs as uid {NOBODY}, not as this user; "
                    "transferring in this process")
    assert found["native"][0] == 0


def test_sigterm_reaches_the_stagers_job_from_both_clients(clients: Dict[str, List[str]], stager: StagerProcess,
                                                           proxied: tuple, minio: object, bucket: str,
                                                           tmp_path: Path) -> None:
    for name, command in clients.items():
        _exe_while_stalled(command, stager, proxied, minio, bucket, tmp_path / name, True)
    wait_for(lambda: len(served(stager)) == 2, "the stager's log of both jobs")
    assert all(" exited 1 " in line for line in served(stager))


def no_stager(env: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in env.items() if k != wire.ENV_VAR}


def recording_stock(tmp_path: Path) -> Dict[str, str]:
    """The settings that make RECORDING_STOCK the stock tool, recording under tmp_path/record."""
    (tmp_path / "record").mkdir()
    stock = tmp_path / "stock-transfer"
    stock.write_text(RECORDING_STOCK)
    stock.chmod(0o755)
    return {"RECORD_DIR": str(tmp_path / "record"), "PEGASUS_CLOUDIO_STOCK_TRANSFER": str(stock)}


def recorded(record: Path) -> Tuple[Dict[str, str], List[str], int]:
    """The environment (but PWD, the shell's), arguments and parent pid of the one stock run
    recorded (then removed)."""
    [env_file] = record.glob("env.*")
    pairs = [item.split("=", 1) for item in env_file.read_text().split("\0") if item and not item.startswith("PWD=")]
    argv = (record / env_file.name.replace("env.", "argv.")).read_text().split("\0")[:-1]
    parent = int((record / env_file.name.replace("env.", "parent.")).read_text())
    for path in record.iterdir():
        path.unlink()
    return {k: v for k, v in pairs}, argv, parent


def test_arguments_and_a_large_environment_reach_the_job_intact(clients: Dict[str, List[str]],
                                                                stager: StagerProcess, tmp_path: Path) -> None:
    """Through the stager and in-process, from both clients: a spec file named with a space and
    non-ASCII letters, and 1.2 MB of environment (a 100 kB value) reach the job as given; the
    front end's internal variables reach neither the job nor the stager."""
    stock = recording_stock(tmp_path)
    big = {f"BIG_{i:04d}": f"é {i} =" + "v" * 1000 for i in range(1100)}
    big["HUGE"] = "ü" * 50_000
    # LANG: without a locale, Python adds LC_CTYPE=C.UTF-8 to its own environment (PEP 538),
    # so the Python client's request carried it; the native one sends the job's as it is.
    base = job_env(stager.socket_path, LANG="C.UTF-8", **stock, **big)
    for mode, env in (("stager", base), ("in-process", no_stager(base))):
        seen = {}
        for name, command in clients.items():
            job = tmp_path / mode / name
            job.mkdir(parents=True)
            (job / "spé c.json").write_text(GSIFTP.replace("{job}", str(job)))
            proc = subprocess.Popen([*command, "-f", "spé c.json", "--threads", "3"], env=env, cwd=job,
                                    stderr=subprocess.PIPE)
            err = proc.communicate(timeout=120)[1].decode()
            assert proc.returncode == 0, err[-2000:]
            assert "Reading transfer specification from spé c.json" in err
            seen[name], argv, parent = recorded(tmp_path / "record")
            assert argv[0] == "-f" and argv[2:4] == ["--threads", "3"], argv
            assert (parent == proc.pid) == (mode == "in-process"), (mode, name)  # else a stager process
        assert seen["native"] == seen["python"], mode
        assert {k: seen["native"].get(k) for k in big} == big and not set(INTERNAL) & set(seen["native"])
    wait_for(lambda: len(served(stager)) == 2, "the stager's log of the two handed-off jobs")


def test_without_the_variable_the_native_command_runs_the_python_drop_in(clients: Dict[str, List[str]],
                                                                         tmp_path: Path) -> None:
    """No stager named: the same results as the Python drop-in, also through a
    ``pegasus-transfer`` symlink on PATH, which the stock-tool finder knows for itself (a
    recursion otherwise: the front end would run itself as the stock tool)."""
    env = no_stager(job_env(""))
    found = run_both(clients, tmp_path / "plain", copy_spec(), env)
    assert found["native"][0] == 0 and not warnings(found["native"])
    links = {}
    for name, command in clients.items():
        (tmp_path / "bin" / name).mkdir(parents=True)
        link = tmp_path / "bin" / name / "pegasus-transfer"
        link.symlink_to(command[0])
        links[name] = [str(link)]
    for name in links:
        path_env = dict(env, PATH=f"{tmp_path / 'bin' / name}:{env['PATH']}")
        found = run_both({name: links[name]}, tmp_path / f"stock-{name}", GSIFTP, path_env)
        code, lines, _ = found[name]
        assert code == 1 and any("no stock pegasus-transfer was found" in line for line in lines), lines


def _native_with_limit(tmp_path: Path, python_script: Path, limit: int) -> List[str]:
    """The front end compiled with the strict warning flags and a lower MAX_REQUEST, beside a
    link to the installed Python drop-in."""
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
    out = tmp_path / "bin" / "pegasus-cloudio-transfer"
    out.parent.mkdir()
    done = subprocess.run([*compiler, *STRICT, f"-DMAX_REQUEST={limit}", "-o", str(out), str(SOURCE)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (out.parent / python_script.name).symlink_to(python_script)
    return [str(out)]


def test_a_request_over_the_limit_is_not_sent_and_runs_in_process(python_dropin: List[str], stager: StagerProcess,
                                                                  tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Both clients refuse to send a request the stager would reject (wire.MAX_REQUEST, lowered
    here to 4 kB): the same line naming its size, then the job runs in the client process."""
    command = _native_with_limit(tmp_path, Path(python_dropin[0]), 4096)
    job = tmp_path / "job"
    job.mkdir()
    env = job_env(stager.socket_path, PADDING="p" * 5000, **recording_stock(tmp_path))
    umask = os.umask(0o022)
    os.umask(umask)
    size = len(wire.encode_request(str(job), umask, [], env))
    expected = (f"pegasus-transfer: node stager {stager.socket_path} did not take the job (a request of {size} "
                "bytes, over 4096); transferring in this process")
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=job)
    err = proc.communicate(GSIFTP.replace("{job}", str(job)).encode(), timeout=120)[1].decode()
    assert proc.returncode == 0, err
    assert [line for line in err.splitlines() if line.startswith("pegasus-transfer: ")] == [expected]
    assert recorded(tmp_path / "record")[2] == proc.pid  # run by the client itself, not by a stager process

    from pegasus_cloudio.stager import client
    monkeypatch.setattr(wire, "MAX_REQUEST", 4096)
    monkeypatch.chdir(job)
    python_err = tmp_path / "python.err"
    with python_err.open("w") as stream:
        monkeypatch.setattr(sys, "stderr", stream)
        assert client.hand_off(stager.socket_path, [], env) is None
    assert python_err.read_text().splitlines() == [expected]


def test_without_a_c_compiler_the_wheel_is_the_pure_python_one(tmp_path: Path) -> None:
    """The build says why in a warning and installs the Python drop-in under both names, in a
    ``py3-none-any`` wheel (as before the front end existed)."""
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=SKIP)
    done = run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "--no-index",
                "-w", str(tmp_path / "dist"), str(src)], dict(os.environ, CC="/nonexistent/cc"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cannot compile the native pegasus-cloudio-transfer (/nonexistent/cc: " in done.stdout + done.stderr
    [wheel] = (tmp_path / "dist").glob("pegasus_cloudio-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        scripts = {name.rsplit("/", 1)[1]: archive.read(name) for name in archive.namelist()
                   if ".data/scripts/" in name}
    assert scripts["pegasus-cloudio-transfer"] == scripts["pegasus-cloudio-transfer-py"]
    assert scripts["pegasus-cloudio-transfer"].startswith(b"#!python\n")


def test_the_c_source_and_the_python_side_share_their_constants() -> None:
    from pegasus_cloudio.dropin import launch

    defines = dict(re.findall(r"^#define (\w+) ([^/\n]+?)\s*(?:/\*.*)?$", SOURCE.read_text(), re.M))
    numbers = {k: math.prod(int(n) for n in re.findall(r"\d+", defines[k])) for k in
               ("MAX_REQUEST", "MAX_REASON", "REPLY_BYTES")}
    assert numbers == {"MAX_REQUEST": wire.MAX_REQUEST, "MAX_REASON": wire.MAX_REASON, "REPLY_BYTES": wire.REPLY_BYTES}
    names = {k: defines[k].strip('"') for k in ("ENV_VAR", "TRIED_VAR", "NATIVE_VAR")}
    assert names == {"ENV_VAR": wire.ENV_VAR, "TRIED_VAR": launch.TRIED_VAR, "NATIVE_VAR": launch.NATIVE_VAR}
    assert set(INTERNAL) == {launch.TRIED_VAR, launch.NATIVE_VAR}


def test_a_job_directory_holding_packages_of_our_names_is_never_imported(clients: Dict[str, List[str]],
                                                                          tmp_path: Path) -> None:
    """A job's inputs land in its working directory, and one may be a package called
    ``transfer`` or ``pegasus_cloudio``. The installed commands run a script file, so Python
    puts the script's directory first on ``sys.path``, never the working directory: neither
    client imports them. ``python -m pegasus_cloudio.dropin`` does (Python's rule for ``-m``:
    the working directory first, ahead of ``PYTHONPATH``), which docs/dropin.md says."""
    env = no_stager(job_env(""))
    for name, command in {**clients, "python -m": [sys.executable, "-m", "pegasus_cloudio.dropin"]}.items():
        job = tmp_path / name.replace(" ", "")
        for package in ("transfer", "pegasus_cloudio"):
            (job / package).mkdir(parents=True)
            (job / package / "__init__.py").write_text(f"raise SystemExit('planted {package} imported')\n")
        (job / "in.dat").write_bytes(b"input")
        done = subprocess.run(command, input=copy_spec().replace("{job}", str(job)).encode(), env=env, cwd=job,
                              capture_output=True, timeout=120)
        if name == "python -m":
            assert done.returncode == 1 and b"planted pegasus_cloudio imported" in done.stderr, done.stderr
        else:
            assert done.returncode == 0 and b"planted" not in done.stderr, (name, done.stderr)
            assert (job / "out" / "copy.dat").read_bytes() == b"input"
