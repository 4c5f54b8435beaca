"""Fixtures for the condor plugin tests: a simulated ``condor_starter`` and an HTTPS server.

:class:`Starter` drives the plugin exactly as ``condor_starter`` does (spec §1-§2): it runs
the installed console script under the file name ``cloudio_plugin`` (so the job-variable
prefix is ``CLOUDIO_``), asks ``-classad`` with stderr merged into stdout, writes the file
ads back to back with no separator into ``<sandbox>/.cloudio_plugin.in``, pre-fills
``.cloudio_plugin.out`` with 19,264 spaces, runs ``-infile IN -outfile OUT [-upload]`` and
parses the result ads with ``classad2`` the way the starter does (new format, stopping at
the first ad that does not parse).

:class:`HttpsFiles` is a real HTTP/1.1 server (TLS from a throw-away CA) keeping objects in
memory: GET, PUT (checking ``Content-MD5``), and ``/private/...`` paths that require
``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import os
import ssl
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import boto3
import classad2
import pytest

from pegasus_cloudio_testbed.certs import make_tls_files

PREALLOCATED = 19264  # 16*1204/64 blocks of 64 spaces, as the starter writes them
PLUGIN_FILE = "cloudio_plugin"
SCRIPT = Path(sys.executable).parent / "pegasus-cloudio-condor-plugin"

# filterPluginResults() in condor_starter: the attributes that survive, with their types.
RESULT_TYPES = {
    "transfersuccess": bool, "transfererror": str, "transferprotocol": str, "transfertype": str,
    "transferfilename": str, "transferfilebytes": int, "transfertotalbytes": int,
    "transferstarttime": int, "transferendtime": int, "connectiontimeseconds": float,
    "transferurl": str, "transfererrordata": list, "developerdata": classad2.ClassAd, "transferdata": list,
}
ERROR_DATA_TYPES = {
    "intermediateservererrortype": str, "intermediateserver": str, "errortype": str, "pluginversion": str,
    "pluginlaunched": bool, "failedname": str, "failuretype": str, "failedserver": str,
    "shouldrefresh": bool, "errorcode": int, "errorstring": str, "retryable": int,
    "developerdata": classad2.ClassAd,
}


def file_ad(url: str, local: str, **extra: object) -> str:
    """One input file ad as the starter's ClassAdUnParser writes it."""
    return repr(classad2.ClassAd({"Url": url, "LocalFileName": local, **extra}))


@dataclass
class PluginRun:
    """What one transfer invocation left behind."""

    returncode: int
    output: str           # stdout + stderr (the starter merges them)
    ads: List[classad2.ClassAd]
    outfile: Path

    def ad_for(self, url: str) -> classad2.ClassAd:
        found = [ad for ad in self.ads if ad.eval("TransferUrl") == url]
        assert len(found) == 1, f"{len(found)} result ads for {url}: {self.ads}"
        return found[0]


def parse_results(text: str) -> List[classad2.ClassAd]:
    """Result ads as the starter reads them (stops at the first unparsable ad)."""
    ads = []
    try:
        for ad in classad2.parseAds(text, classad2.ParserType.New):
            ads.append(ad)
    except ValueError:
        pass
    return ads


@dataclass
class Starter:
    """A simulated condor_starter for one job sandbox."""

    plugin: Path
    sandbox: Path
    env: Dict[str, str] = field(default_factory=dict)

    def query(self) -> Tuple[int, str, str]:
        done = subprocess.run([str(self.plugin), "-classad"], env=self.env, capture_output=True, text=True,
                              timeout=60)
        return done.returncode, done.stdout, done.stderr

    def prepare(self, ads: Sequence[str]) -> Tuple[Path, Path]:
        infile, outfile = self.sandbox / f".{PLUGIN_FILE}.in", self.sandbox / f".{PLUGIN_FILE}.out"
        infile.write_text("".join(ads))
        outfile.write_text(" " * PREALLOCATED)
        return infile, outfile

    def write_job_ad(self, lines: Sequence[str]) -> Path:
        """``.job.ad`` (old format) beside the sandbox's files, named by ``_CONDOR_JOB_AD``
        as every starter does; a 23.x starter passes no job variables besides."""
        path = self.sandbox / ".job.ad"
        path.write_text("".join(line + "\n" for line in ["ClusterId = 42", "ProcId = 0", *lines]))
        self.env["_CONDOR_JOB_AD"] = str(path)
        return path

    def write_machine_ad(self, version: str) -> Path:
        """``.machine.ad`` named by ``_CONDOR_MACHINE_AD``, with the starter's ``CondorVersion``."""
        path = self.sandbox / ".machine.ad"
        path.write_text(f'Arch = "X86_64"\nCondorVersion = "$CondorVersion: {version} 2025-10-30 BuildID: 1 $"\n'
                        'OpSys = "LINUX"\n')
        self.env["_CONDOR_MACHINE_AD"] = str(path)
        return path

    def argv(self, infile: Path, outfile: Path, upload: bool) -> List[str]:
        return [str(self.plugin), "-infile", str(infile), "-outfile", str(outfile)] + (["-upload"] if upload else [])

    def run(self, ads: Sequence[str], *, upload: bool = False, env: Optional[Mapping[str, str]] = None) -> PluginRun:
        infile, outfile = self.prepare(ads)
        done = subprocess.run(self.argv(infile, outfile, upload), env=dict(env or self.env),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        return PluginRun(done.returncode, done.stdout, parse_results(outfile.read_text()), outfile)

    def start(self, ads: Sequence[str], *, upload: bool = False) -> Tuple["subprocess.Popen[str]", Path]:
        infile, outfile = self.prepare(ads)
        proc = subprocess.Popen(self.argv(infile, outfile, upload), env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        return proc, outfile


def hold_reason_details(run: "PluginRun", plugin: str) -> str:
    """The text condor_starter 23.9 builds from a failed batch (one CondorError per failed
    ad, the last pushed first, joined by ``|``) and sends through its transfer pipe."""
    parts = [f"FILETRANSFER:1:non-zero exit ({run.returncode}) from {plugin}. |Error: "
             f"{ad.eval('TransferError')} ( URL file = {ad.eval('TransferUrl')} )|"
             for ad in run.ads if ad.eval("TransferSuccess") is not True]
    return "|".join(reversed(parts))


# --------------------------------------------------------------------------- shared test helpers


def s3_client(server, **extra):
    return boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=server.access_key,
                        aws_secret_access_key=server.secret_key, region_name="us-east-1", **extra)


def put_objects(server, bucket, objects):
    client = s3_client(server)
    for key, data in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)


def assert_filter_types(ad):
    """Every attribute survives the starter's result filter unchanged (name and exact type)."""
    for name in ad.keys():
        expected = RESULT_TYPES.get(name.lower())
        assert expected is not None, f"{name} would be dropped by the starter"
        value = ad.eval(name)
        assert type(value) is expected, f"{name} = {value!r} is not {expected.__name__}"
    for entry in ad.eval("TransferErrorData") if "TransferErrorData" in ad else []:
        for name in entry.keys():
            expected = ERROR_DATA_TYPES.get(name.lower())
            assert expected is not None and type(entry.eval(name)) is expected, f"TransferErrorData.{name}"


def sandbox_leftovers(sandbox):
    """Hidden files in the sandbox besides the starter's own (request, results, job and machine ads)."""
    return sorted(p.name for p in sandbox.rglob(".*")
                  if not p.name.startswith(".cloudio_plugin.") and p.name not in (".job.ad", ".machine.ad"))


def write_credentials(path, server, secret):
    path.write_text(f"[minio]\nendpoint = {server.endpoint}\n[test@minio]\naccess_key = {server.access_key}\n"
                    f"secret_key = {secret}\n")
    path.chmod(0o600)
    return path


def base_env(home: Path) -> Dict[str, str]:
    """The starter's environment: nothing of the test runner's credentials, fast retries; the
    runner's PYTHONPATH, so that the plugin runs the checkout under test (a git worktree), not
    the one the venv's editable install names."""
    path = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    return {**path, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "PEGASUS_CLOUDIO_CONFIG": os.devnull, "AWS_EC2_METADATA_DISABLED": "true",
            "PEGASUS_CLOUDIO_RETRY_BASE_DELAY": "0.05", "PEGASUS_CLOUDIO_RETRY_MAX_DELAY": "0.2",
            "PEGASUS_CLOUDIO_CONNECT_TIMEOUT": "5", "PEGASUS_CLOUDIO_READ_TIMEOUT": "20"}


@pytest.fixture(scope="session")
def condor_plugin(tmp_path_factory) -> Path:
    """The installed plugin under the file name an administrator gives it (``cloudio_plugin``)."""
    assert SCRIPT.exists(), f"{SCRIPT} is not installed: run pip install -e ."
    link = tmp_path_factory.mktemp("libexec") / PLUGIN_FILE
    link.symlink_to(SCRIPT)
    return link


@pytest.fixture
def starter(condor_plugin: Path, tmp_path: Path) -> Starter:
    """A 25.0.3 starter (one that reads every pipe message) with an empty job sandbox and a
    bare environment; ``write_machine_ad("23.9.6")`` makes it an older one."""
    sandbox = tmp_path / "execute" / "dir_4242"
    sandbox.mkdir(parents=True)
    simulated = Starter(condor_plugin, sandbox, base_env(tmp_path))
    simulated.write_machine_ad("25.0.3")
    return simulated


# --------------------------------------------------------------------------- HTTPS server


class HttpsFiles:
    """Objects in memory over HTTP/1.1 (TLS unless ``tls=False``); see the module docstring."""

    def __init__(self, directory: Path, *, tls: bool = True, token: str = "s3cr3t-token",
                 check_md5: bool = True, on_put: Optional[Callable[[str], None]] = None) -> None:
        self.objects: Dict[str, bytes] = {}
        self.token = token
        self.check_md5 = check_md5  # False: a store that ignores Content-MD5 (plain WebDAV, nginx...)
        self.on_put = on_put  # called with the path when a PUT's head has arrived, before its body
        self.auth_seen: List[Optional[str]] = []
        self.tls = make_tls_files(directory) if tls else None
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.tls.cert, self.tls.key)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def ca_file(self) -> str:
        assert self.tls is not None
        return str(self.tls.ca_cert)

    def url(self, path: str, scheme: Optional[str] = None) -> str:
        scheme = scheme or ("https" if self.tls else "http")
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}{path}"

    def __enter__(self) -> "HttpsFiles":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(store: HttpsFiles) -> type:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            return None

        def _authorized(self) -> bool:
            header = self.headers.get("Authorization")
            store.auth_seen.append(header)
            return not self.path.startswith("/private/") or header == f"Bearer {store.token}"

        def _reply(self, code: int, body: bytes = b"", etag: Optional[str] = None) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            if etag:
                self.send_header("ETag", f'"{etag}"')
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            key = self.path.split("?", 1)[0]
            if not self._authorized():
                self._reply(401, b"token required")
            elif key not in store.objects:
                self._reply(404, b"no such object")
            else:
                data = store.objects[key]
                self._reply(200, data, hashlib.md5(data).hexdigest())

        def do_PUT(self) -> None:  # noqa: N802
            if store.on_put is not None:
                store.on_put(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            declared = self.headers.get("Content-MD5") if store.check_md5 else None
            if not self._authorized():
                self._reply(401, b"token required")
            elif declared and base64.b64decode(declared) != hashlib.md5(body).digest():
                self._reply(400, b"BadDigest")
            else:
                store.objects[self.path.split("?", 1)[0]] = body
                self._reply(201, b"", hashlib.md5(body).hexdigest())

    return Handler


@pytest.fixture
def https_files(tmp_path: Path) -> Iterator[HttpsFiles]:
    with HttpsFiles(tmp_path / "tls") as server:
        yield server


@pytest.fixture
def condor_creds(tmp_path: Path, https_files: HttpsFiles) -> Path:
    """A ``$_CONDOR_CREDS`` directory holding ``scitokens.use`` (JSON, mode 0600)."""
    creds = tmp_path / "creds"
    creds.mkdir(mode=0o700)
    token = creds / "scitokens.use"
    token.write_text('{"access_token": "%s", "expires_in": 1200}\n' % https_files.token)
    token.chmod(0o600)
    return creds
