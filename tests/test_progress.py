"""Progress where a person waits (issue 34): ``pegasus-cloudio-s3`` put/get/cp under a real
terminal (a pty) on a real MinIO behind a bandwidth-capped proxy; the 30 s lines of a job
with a clock the test drives; and the drop-in's records, which never carry progress."""

import io
import json
import os
import pty
import re
import select
import subprocess
import sys

import pytest

from pegasus_cloudio.progress import JOB_INTERVAL, Progress, size_text, time_text
from pegasus_cloudio_testbed.links import Shaping
from pegasus_cloudio_testbed.proxy import TcpProxy
from transfer.ops import Result, Transfer
from transfer.urls import parse_url

S3 = [sys.executable, "-m", "pegasus_cloudio.s3cli.main"]
DROPIN = [sys.executable, "-m", "pegasus_cloudio.dropin"]
MiB = 1 << 20
RATE = 4 * MiB  # bytes per second per direction through the proxy: 8 MiB take about 2 s
LINE = re.compile(r"\rCompleted ([\d.]+ \w+)/8\.0 MiB \([\d.]+ \w+/s\) with 1 file\(s\) remaining, \d+:\d\d left")


@pytest.fixture
def slow(minio, tmp_path):
    """An environment whose site ``minio`` is MinIO behind a proxy capped at RATE."""
    with TcpProxy((minio.host, minio.port), shaping=Shaping(rate_bps=RATE)) as proxy:
        creds = minio.write_pegasus_credentials(tmp_path / "slow.conf", site="minio", user="test",
                                                endpoint=proxy.url())
        yield {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
               "AWS_EC2_METADATA_DISABLED": "true", "PEGASUS_CLOUDIO_CACHE_DIR": "off",
               "PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")}


def under_tty(argv, env, cwd, *, stdin=None, timeout=120.0):
    """Run ``argv`` with stderr (and stdout) on a new pty, as a terminal would; (exit code,
    bytes the terminal received, stdout bytes)."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=terminal)
    os.close(terminal)
    if stdin is not None:
        proc.stdin.write(stdin)
        proc.stdin.close()
    seen = bytearray()
    while True:
        ready, _, _ = select.select([controller], [], [], timeout)
        assert ready, f"no output nor end from {argv} in {timeout} s"
        try:
            data = os.read(controller, 65536)
        except OSError:  # EIO: every holder of the terminal closed it
            break
        if not data:
            break
        seen += data
    os.close(controller)
    out = proc.stdout.read()
    return proc.wait(timeout=timeout), bytes(seen), out


def _put_object(env, bucket, tmp_path, name="big.dat", size=8 * MiB):
    src = tmp_path / f"src-{name}"
    src.write_bytes(os.urandom(size))
    done = subprocess.run(S3 + ["-q", "put", str(src), f"s3://test@minio/{bucket}/{name}"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return src


@pytest.mark.parametrize("command", ["put", "get"])
def test_a_terminal_sees_bytes_rate_and_time_left_on_one_line_that_ends_cleanly(command, slow, bucket, tmp_path):
    src = _put_object(slow, bucket, tmp_path) if command == "get" else tmp_path / "src.dat"
    if command == "put":
        src.write_bytes(os.urandom(8 * MiB))
        argv = ["put", str(src), f"s3://test@minio/{bucket}/up.dat"]
    else:
        argv = ["get", f"s3://test@minio/{bucket}/big.dat", str(tmp_path / "got.dat")]
    rc, seen, out = under_tty(S3 + argv, slow, tmp_path)
    text = seen.decode()
    assert rc == 0 and out == b"", text
    assert LINE.search(text), text  # at least one line while it ran, with its total and time left
    assert "\n" not in text[:-2] and "\r\n" not in text[:-2], text  # one line, rewritten in place
    last = text.rstrip("\r\n").rsplit("\r", 1)[-1]
    assert last.startswith("Completed 8.0 MiB/8.0 MiB (") and last.rstrip().endswith("with 0 file(s) remaining"), text
    assert text.endswith("\n"), text  # the shell's prompt starts on a line of its own
    if command == "get":
        assert (tmp_path / "got.dat").read_bytes() == src.read_bytes()


def test_a_server_side_copy_shows_the_bytes_of_the_files_copied(minio, slow, bucket, tmp_path):
    """Nothing of a copy crosses our connections: the line counts each file as it completes.
    One thread and a 300 ms round trip make the four copies last long enough for lines."""
    for name in "abcd":
        _put_object(slow, bucket, tmp_path, f"{name}.dat", MiB)
    with TcpProxy((minio.host, minio.port), shaping=Shaping.rtt(300.0)) as proxy:
        creds = minio.write_pegasus_credentials(tmp_path / "far.conf", site="minio", user="test", endpoint=proxy.url())
        env = dict(slow, PEGASUS_CREDENTIALS=str(creds), PEGASUS_CLOUDIO_THREADS="1")
        rc, seen, _ = under_tty(S3 + ["cp", "-c", *(f"s3://test@minio/{bucket}/{n}.dat" for n in "abcd"),
                                      f"s3://test@minio/{bucket}-to"], env, tmp_path)
    text = seen.decode()
    assert rc == 0 and "Traceback" not in text, text
    assert re.search(r"\rCompleted [\d.]+ \w+/4\.0 MiB \([\d.]+ \w+/s\) with [1-4] file\(s\) remaining", text), text
    assert text.rstrip().rsplit("\r", 1)[-1].startswith("Completed 4.0 MiB/4.0 MiB ("), text


@pytest.mark.parametrize("flag", ["--no-progress", "-q"])
def test_no_progress_and_quiet_show_nothing_on_a_terminal(flag, slow, bucket, tmp_path):
    src = tmp_path / "src.dat"
    src.write_bytes(os.urandom(4 * MiB))
    rc, seen, _ = under_tty(S3 + ["put", flag, str(src), f"s3://test@minio/{bucket}/up.dat"], slow, tmp_path)
    assert rc == 0 and seen == b"", seen


def test_without_a_terminal_short_work_prints_nothing(slow, bucket, tmp_path):
    src = tmp_path / "src.dat"
    src.write_bytes(os.urandom(4 * MiB))
    done = subprocess.run(S3 + ["put", str(src), f"s3://test@minio/{bucket}/up.dat"], env=slow, cwd=tmp_path,
                          capture_output=True, timeout=120)
    assert done.returncode == 0 and done.stderr == b"" and done.stdout == b"", done.stderr


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _result(size):
    op = Transfer((parse_url("file:///a"),), parse_url("file:///b"))
    return Result(op, True, bytes=size)


def test_a_job_gets_one_line_per_30_s_of_long_work_and_nothing_for_short_work():
    """No terminal: the reporter's wakes write only when 30 s have passed since the start and
    since the last line; the clock is the test's."""
    clock, stream, moved = Clock(), io.StringIO(), [0]
    shown = Progress(stream, moved=lambda: moved[0], files=3, total=30 * MiB, live=False,
                     prefix="pegasus-cloudio-s3: ", clock=clock)
    for step in range(1, 60):  # 29.5 s of wakes every 0.5 s: nothing
        clock.now += 0.5
        moved[0] = step * 10_000
        shown.tick()
    assert stream.getvalue() == ""
    clock.now = 1000.0 + JOB_INTERVAL
    moved[0] = 10 * MiB
    shown.tick()
    shown.finished(_result(10 * MiB))
    clock.now += JOB_INTERVAL / 2
    shown.tick()
    assert stream.getvalue() == ("pegasus-cloudio-s3: Completed 10.0 MiB/30.0 MiB (341.3 KiB/s) with 3 file(s) "
                                 "remaining, 1:00 left\n")
    clock.now += JOB_INTERVAL / 2
    moved[0] = 20 * MiB
    shown.tick()
    lines = stream.getvalue().splitlines()
    assert lines[1] == "pegasus-cloudio-s3: Completed 20.0 MiB/30.0 MiB (341.3 KiB/s) with 2 file(s) remaining, 0:30 left"
    with shown:  # the thread wakes every 30 s: it writes nothing more, and its stop adds no line
        pass
    assert len(stream.getvalue().splitlines()) == 2


def test_the_line_counts_finished_copies_retried_bytes_and_unknown_totals():
    clock, stream = Clock(), io.StringIO()
    shown = Progress(stream, moved=lambda: 0, files=1, total=None, live=True, clock=clock)
    clock.now += 2.0
    shown.finished(_result(3 * MiB))  # a server-side copy: nothing through our connections
    assert shown.line() == "Completed 3.0 MiB (1.5 MiB/s) with 0 file(s) remaining"
    retried = Progress(stream, moved=lambda: 5 * MiB, files=1, total=4 * MiB, live=True, clock=clock)
    clock.now += 1.0
    assert retried.line().startswith("Completed 4.0 MiB/4.0 MiB (")
    assert size_text(300) == "300 Bytes" and size_text(1 << 30) == "1.0 GiB"
    assert time_text(59.6) == "1:00" and time_text(3725) == "1:02:05"


def test_a_live_line_overwrites_a_longer_one_and_a_closed_terminal_stops_the_lines():
    clock, stream, moved = Clock(), io.StringIO(), [20 * MiB]
    shown = Progress(stream, moved=lambda: moved[0], files=2, total=40 * MiB, live=True, clock=clock)
    clock.now += 1.0
    shown.tick()
    first = stream.getvalue()
    shown.finished(_result(20 * MiB))
    moved[0] = 40 * MiB
    shown.finished(_result(20 * MiB))
    shown.tick()
    second = stream.getvalue()[len(first):]
    assert second.startswith("\rCompleted 40.0 MiB/40.0 MiB") and len(second) == len(first), (first, second)
    stream.close()
    shown.tick()  # a closed stream: no exception into the transfer


# -- the drop-in: its records never carry progress ---------------------------------------------

_STAMP = re.compile(rb"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?|\d+\.\d+|\b\d{9,}\b|\b\d+(?= seconds?\b)")


def _normal(data: bytes) -> bytes:
    """Times, durations and rates (which differ run to run) as one token."""
    return _STAMP.sub(b"#", data.replace(b"\r\n", b"\n"))


def test_the_dropin_writes_the_same_records_with_and_without_a_terminal(slow, bucket, tmp_path):
    """Long enough for a live line (about 3 s through the capped proxy), run twice on the same
    spec: once as a job runs it (pipes), once with stderr on a terminal."""
    src = tmp_path / "in.dat"
    src.write_bytes(os.urandom(6 * MiB))
    _put_object(slow, bucket, tmp_path, "there.dat", 6 * MiB)
    spec = json.dumps([{"type": "transfer", "lfn": "in.dat", "id": 1,
                        "src_urls": [{"site_label": "local", "url": f"file://{src}"}],
                        "dest_urls": [{"site_label": "minio", "url": f"s3://test@minio/{bucket}/in.dat"}]},
                       {"type": "transfer", "lfn": "there.dat", "id": 2,
                        "src_urls": [{"site_label": "minio", "url": f"s3://test@minio/{bucket}/there.dat"}],
                        "dest_urls": [{"site_label": "local", "url": f"file://{tmp_path}/back/there.dat"}]}]).encode()
    plain = subprocess.run(DROPIN, input=spec, env=slow, cwd=tmp_path, capture_output=True, timeout=120)
    rc, terminal, out = under_tty(DROPIN, slow, tmp_path, stdin=spec)
    assert plain.returncode == 0 and rc == 0, (plain.stderr, terminal)
    assert b"Completed" not in terminal and b"\r" not in terminal.replace(b"\r\n", b"\n"), terminal
    assert out == plain.stdout
    assert _normal(terminal) == _normal(plain.stderr), (terminal, plain.stderr)


# -- bench: the phase line with bytes ----------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bench_phase_with_a_byte_count_shows_bytes_rate_and_time_left():
    import time

    from pegasus_cloudio_bench.harness import Progress as PhaseProgress, bytes_line, tree_bytes
    stream, moved = _Terminal(), [3 * MiB]
    shown = PhaseProgress(stream)
    shown.phase("1024 MiB down: ours, round 1", lambda: moved[0], 12 * MiB)
    deadline = time.monotonic() + 60
    while "MiB/12.0 MiB (" not in stream.getvalue():  # the line's thread wakes every 0.5 s
        assert time.monotonic() < deadline, stream.getvalue()
        time.sleep(0.05)
    shown.done()
    line = stream.getvalue().rsplit("\r", 1)[-1]
    assert line.startswith("  1024 MiB down: ours, round 1 ... 3.0 MiB/12.0 MiB (") and " left, " in line, line
    assert stream.getvalue().endswith("\n")
    assert bytes_line(6 * MiB, 12 * MiB, 3.0).startswith("6.0 MiB/12.0 MiB (2.0 MiB/s), 0:03 left, 3.0 s")
    assert bytes_line(6 * MiB, None, 2.0).startswith("6.0 MiB (3.0 MiB/s), 2.0 s")


def test_tree_bytes_counts_the_files_a_tool_writes(tmp_path):
    from pegasus_cloudio_bench.harness import tree_bytes
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".down.dat.12.0.part").write_bytes(b"x" * 10)
    (tmp_path / "other").write_bytes(b"y" * 5)
    assert tree_bytes(str(tmp_path), "down.dat") == 10 and tree_bytes(str(tmp_path)) == 15


def test_ctrl_c_on_a_terminal_says_why_on_a_line_of_its_own(proxied, minio, bucket, tmp_path):
    """The signal handler's lines clear the progress line they would otherwise continue."""
    import signal
    import time

    from pegasus_cloudio_testbed.faults import Fault
    proxy, proxied_env = proxied
    env = dict(proxied_env, PATH=os.environ["PATH"], PYTHONPATH=os.environ.get("PYTHONPATH", ""),
               PEGASUS_CLOUDIO_CACHE_DIR="off", AWS_EC2_METADATA_DISABLED="true")
    _put_object(env, bucket, tmp_path, "big.dat", 8 * MiB)
    proxy.set_faults([Fault.stall(120, after_bytes=2 * MiB, method="GET")])
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(S3 + ["get", f"s3://test@minio/{bucket}/big.dat", "big.dat"], cwd=tmp_path, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=terminal)
    os.close(terminal)
    seen = bytearray()
    deadline = time.monotonic() + 60
    while b"Completed" not in seen:
        assert time.monotonic() < deadline, seen
        if select.select([controller], [], [], 1.0)[0]:
            seen += os.read(controller, 65536)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 1
    while select.select([controller], [], [], 5.0)[0]:
        try:
            data = os.read(controller, 65536)
        except OSError:
            break
        if not data:
            break
        seen += data
    os.close(controller)
    text = seen.decode()
    assert "\r\x1b[Kpegasus-cloudio-s3: Exiting due to signal 2" in text, text


def test_the_byte_count_keeps_the_bytes_of_closed_connections_and_counts_only_when_asked():
    """A server that closes every connection after its answer (HTTP/1.0): each request on a new
    connection, each closed one folded into the total; a pool not metered follows none."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from transfer.http.pool import ConnectionPool, PoolStats

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"x" * 1000)

        def do_PUT(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for metered in (True, False):
            stats = PoolStats()
            if metered:
                stats.meter()
            pool = ConnectionPool(f"http://127.0.0.1:{server.server_port}", max_idle=2, stats=stats)
            for _ in range(3):
                with pool.request("GET", "/") as response:
                    assert len(response.read()) == 1000
            with pool.request("PUT", "/up", body=b"y" * 500) as response:
                response.read()
            pool.close()
            assert stats.connections_opened == 4
            assert stats.bytes_moved() == (3500 if metered else 0)
    finally:
        server.shutdown()
        server.server_close()


RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+:(?:DEBUG|INFO|WARNING):")


def test_a_log_record_on_a_terminal_starts_on_a_cleared_line_not_on_the_progress_line(slow, bucket, tmp_path):
    """With -d on a terminal, the records logged while the transfer ran continued the progress
    line ("Completed 2.0 MiB/8.0 MiB ... left2026-12-02 ...:DEBUG:..."). Each now clears it first."""
    src = _put_object(slow, bucket, tmp_path)
    rc, seen, out = under_tty(S3 + ["-d", "get", f"s3://test@minio/{bucket}/big.dat", str(tmp_path / "got.dat")],
                              slow, tmp_path)
    text = seen.decode()
    assert rc == 0 and out == b"" and (tmp_path / "got.dat").read_bytes() == src.read_bytes(), text
    assert LINE.search(text), text  # a progress line was showing
    starts = [m.start() for m in RECORD.finditer(text)]
    after = [at for at in starts if LINE.search(text, 0, at)]
    assert after, text  # records logged once the progress line had shown: the case under test
    assert all(text[:at].endswith("\r\x1b[K") for at in starts), text


@pytest.mark.parametrize("upload", [True, False])
def test_a_bench_phase_through_the_proxy_shows_the_bytes_the_tool_moved(upload, minio, bucket, tmp_path):
    """small-files, sizes, mconcatfit and workflow showed only elapsed time: their phases now
    count the bytes through the proxy each tool is measured behind (harness.wire_moved), reset
    as `measure` starts the tool, here pegasus-cloudio-s3 through a proxy capped at RATE."""
    from pegasus_cloudio_bench.harness import Progress as PhaseProgress, measure, wire_moved
    with TcpProxy((minio.host, minio.port), shaping=Shaping(rate_bps=RATE)) as proxy:
        creds = minio.write_pegasus_credentials(tmp_path / "slow.conf", site="minio", user="test",
                                                endpoint=proxy.url())
        env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
               "AWS_EC2_METADATA_DISABLED": "true", "PEGASUS_CLOUDIO_CACHE_DIR": "off",
               "PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        src = _put_object(env, bucket, tmp_path) if not upload else tmp_path / "src.dat"
        if upload:
            src.write_bytes(os.urandom(8 * MiB))
        url, local = f"s3://test@minio/{bucket}/{'up' if upload else 'big'}.dat", str(tmp_path / "got.dat")
        stream = _Terminal()
        shown = PhaseProgress(stream)
        shown.phase("8 MiB through the proxy", wire_moved(proxy, upload), 8 * MiB)
        done = measure("ours", "x", 1, S3 + ["-q", "put" if upload else "get"] + ([str(src), url] if upload
                                                                                 else [url, local]), env, proxy)
        shown.done()
    assert done.exit_code == 0, done
    parts = re.findall(r"\.\.\. ([\d.]+) (\w+)/8\.0 MiB \(", stream.getvalue())
    assert parts, stream.getvalue()  # the line's thread wakes every 0.5 s; 8 MiB take about 2 s
    assert any(float(n) > 0 and unit in ("KiB", "MiB") for n, unit in parts), stream.getvalue()
