"""Side by side with the real pegasus-transfer 5.1.3: the same inputs must give the same
files and the same exit codes (spec section 8)."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from pegasus_cloudio_testbed.stock import make_stock_home

OURS = [sys.executable, "-m", "pegasus_cloudio.dropin"]


@dataclass
class Run:
    rc: int
    out: str
    err: str


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    return make_stock_home(tmp_path_factory.mktemp("stock"))


def run_tool(argv, spec, env, cwd):
    done = subprocess.run(argv + ["-m", "1"], input=spec, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    return Run(done.returncode, done.stdout, done.stderr)


def both(stock, spec, env, tmp_path, name):
    """Run stock and ours on ``spec`` (a function of the run's output dir) in twin directories."""
    runs = {}
    for tool, argv, tool_env in (("stock", [stock.transfer], stock.env(env)), ("ours", OURS, env)):
        work = tmp_path / f"{name}-{tool}"
        work.mkdir()
        runs[tool] = (run_tool(argv, spec(work), tool_env, work), work)
    return runs


def tree(directory):
    found = {}
    for root, _dirs, files in os.walk(directory):
        for f in files:
            path = os.path.join(root, f)
            rel = os.path.relpath(path, directory)
            found[rel] = ("link", os.readlink(path)) if os.path.islink(path) else open(path, "rb").read()
    return found


def transfer(src, dst, src_label="local", dst_label="local", **extra):
    return {"type": "transfer", "lfn": os.path.basename(dst), "id": 1,
            "src_urls": [{"site_label": src_label, "url": src}],
            "dest_urls": [{"site_label": dst_label, "url": dst}], **extra}


@pytest.fixture
def inputs(tmp_path):
    src = tmp_path / "inputs"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.txt").write_bytes(f"file {i}\n".encode() * (i + 1))
    return src


@pytest.fixture
def env(tmp_path):
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull}


def test_json_local_copies_match(stock, inputs, env, tmp_path):
    spec = lambda w: json.dumps([transfer(f"file://{inputs}/f{i}.txt", f"file://{w}/out/deep/f{i}.txt")
                                 for i in range(3)])
    runs = both(stock, spec, env, tmp_path, "json")
    assert runs["stock"][0].rc == runs["ours"][0].rc == 0
    assert tree(runs["stock"][1]) == tree(runs["ours"][1]) != {}


def test_v1_format_and_env_var_expansion_match(stock, inputs, env, tmp_path):
    env = dict(env, OUTROOT=str(tmp_path))
    spec = lambda w: (f"# src 1 local\nfile://{inputs}/f1.txt\n# dst 1 local\nfile://$OUTROOT/{w.name}/v1/f1.txt\n")
    runs = both(stock, spec, env, tmp_path, "v1")
    assert runs["stock"][0].rc == runs["ours"][0].rc == 0
    assert tree(runs["stock"][1]) == tree(runs["ours"][1]) == {"v1/f1.txt": b"file 1\nfile 1\n"}


def test_unclosed_and_half_braced_variables_expand_like_stock(stock, inputs, env, tmp_path):
    """Stock's ``\\${?NAME}?`` makes each brace optional: ``${OUTROOT`` and ``$OUTROOT}`` name OUTROOT."""
    env = dict(env, OUTROOT=str(tmp_path))
    spec = lambda w: json.dumps([transfer(f"file://{inputs}/f0.txt", f"file://${{OUTROOT/{w.name}/a/f0.txt"),
                                 transfer(f"file://{inputs}/f1.txt", f"file://$OUTROOT}}/{w.name}/b/f1.txt")])
    runs = both(stock, spec, env, tmp_path, "braces")
    assert runs["stock"][0].rc == runs["ours"][0].rc == 0, runs["ours"][0].err
    assert tree(runs["stock"][1]) == tree(runs["ours"][1]) == {"a/f0.txt": b"file 0\n",
                                                               "b/f1.txt": b"file 1\nfile 1\n"}


def test_float_priorities_are_read_like_stock(stock, inputs, env, tmp_path):
    """Stock reads ``int(priority)``: 5.9 is 5, below 6, so f1 is copied; ``"5.9"`` stops the run."""
    def spec(w, bad=False):
        entry = transfer(f"file://{inputs}/f0.txt", f"file://{w}/out.txt")
        entry["src_urls"] = [{"site_label": "local", "url": f"file://{inputs}/f0.txt", "priority": 5.9},
                             {"site_label": "local", "url": f"file://{inputs}/f1.txt", "priority": 6}]
        if bad:
            entry["dest_urls"][0]["priority"] = "5.9"
        return json.dumps([entry])
    runs = both(stock, spec, env, tmp_path, "prio")
    assert runs["stock"][0].rc == runs["ours"][0].rc == 0, runs["ours"][0].err
    assert tree(runs["stock"][1]) == tree(runs["ours"][1]) == {"out.txt": b"file 1\nfile 1\n"}
    runs = both(stock, lambda w: spec(w, bad=True), env, tmp_path, "badprio")
    assert runs["stock"][0].rc == runs["ours"][0].rc == 1
    assert tree(runs["stock"][1]) == tree(runs["ours"][1]) == {}
    assert "entry 0: dest_urls[0] priority '5.9' is not a whole number" in runs["ours"][0].err


def test_a_directory_source_fails_like_stock_whatever_the_destination(stock, env, tmp_path):
    """Stock's file handler would run ``cp -f -R -L``, but its ``verify_local_file`` first opens the
    source, which fails for a directory ("File is not readable"): no directory is ever copied,
    into an existing directory or elsewhere."""
    def spec(w):
        (w / "srcdir" / "sub").mkdir(parents=True)
        (w / "srcdir" / "sub" / "b").write_bytes(b"b")
        (w / "existing").mkdir()
        return json.dumps([transfer(f"file://{w}/srcdir", f"file://{w}/existing"),
                           transfer(f"file://{w}/srcdir", f"file://{w}/new")])
    runs = both(stock, spec, env, tmp_path, "dirsrc")
    assert runs["stock"][0].rc == runs["ours"][0].rc == 1
    assert tree(runs["stock"][1]) == tree(runs["ours"][1]) == {"srcdir/sub/b": b"b"}
    assert not (runs["ours"][1] / "new").exists() and os.listdir(runs["ours"][1] / "existing") == []


def test_a_file_whose_destination_is_an_existing_directory_fails_where_stock_writes_inside_it(
        stock, inputs, env, tmp_path):
    """A deliberate difference: stock's ``cp -R`` puts the file at ``DIR/<name>`` and reports success,
    so the job finds a directory where its file should be; ours fails, naming the path."""
    def spec(w):
        (w / "out").mkdir()
        return json.dumps([transfer(f"file://{inputs}/f0.txt", f"file://{w}/out")])
    runs = both(stock, spec, env, tmp_path, "intodir")
    assert runs["stock"][0].rc == 0 and tree(runs["stock"][1]) == {"out/f0.txt": b"file 0\n"}
    assert runs["ours"][0].rc == 1 and tree(runs["ours"][1]) == {}
    assert f"{runs['ours'][1]}/out: Is a directory" in runs["ours"][0].err


def test_userinfo_in_an_http_url_authenticates_like_stock(stock, env, tmp_path):
    """Stock's wget answers the server's Basic challenge with the URL's ``user:password``."""
    import base64

    from pegasus_cloudio_testbed.scripted import Reply, ScriptedServer
    good = "Basic " + base64.b64encode(b"joe:s3cret").decode()

    def guarded(req):
        if req.header("Authorization") != good:
            return Reply(401, {"WWW-Authenticate": 'Basic realm="x"'}, b"no")
        return Reply(200, {}, b"members only\n")
    with ScriptedServer(guarded) as server:
        url = server.endpoint.replace("http://", "http://joe:s3cret@") + "/f"
        runs = both(stock, lambda w: json.dumps([transfer(url, f"file://{w}/f", src_label="web")]), env, tmp_path,
                    "userinfo")
    assert runs["stock"][0].rc == runs["ours"][0].rc == 0, runs["ours"][0].err
    assert tree(runs["stock"][1]) == tree(runs["ours"][1]) == {"f": b"members only\n"}


def through_proxy(stock, env, tmp_path, proxy_env, **proxy_options):
    """Stock and ours fetch one http file with ``proxy_env`` set and a ForwardProxy
    (``proxy_options``; ``proxy_env`` may name it with ``{proxy}``) on the way; per tool: exit
    code, (method, target) of each request the proxy saw, the files written; and the URL."""
    from pegasus_cloudio_testbed.forward_proxy import ForwardProxy
    from pegasus_cloudio_testbed.scripted import Reply, ScriptedServer
    with ScriptedServer(lambda req: Reply(200, {}, b"via proxy\n")) as origin, ForwardProxy(**proxy_options) as proxy:
        url = f"{origin.endpoint}/f"
        seen = {}
        for tool, argv, tool_env in (("stock", [stock.transfer], stock.env(env)), ("ours", OURS, env)):
            work = tmp_path / f"proxy-{tool}"
            work.mkdir()
            before = len(proxy.requests)
            spec = json.dumps([transfer(url, f"file://{work}/f", src_label="web")])
            variables = {name: value.format(proxy=proxy.url) for name, value in proxy_env.items()}
            done = run_tool(argv, spec, dict(tool_env, **variables), work)
            seen[tool] = (done.rc, [(r.method, r.target) for r in proxy.requests[before:]], tree(work))
    return seen, url


@pytest.mark.parametrize("variable, extra, via", [("http_proxy", {}, True),
                                                   ("OSG_SQUID_LOCATION", {}, True),
                                                   ("http_proxy", {"no_proxy": "localhost,127.0.0.1"}, False)])
def test_http_downloads_go_through_the_proxy_like_stock(stock, env, tmp_path, variable, extra, via):
    seen, url = through_proxy(stock, env, tmp_path, dict(extra, **{variable: "{proxy}"}))
    assert seen["ours"] == seen["stock"] == (0, [("GET", url)] if via else [], {"f": b"via proxy\n"}), seen


@pytest.mark.parametrize("variable", ["http_proxy", "OSG_SQUID_LOCATION"])
def test_a_proxy_named_without_a_port_is_asked_on_port_80_like_stock(stock, env, tmp_path, variable):
    """Stock's wget reads a port-less proxy as an http:// URL: port 80 (curl's 1080 only when
    wget is missing). An OSG_SQUID_LOCATION of a bare host name is one such value. The proxy
    listens on 127.0.0.2, where port 80 is free whatever 127.0.0.1 runs."""
    seen, url = through_proxy(stock, env, tmp_path, {variable: "127.0.0.2"}, host="127.0.0.2", port=80)
    assert seen["ours"] == seen["stock"] == (0, [("GET", url)], {"f": b"via proxy\n"}), seen


def test_https_downloads_tunnel_through_https_proxy_like_stock(stock, env, tmp_path):
    from http.server import BaseHTTPRequestHandler

    from pegasus_cloudio_testbed.certs import make_tls_files
    from pegasus_cloudio_testbed.forward_proxy import ForwardProxy
    from pegasus_cloudio_testbed.webserver import serve

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "7")
            self.end_headers()
            self.wfile.write(b"secure\n")

        def log_message(self, *args):
            pass

    tls = make_tls_files(tmp_path / "tls")
    server = serve(Handler, tls)
    try:
        with ForwardProxy() as proxy:
            url = f"https://localhost:{server.server_address[1]}/f"
            env = dict(env, https_proxy=proxy.url, PEGASUS_CLOUDIO_CA_BUNDLE=str(tls.ca_cert))
            runs = both(stock, lambda w: json.dumps([transfer(url, f"file://{w}/f", src_label="web")]), env,
                        tmp_path, "tunnel")
            targets = [r.target for r in proxy.requests if r.method == "CONNECT"]
    finally:
        server.shutdown()
        server.server_close()
    assert runs["stock"][0].rc == runs["ours"][0].rc == 0, runs["ours"][0].err
    assert tree(runs["stock"][1]) == tree(runs["ours"][1]) == {"f": b"secure\n"}
    assert targets == [f"localhost:{server.server_address[1]}"] * 2


def test_symlink_flag_matches(stock, inputs, env, tmp_path):
    spec = lambda w: json.dumps([transfer(f"file://{inputs}/f0.txt", f"file://{w}/l/f0.txt")])
    results = {}
    for tool, argv, tool_env in (("stock", [stock.transfer, "-s"], stock.env(env)), ("ours", OURS + ["-s"], env)):
        work = tmp_path / f"sym-{tool}"
        work.mkdir()
        results[tool] = (run_tool(argv, spec(work), tool_env, work).rc, tree(work))
    assert results["stock"] == results["ours"] == (0, {"l/f0.txt": ("link", f"{inputs}/f0.txt")})


def test_local_copies_keep_the_source_permission_bits_like_cp(stock, env, tmp_path):
    """``cp`` gives a new file the source's mode (less the umask): a staged executable stays
    executable, a read-only input stays read-only."""
    src = tmp_path / "modes"
    src.mkdir()
    (src / "tool.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    (src / "tool.sh").chmod(0o755)
    (src / "ro.txt").write_bytes(b"ro\n")
    (src / "ro.txt").chmod(0o444)
    spec = lambda w: json.dumps([transfer(f"file://{src}/{n}", f"file://{w}/out/{n}") for n in ("tool.sh", "ro.txt")])
    runs = both(stock, spec, env, tmp_path, "modes")
    modes = {tool: {n: oct(os.stat(work / "out" / n).st_mode & 0o7777) for n in ("tool.sh", "ro.txt")}
             for tool, (_run, work) in runs.items()}
    assert runs["stock"][0].rc == runs["ours"][0].rc == 0
    assert modes["ours"] == modes["stock"]
    assert int(modes["ours"]["tool.sh"], 8) & 0o100 and modes["ours"]["ro.txt"] == oct(0o444)


@pytest.mark.parametrize("flags, scheme", [([], "symlink"), (["-s"], "file")])
def test_linking_a_file_onto_itself_keeps_it_like_stock(stock, env, tmp_path, flags, scheme):
    """PegasusLite asks for ``symlink://$PWD/f.a`` with ``verify_symlink_source: false``; when the
    input already is ``$PWD/f.a``, the file must stay (stock: same inode, success), not become a
    link to itself."""
    def spec(w):
        (w / "f.a").write_bytes(b"input\n")
        return json.dumps([transfer(f"file://{w}/f.a", f"{scheme}://{w}/./f.a", verify_symlink_source=False)])
    results = {}
    for tool, argv, tool_env in (("stock", [stock.transfer], stock.env(env)), ("ours", OURS, env)):
        work = tmp_path / f"self-{tool}"
        work.mkdir()
        results[tool] = (run_tool(argv + flags, spec(work), tool_env, work).rc, tree(work))
    assert results["ours"] == results["stock"] == (0, {"f.a": b"input\n"})


def test_destination_names_up_to_the_file_name_limit_are_written_like_stock(stock, inputs, env, tmp_path):
    """A 250-byte name is a valid file name; the temp name beside it must not push it past 255."""
    long_name = "n" * 246 + ".txt"
    spec = lambda w: json.dumps([transfer(f"file://{inputs}/f0.txt", f"file://{w}/out/{long_name}"),
                                 transfer(f"file://{inputs}/f1.txt", f"symlink://{w}/out/l{long_name[1:]}")])
    runs = both(stock, spec, env, tmp_path, "long")
    assert runs["stock"][0].rc == runs["ours"][0].rc == 0, runs["ours"][0].err
    assert tree(runs["ours"][1]) == {f"out/{long_name}": b"file 0\n",
                                     f"out/l{long_name[1:]}": ("link", f"{inputs}/f1.txt")}
    assert tree(runs["stock"][1]) == tree(runs["ours"][1])


def test_symlink_flag_with_a_missing_source_fails_like_stock_even_unverified(stock, inputs, env, tmp_path):
    """``-s`` turns file:// copies into links, but the source must exist (stock's file handler checks
    it whatever ``verify_symlink_source`` says; only a symlink:// destination may dangle)."""
    spec = lambda w: json.dumps([transfer(f"file://{inputs}/absent.txt", f"file://{w}/out/absent.txt",
                                          verify_symlink_source=False)])
    results = {}
    for tool, argv, tool_env in (("stock", [stock.transfer, "-s"], stock.env(env)), ("ours", OURS + ["-s"], env)):
        work = tmp_path / f"dangling-{tool}"
        work.mkdir()
        results[tool] = (run_tool(argv, spec(work), tool_env, work).rc, tree(work))
    assert results["ours"] == results["stock"] == (1, {})


def test_symlinked_inputs_report_their_size_in_transfer_attempts_like_stock(stock, inputs, env, tmp_path):
    """Stock records the local end's size for every attempt (monitord reads these records), a
    symlink's too, not the bytes copied."""
    records = {}
    for tool, argv, tool_env in (("stock", [stock.transfer], stock.env(env)), ("ours", OURS, env)):
        work = tmp_path / f"size-{tool}"
        (work / "mp").mkdir(parents=True)
        spec = json.dumps([transfer(f"file://{inputs}/f2.txt", f"symlink://{work}/f2.txt")])
        assert run_tool(argv, spec, dict(tool_env, PEGASUS_MULTIPART_DIR=str(work / "mp")), work).rc == 0
        [name] = os.listdir(work / "mp")
        records[tool] = [line for line in (work / "mp" / name).read_text().splitlines() if "bytes:" in line]
    assert records["ours"] == records["stock"] == ["    bytes: 21"]


def test_missing_source_fails_alike_and_leaves_no_file(stock, inputs, env, tmp_path):
    spec = lambda w: json.dumps([transfer(f"file://{inputs}/absent.txt", f"file://{w}/out/absent.txt"),
                                 transfer(f"file://{inputs}/f0.txt", f"file://{w}/out/f0.txt")])
    runs = both(stock, spec, env, tmp_path, "missing")
    assert runs["stock"][0].rc == runs["ours"][0].rc == 1
    assert tree(runs["stock"][1]) == tree(runs["ours"][1]) == {"out/f0.txt": b"file 0\n"}
    assert "Some transfers failed!" in runs["ours"][0].err


def test_malformed_json_fails_alike(stock, env, tmp_path):
    runs = both(stock, lambda w: "[{not json", env, tmp_path, "bad")
    assert runs["stock"][0].rc == runs["ours"][0].rc == 1
    assert "Error parsing the transfer specification JSON" in runs["ours"][0].err


def test_usage_error_exit_code_matches(stock, env, tmp_path):
    stock_rc = subprocess.run([stock.transfer, "--no-such-flag"], env=stock.env(env), capture_output=True).returncode
    ours_rc = subprocess.run(OURS + ["--no-such-flag"], env=env, capture_output=True).returncode
    assert stock_rc == ours_rc == 2


def test_local_remove_matches(stock, env, tmp_path):
    def spec(w):
        (w / "gone.txt").write_bytes(b"x")
        (w / "kept.txt").write_bytes(b"y")
        return json.dumps([{"type": "remove", "id": 1,
                            "target": {"site_label": "local", "url": f"file://{w}/gone.txt", "recursive": "False"}}])
    runs = both(stock, spec, env, tmp_path, "rm")
    assert runs["stock"][0].rc == runs["ours"][0].rc == 0
    assert tree(runs["stock"][1]) == tree(runs["ours"][1]) == {"kept.txt": b"y"}


def test_s3_round_trip_is_cross_compatible(stock, s3_env, bucket, inputs, tmp_path):
    """Each tool uploads; the *other* tool downloads; files must match the originals."""
    env = dict(s3_env, PATH=os.environ["PATH"])
    tools = {"stock": ([stock.transfer], stock.env(env)), "ours": (OURS, env)}
    for uploader, downloader in (("stock", "ours"), ("ours", "stock")):
        up = json.dumps([transfer(f"file://{inputs}/f{i}.txt", f"s3://test@minio/{bucket}/{uploader}/f{i}.txt",
                                  dst_label="minio") for i in range(3)])
        assert run_tool(tools[uploader][0], up, tools[uploader][1], tmp_path).rc == 0
        out = tmp_path / f"from-{uploader}"
        down = json.dumps([transfer(f"s3://test@minio/{bucket}/{uploader}/f{i}.txt", f"file://{out}/f{i}.txt",
                                    src_label="minio") for i in range(3)])
        assert run_tool(tools[downloader][0], down, tools[downloader][1], tmp_path).rc == 0
        assert tree(out) == tree(inputs)


def test_s3_missing_object_fails_alike(stock, s3_env, bucket, tmp_path):
    env = dict(s3_env, PATH=os.environ["PATH"])
    spec = lambda w: json.dumps([transfer(f"s3://test@minio/{bucket}/absent", f"file://{w}/absent",
                                          src_label="minio")])
    runs = both(stock, spec, env, tmp_path, "s3missing")
    assert runs["stock"][0].rc == runs["ours"][0].rc == 1
    assert tree(runs["stock"][1]) == tree(runs["ours"][1]) == {}


def test_s3_mkdir_creates_the_bucket_alike(stock, s3_env, minio, tmp_path):
    env = dict(s3_env, PATH=os.environ["PATH"])
    for tool, argv, tool_env in (("stock", [stock.transfer], stock.env(env)), ("ours", OURS, env)):
        spec = json.dumps([{"type": "mkdir", "id": 1,
                            "target": {"site_label": "minio", "url": f"s3://test@minio/mk{tool}/run0001"}}])
        assert run_tool(argv, spec, tool_env, tmp_path).rc == 0
        assert run_tool(argv, spec, tool_env, tmp_path).rc == 0  # idempotent (PM-1234)
        assert minio_bucket_exists(minio, f"mk{tool}")


def minio_bucket_exists(minio, name):
    import boto3

    client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                          aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    return name in [b["Name"] for b in client.list_buckets()["Buckets"]]


@pytest.mark.parametrize("no_proxy", [None, "127.0.0.1"])
def test_s3_goes_through_HTTP_PROXY_unless_NO_PROXY_names_the_endpoint_like_stock(stock, s3_env, bucket, inputs,
                                                                                 minio, tmp_path, no_proxy):
    """Stock's pegasus-s3 (botocore) reads upper-case HTTP_PROXY for an http endpoint, which
    wget's rules for http:// URLs ignore: both tools' uploads and downloads go through it."""
    from pegasus_cloudio_testbed.forward_proxy import ForwardProxy
    origin = f"http://{minio.host}:{minio.port}/"
    with ForwardProxy() as proxy:
        env = dict(s3_env, PATH=os.environ["PATH"], PYTHONPATH=os.environ.get("PYTHONPATH", ""), HTTP_PROXY=proxy.url,
                   **({"NO_PROXY": no_proxy} if no_proxy else {}))
        seen = {}
        for tool, argv, tool_env in (("stock", [stock.transfer], stock.env(env)), ("ours", OURS, env)):
            before = len(proxy.requests)
            up = json.dumps([transfer(f"file://{inputs}/f{i}.txt", f"s3://test@minio/{bucket}/{tool}/f{i}.txt",
                                      dst_label="minio") for i in range(2)])
            out = tmp_path / f"from-{tool}"
            down = json.dumps([transfer(f"s3://test@minio/{bucket}/{tool}/f{i}.txt", f"file://{out}/f{i}.txt",
                                        src_label="minio") for i in range(2)])
            codes = [run_tool(argv, spec, tool_env, tmp_path).rc for spec in (up, down)]
            requests = proxy.requests[before:]
            seen[tool] = (codes, {r.method for r in requests} >= {"PUT", "GET"} if not no_proxy else requests,
                          all(r.target.startswith(origin) for r in requests),
                          tree(out) == {f"f{i}.txt": (inputs / f"f{i}.txt").read_bytes() for i in range(2)})
    assert seen["ours"] == seen["stock"] == ([0, 0], True if not no_proxy else [], True, True), seen
