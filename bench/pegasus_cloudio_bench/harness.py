"""Measuring one client run: wall time, client CPU, requests and connections.

Every command runs as a child process so that its CPU (user + system, including any
processes it starts) is read from ``RUSAGE_CHILDREN``; requests and TCP connections are
counted by the :class:`~pegasus_cloudio_testbed.proxy.TcpProxy` the client talks through.

Slow tools are measured on samples and extrapolated (:func:`extrapolate`, marked
``extrapolated``); a sample below :func:`minimum_sample` files is refused unless the user
passes ``--allow-small-sample`` (:func:`sample_problems`), because a few files' noise swings
the extrapolated figure by an order of magnitude.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Type, TypeVar

from pegasus_cloudio_testbed.proxy import TcpProxy

_P = TypeVar("_P")


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
    """Phase messages on stderr: a live elapsed-time line on a terminal; otherwise (a log, CI)
    one line when a phase starts and one every ``interval`` seconds while it runs. A phase given
    ``moved`` (bytes so far, read by the line's thread) and ``total`` shows bytes, rate and time
    left too, in ``pegasus-cloudio-s3``'s words (:mod:`pegasus_cloudio.progress`)."""

    def __init__(self, stream=sys.stderr, enabled: bool = True, interval: float = 30.0) -> None:  # type: ignore[no-untyped-def]
        self._stream = stream
        self._enabled = enabled
        self._live = enabled and stream.isatty()
        self._interval = interval
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def phase(self, text: str, moved: Optional[Callable[[], int]] = None, total: Optional[int] = None) -> "Progress":
        self.done()
        if not self._enabled:
            return self
        self._stop.clear()
        started = time.monotonic()

        def tick() -> None:
            while not self._stop.wait(0.5 if self._live else self._interval):
                elapsed = time.monotonic() - started
                state = f"{elapsed:5.1f} s" if moved is None else bytes_line(moved(), total, elapsed)
                self._write(f"\r  {text} ... {state}" if self._live
                            else f"  {text} ... still running, {state if moved else f'{elapsed:.0f} s'}\n")

        self._write(f"  {text} ..." + ("" if self._live else "\n"))
        self._thread = threading.Thread(target=tick, daemon=True)
        self._thread.start()
        return self

    def _write(self, text: str) -> None:
        self._stream.write(text)
        self._stream.flush()

    def done(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            if self._live:
                self._write("\n")

    def note(self, text: str) -> None:
        self.done()
        if self._enabled:
            self._stream.write(f"  {text}\n")
            self._stream.flush()


def bytes_line(done: int, total: Optional[int], elapsed: float) -> str:
    """``12.0 MiB/1.0 GiB (34.5 MiB/s), 0:29 left, 12.3 s`` (no total: no time left)."""
    from pegasus_cloudio.progress import size_text, time_text
    rate = done / elapsed if elapsed > 0 else 0.0
    text = size_text(done) + (f"/{size_text(total)}" if total else "") + f" ({size_text(rate)}/s)"
    if total and rate > 0 and done < total:
        text += f", {time_text((total - done) / rate)} left"
    return f"{text}, {elapsed:.1f} s    "  # spaces: the rest of a longer line before


def wire_moved(counter: TcpProxy, upload: Optional[bool]) -> Callable[[], int]:
    """A phase's ``moved`` for tools run through ``counter`` (the proxy `measure` resets as each
    run starts, so the count is the current run's): the bytes it carried up (``upload``), down,
    or both ways (None); request and response heads count too, a small share of a file's bytes."""
    if upload is None:
        return lambda: counter.bytes_up + counter.bytes_down
    return (lambda: counter.bytes_up) if upload else (lambda: counter.bytes_down)


def tree_bytes(path: str, name: Optional[str] = None) -> int:
    """The bytes of the files under ``path`` (whose names contain ``name``, when given); files
    that go away while it looks are skipped. A phase's ``moved`` for a tool that writes a file."""
    total = 0
    for folder, _dirs, files in os.walk(path):
        for entry in files:
            if name is None or name in entry:
                try:
                    total += os.lstat(os.path.join(folder, entry)).st_size
                except OSError:
                    pass
    return total


def add_params_arguments(parser: "argparse.ArgumentParser", defaults: Any, helps: Mapping[str, str]) -> None:
    """One ``--flag`` per field of the frozen dataclass ``defaults`` (booleans: store_true)."""
    for field in dataclasses.fields(defaults):
        value = getattr(defaults, field.name)
        flag = "--" + field.name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, action="store_true", help=helps[field.name])
        else:
            parser.add_argument(flag, type=type(value), default=value, help=f"{helps[field.name]} (default {value})")


def params_from_args(cls: Type[_P], args: "argparse.Namespace") -> _P:
    """The dataclass ``cls`` filled from the flags :func:`add_params_arguments` added."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


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
    """Scale two sample runs (different sizes) linearly to ``files``: fixed cost + per-file cost.

    When the larger sample cost less than the smaller one (noise), the per-file average of the
    larger sample is used instead, so no figure is ever negative or shrinks with ``files``."""
    span = large.measured_files - small.measured_files

    def scale(a: float, b: float) -> float:
        slope = (b - a) / span if span > 0 else -1.0
        if slope < 0:
            slope = b / max(1, large.measured_files)
        return max(0.0, b + slope * (files - large.measured_files))

    return Measurement(large.tool, large.direction, files, large.measured_files,
                       scale(small.wall_s, large.wall_s), scale(small.cpu_s, large.cpu_s),
                       round(scale(small.requests, large.requests)),
                       round(scale(small.connections, large.connections)),
                       max(small.exit_code, large.exit_code), extrapolated=True,
                       bytes_moved=round(scale(small.bytes_moved, large.bytes_moved)))


def sample_sizes(count: int, sample: int) -> List[int]:
    """The two samples (``S/4`` and ``S`` files, at most ``count``) a per-file tool is measured on
    before :func:`extrapolate` scales them to ``count``; one when they coincide."""
    return sorted({max(1, min(count, sample) // 4), min(count, sample)})


def per_file_samples(ws: "StoreWorkspace", proxy: TcpProxy, progress: "Progress", tool: str, phase: str,
                     argv: Sequence[str], bucket: str, prefix: str) -> Tuple[Measurement, Measurement, bool]:
    """A per-file baseline driver (``argv + ["put"|"get"]`` reading ``[[bucket, key, path], ...]`` as
    JSON on stdin) on :func:`sample_sizes` of ``ws``'s files, out to ``prefix<size>/`` then back
    in: (stage-out, stage-in) extrapolated to ``ws.params.count``, and whether every file read back
    is byte for byte the original. ``phase`` names the tool in the progress lines."""
    p = ws.params
    out: List[Measurement] = []
    into: List[Measurement] = []
    identical = True
    for size in sample_sizes(p.count, p.stock_sample):
        names = ws.names[:size]
        progress.phase(f"{phase}: stage-out sample of {size} files")
        items = [[bucket, f"{prefix}{size}/{n}", os.path.join(ws.src, n)] for n in names]
        out.append(measure(tool, "stage-out", size, [*argv, "put"], ws.env, proxy, stdin=json.dumps(items).encode()))
        dest = ws.fresh_dir(f"in-{prefix}{size}")
        progress.phase(f"{phase}: stage-in sample of {size} files")
        items = [[bucket, f"{prefix}{size}/{n}", os.path.join(dest, n)] for n in names]
        into.append(measure(tool, "stage-in", size, [*argv, "get"], ws.env, proxy, stdin=json.dumps(items).encode()))
        identical = identical and into[-1].exit_code == 0 and files_identical(ws.src, dest, names)
    return extrapolate(out[0], out[-1], p.count), extrapolate(into[0], into[-1], p.count), identical


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


def ab_wheels(server: Any, root: str, trees: Mapping[str, str], site: str) -> Tuple[Dict[str, str], Dict[str, str]]:
    """For the scripts that race two source trees on one MinIO ``server``: (the environment,
    each tree's ``bin`` directory). Each tree (a source checkout's path: a script passes its own
    for "this", never the interpreter it runs in, whose environment is not a worker's) is built
    into a wheel installed in a venv of its own under ``root``; the environment is
    :func:`tool_env`'s with Pegasus credentials for ``server``
    as ``site``, no config file and no ``PYTHONPATH`` (each wheel runs its own code)."""
    from pegasus_cloudio_testbed.wheel import installed_bin
    creds = server.write_pegasus_credentials(os.path.join(root, "credentials.conf"), site=site, user="bench",
                                             endpoint=server.endpoint)
    env = tool_env({"PEGASUS_CREDENTIALS": str(creds), "PEGASUS_CLOUDIO_CONFIG": os.devnull})
    env.pop("PYTHONPATH", None)
    return env, {name: installed_bin(os.path.join(root, f"wheel-{name}"), tree) for name, tree in trees.items()}


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


class StoreWorkspace:
    """Input files (``src``, ``names``: `make_inputs`), output dirs and the client environment
    (``env``, which the subclass sets) of one run against a store whose objects are
    ``<base_url>/<prefix>/<name>``: what ``small_files.measure_ours`` and the scenarios take."""

    env: Dict[str, str]

    def __init__(self, root: str, params: Any, base_url: str) -> None:
        """``params`` has ``count`` and ``size`` (the inputs to make)."""
        self.root = root
        self.params = params
        self.base_url = base_url
        self.src, self.names = make_inputs(root, params.count, params.size)

    def object_url(self, prefix: str, name: str) -> str:
        return f"{self.base_url}/{prefix}/{name}"

    def out_pairs(self, prefix: str, names: Sequence[str]) -> List[Tuple[str, str]]:
        """(source, destination) of a stage-out of ``names`` to ``prefix``."""
        return [(f"file://{self.src}/{n}", self.object_url(prefix, n)) for n in names]

    def in_pairs(self, prefix: str, names: Sequence[str], dest: str) -> List[Tuple[str, str]]:
        """(source, destination) of a stage-in of ``names`` from ``prefix`` into ``dest``."""
        return [(self.object_url(prefix, n), f"file://{dest}/{n}") for n in names]

    def fresh_dir(self, name: str) -> str:
        return fresh_dir(self.root, name)


def cache_entries(cache: str) -> int:
    """The entries a node cache directory ``cache`` holds (its ``objects/<hh>/<sha256>`` files)."""
    objects = os.path.join(cache, "objects")
    shards = os.listdir(objects) if os.path.isdir(objects) else []
    return sum(len([n for n in os.listdir(os.path.join(objects, d)) if len(n) == 64]) for d in shards)


def wait_filled(cache: str, count: int, timeout: float = 300.0) -> None:
    """Wait until the node cache ``cache`` holds ``count`` entries: a job fills it in a child
    behind its answer, which the next timed run must not overlap. SystemExit after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while cache_entries(cache) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"the cache {cache} holds {cache_entries(cache)} of {count} entries after {timeout:g} s")
        time.sleep(0.05)


def files_identical(a_dir: str, b_dir: str, names: List[str]) -> bool:
    for name in names:
        with open(os.path.join(a_dir, name), "rb") as a, open(os.path.join(b_dir, name), "rb") as b:
            if a.read() != b.read():
                return False
    return True


MIN_SAMPLE_FILES = 100
MIN_SAMPLE_FRACTION = 0.10


def minimum_sample(count: int) -> int:
    """The smallest sample a figure for ``count`` files is extrapolated from: max(100, 10%)."""
    return min(count, max(MIN_SAMPLE_FILES, math.ceil(MIN_SAMPLE_FRACTION * count)))


def add_sample_arguments(parser: argparse.ArgumentParser, flag: str, what: str) -> None:
    """``flag`` (files measured before extrapolating) and ``--allow-small-sample``."""
    parser.add_argument(flag, type=int, default=None,
                        help=f"{what} before extrapolating (default and minimum: max(100, 10%% of "
                             "--count), at most --count)")
    parser.add_argument("--allow-small-sample", action="store_true",
                        help="accept a sample below that minimum (extrapolated figures then swing widely)")


def sample_problems(flag: str, sample: Optional[int], count: int, allow: bool) -> List[str]:
    """One message when ``sample`` is below :func:`minimum_sample` and ``allow`` is off."""
    need = minimum_sample(count)
    if sample is not None and sample < 1:
        return [f"{flag} must be at least 1 (got {sample})"]
    if sample is None or sample >= need or allow:
        return []
    return [f"{flag} {sample} is below the minimum of {need} files (max(100, 10% of --count {count})): "
            "figures extrapolated from it are unreliable; raise it or pass --allow-small-sample"]


def resolve_sample(sample: Optional[int], count: int) -> int:
    return sample if sample is not None else minimum_sample(count)


Column = Tuple[str, str, str]  # header, key of a run's dict, format spec
EXTRAPOLATED_NOTE = ("runs marked 'extrapolated' were measured on the samples named and scaled linearly "
                     "to the file count; ratios that use them inherit that")


def aligned(rows: Sequence[Sequence[str]], left: int = 1) -> List[str]:
    """Rows of cells as text columns: the first ``left`` left-aligned, the rest right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [" ".join(cell.ljust(width) if i < left else cell.rjust(width)
                     for i, (cell, width) in enumerate(zip(row, widths))).rstrip() for row in rows]


def run_rows(runs: Sequence[Mapping[str, object]], columns: Sequence[Column]) -> List[str]:
    """The table of runs (``Measurement.as_dict``): run, direction, then ``columns``; extrapolated
    runs say so in their name, and a note under the table says what that means."""
    header = ["run", "direction"] + [name for name, _, _ in columns]
    body = [[str(run["tool"]) + (f" (extrapolated from {run['measured_files']} files)" if run["extrapolated"]
                                 else ""), str(run["direction"])]
            + [format(run[key], spec) for _, key, spec in columns] for run in runs]
    rows = aligned([header] + body, left=2)
    if any(run["extrapolated"] for run in runs):
        rows.append(f"note: {EXTRAPOLATED_NOTE}")
    return rows
