"""Measuring one client run: wall time, client CPU, requests and connections.

Every command runs as a child process so that its CPU (user + system, including any
processes it starts) is read from ``RUSAGE_CHILDREN``; requests and TCP connections are
counted by the :class:`~pegasus_cloudio.testbed.proxy.TcpProxy` the client talks through.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from pegasus_cloudio.testbed.proxy import TcpProxy


@dataclass(frozen=True)
class Measurement:
    """One run of one tool in one direction; ``extrapolated`` runs are scaled from a sample."""

    tool: str
    direction: str
    files: int
    measured_files: int
    wall_s: float
    cpu_s: float
    requests: int
    connections: int
    exit_code: int
    extrapolated: bool = False
    bytes_moved: int = 0  # on the wire, both directions, as counted at the proxy

    @property
    def files_per_s(self) -> float:
        return self.files / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_ms_per_file(self) -> float:
        return 1000.0 * self.cpu_s / self.files if self.files else 0.0

    def as_dict(self) -> Dict[str, object]:
        data: Dict[str, object] = asdict(self)
        data["files_per_s"] = round(self.files_per_s, 2)
        data["cpu_ms_per_file"] = round(self.cpu_ms_per_file, 4)
        return data


class Progress:
    """Phase messages and a live elapsed-time line on a terminal; silent otherwise."""

    def __init__(self, stream=sys.stderr, enabled: Optional[bool] = None) -> None:  # type: ignore[no-untyped-def]
        self._stream = stream
        self._enabled = stream.isatty() if enabled is None else enabled
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def phase(self, text: str) -> "Progress":
        self.done()
        if not self._enabled:
            return self
        self._stop.clear()
        started = time.monotonic()

        def tick() -> None:
            while not self._stop.wait(0.5):
                self._stream.write(f"\r  {text} ... {time.monotonic() - started:5.1f} s")
                self._stream.flush()

        self._stream.write(f"  {text} ...")
        self._stream.flush()
        self._thread = threading.Thread(target=tick, daemon=True)
        self._thread.start()
        return self

    def done(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._stream.write("\n")
            self._stream.flush()

    def note(self, text: str) -> None:
        self.done()
        if self._enabled:
            self._stream.write(f"  {text}\n")
            self._stream.flush()


def measure(tool: str, direction: str, files: int, argv: Sequence[str], env: Mapping[str, str],
            proxy: TcpProxy, *, stdin: Optional[bytes] = None, cwd: Optional[str] = None) -> Measurement:
    """Run ``argv`` to completion and return what it cost."""
    proxy.reset_counters()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    completed = subprocess.run(list(argv), input=stdin, env=dict(env), cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    counters = proxy.snapshot()
    if completed.returncode != 0:
        tail = (completed.stderr or b"").decode(errors="replace").strip().splitlines()[-5:]
        sys.stderr.write(f"  {tool} {direction} exited {completed.returncode}:\n    " + "\n    ".join(tail) + "\n")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Measurement(tool, direction, files, files, wall, cpu, int(counters["requests"]),
                       int(counters["connections"]), completed.returncode,
                       bytes_moved=int(counters["bytes_up"]) + int(counters["bytes_down"]))


def extrapolate(small: Measurement, large: Measurement, files: int) -> Measurement:
    """Scale two sample runs (different sizes) linearly to ``files``: fixed cost + per-file cost."""
    span = large.measured_files - small.measured_files

    def scale(a: float, b: float) -> float:
        slope = (b - a) / span if span > 0 else b / max(1, large.measured_files)
        return b + slope * (files - large.measured_files)

    return Measurement(large.tool, large.direction, files, large.measured_files,
                       scale(small.wall_s, large.wall_s), scale(small.cpu_s, large.cpu_s),
                       round(scale(small.requests, large.requests)),
                       round(scale(small.connections, large.connections)),
                       max(small.exit_code, large.exit_code), extrapolated=True,
                       bytes_moved=round(scale(small.bytes_moved, large.bytes_moved)))


def tool_env(extra: Mapping[str, str]) -> Dict[str, str]:
    """This process's environment without AWS/Pegasus settings and with bytecode caching on, plus
    ``extra``. The node cache is off unless ``extra`` turns it on: benchmarks measure transfers,
    not cache hits."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PEGASUS_"))}
    # Installed tools run from compiled bytecode; without it every process recompiles its modules.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PEGASUS_CLOUDIO_CACHE_DIR"] = "off"
    env.update(extra)
    return env


def make_inputs(root: str, count: int, size: int) -> Tuple[str, List[str]]:
    """``count`` files of ``size`` random bytes in ``root/src``: (that directory, their names)."""
    src = os.path.join(root, "src")
    os.makedirs(src)
    names = [f"f{i:05d}.dat" for i in range(count)]
    for name in names:
        with open(os.path.join(src, name), "wb") as fh:
            fh.write(os.urandom(size))
    return src, names


def ratio(numerator: float, denominator: float) -> Optional[float]:
    """numerator / denominator, or None when the denominator is not positive."""
    return numerator / denominator if denominator > 0 else None


def fresh_dir(root: str, name: str) -> str:
    """``root/name`` as a new, empty directory."""
    path = os.path.join(root, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def files_identical(a_dir: str, b_dir: str, names: List[str]) -> bool:
    for name in names:
        with open(os.path.join(a_dir, name), "rb") as a, open(os.path.join(b_dir, name), "rb") as b:
            if a.read() != b.read():
                return False
    return True
