"""The backend layer: every backend reads; uploads and a namespace are capabilities checked
with isinstance (plain HTTP has neither, and no method that only refuses); asking a read-only
source for them is a one-line error naming the URL, sent to no server; backend modules never
import the context, the session or the engine, and transfer/ has no import cycle."""

from __future__ import annotations

import ast
import functools
import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Set

import pytest

from transfer import Engine, Mkdir, Remove, Session, Settings, Transfer, parse_url
from transfer.backends.base import Backend, Namespace, Store, Uploads

REPO = Path(__file__).resolve().parent.parent
TRANSFER = REPO / "transfer"


class _Counting(http.server.SimpleHTTPRequestHandler):
    seen: List[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def _any(self) -> None:
        self.seen.append(self.command)
        self.send_error(405)

    do_PUT = do_POST = do_DELETE = _any

    def do_GET(self) -> None:
        self.seen.append("GET")
        super().do_GET()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "f.txt").write_bytes(b"served")
    _Counting.seen = []
    handler = functools.partial(_Counting, directory=str(tmp_path / "www"))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()


def test_capabilities_are_protocols_plain_http_reads_only(served: str, tmp_path: Path) -> None:
    with Session(Settings(threads=2), {"HOME": str(tmp_path)}) as session:
        web = session.backend(parse_url(f"{served}/f.txt"))
        local = session.backend(parse_url(f"file://{tmp_path}/x"))
    assert isinstance(web, Backend) and not isinstance(web, (Uploads, Namespace))
    assert not any(hasattr(web, name) for name in ("put", "list", "delete", "make_dirs"))
    assert isinstance(local, Store)


def test_writing_to_a_read_only_source_is_one_line_naming_the_url_and_sends_nothing(served: str,
                                                                                     tmp_path: Path) -> None:
    (tmp_path / "up.txt").write_bytes(b"up")
    ops = [Transfer((parse_url(f"file://{tmp_path}/up.txt"),), parse_url(f"{served}/up.txt")),
           Mkdir(parse_url(f"{served}/dir")), Remove(parse_url(f"{served}/f.txt")),
           Remove(parse_url(f"{served}/tree"), recursive=True),
           Transfer((parse_url(f"{served}/f.txt"),), parse_url(f"file://{tmp_path}/down.txt"))]
    with Session(Settings(threads=2, max_attempts=3), {"HOME": str(tmp_path)}) as session:
        results = Engine(session).run(ops)
    up, mkdir, remove, tree, down = results
    assert down.ok and (tmp_path / "down.txt").read_bytes() == b"served"
    expected = {up: "uploaded to", mkdir: "listed, removed from or created",
                remove: "listed, removed from or created", tree: "listed, removed from or created"}
    for result, what in expected.items():
        assert not result.ok and result.attempts == 1  # not retried: bad input
        assert result.error is not None
        assert result.error.message == f"http:// URLs are read-only sources: they cannot be {what}"
        assert result.error.url == str(result.op.dest if isinstance(result.op, Transfer) else result.op.target)
    assert _Counting.seen == ["GET"]  # only the download reached the server


def test_a_copy_to_a_read_only_destination_is_refused_before_the_source_is_read(served: str,
                                                                                 tmp_path: Path) -> None:
    op = Transfer((parse_url(f"{served}/f.txt"),), parse_url(f"{served}/copy.txt"))
    with Session(Settings(threads=2, max_attempts=3), {"HOME": str(tmp_path)}) as session:
        result, = Engine(session).run([op])
    assert not result.ok and result.attempts == 1 and result.error is not None
    assert result.error.message == "http:// URLs are read-only sources: they cannot be uploaded to"
    assert result.error.url == f"{served}/copy.txt"
    assert _Counting.seen == []  # the source was not downloaded first


def test_the_dropin_says_so_in_one_line_and_exits_1(served: str, tmp_path: Path) -> None:
    (tmp_path / "up.txt").write_bytes(b"up")
    spec = [{"type": "transfer", "lfn": "up.txt", "id": 1,
             "src_urls": [{"site_label": "local", "url": f"file://{tmp_path}/up.txt"}],
             "dest_urls": [{"site_label": "web", "url": f"{served}/up.txt"}]}]
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.dropin"], input=json.dumps(spec), text=True,
                          capture_output=True, timeout=120,
                          env={"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": "/dev/null",
                               "PEGASUS_CLOUDIO_CACHE_DIR": "off", "PYTHONPATH": str(REPO)})
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "read-only" in line]
    assert len(errors) == 1 and f"{served}/up.txt" in errors[0] and "cannot be uploaded to" in errors[0]
    assert _Counting.seen == []


def _top_level_imports(path: Path) -> Set[str]:
    """Modules ``path`` imports at module level (lazy imports inside functions are not edges)."""
    found: Set[str] = set()
    for node in ast.parse(path.read_text()).body:
        nodes = [node]
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks are not imports at run time
            nodes = [] if "TYPE_CHECKING" in ast.unparse(node.test) else node.body + node.orelse
        if isinstance(node, ast.Try):
            nodes = node.body
        for item in nodes:
            if isinstance(item, ast.Import):
                found.update(a.name for a in item.names)
            elif isinstance(item, ast.ImportFrom) and item.module and item.level == 0:
                found.add(item.module)
                found.update(f"{item.module}.{a.name}" for a in item.names)
    return found


def _modules() -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for path in TRANSFER.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[name] = set()
        graph[name] = _top_level_imports(path)
    names = set(graph)
    return {m: {d for d in deps if d in names and d != m} for m, deps in graph.items()}


def test_backends_never_import_the_context_the_session_or_the_engine() -> None:
    graph = _modules()
    backends = [m for m in graph if m.startswith("transfer.backends")]
    assert "transfer.backends.s3" in backends and "transfer.backends.http" in backends
    for module in backends:
        assert not graph[module] & {"transfer.context", "transfer.session", "transfer.engine"}, module


def test_transfer_has_no_import_cycle() -> None:
    graph = _modules()
    state: Dict[str, int] = {}

    def visit(module: str, trail: List[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if dep.startswith(module + "."):  # a package importing its own submodule is no cycle
                continue
            if state.get(dep) == 1:
                cycle = trail[trail.index(dep):] + [dep] if dep in trail else [module, dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, trail + [dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
