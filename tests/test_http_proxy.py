"""http_proxy / https_proxy / no_proxy (and OSG_SQUID_LOCATION), which wget and curl, stock
pegasus-transfer's HTTP tools, honour: through a real forward proxy on 127.0.0.1."""

import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler

import pytest

from pegasus_cloudio_testbed.certs import make_tls_files
from pegasus_cloudio_testbed.forward_proxy import ForwardProxy
from pegasus_cloudio_testbed.webserver import serve
from transfer.errors import ConfigError
from transfer.http.proxy import bypassed, parse_proxy, proxy_for

OURS = [sys.executable, "-m", "pegasus_cloudio.dropin"]


class Origin:
    """An HTTP(S) server on 127.0.0.1 answering every GET with ``body``; ``paths`` lists them."""

    def __init__(self, tls=None, body=b"through"):
        self.paths = []
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                origin.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = serve(Handler, tls)
        self.port = self.server.server_address[1]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def run(tmp_path, url, env, *args, attempts=1):
    spec = json.dumps([{"type": "transfer", "lfn": "f", "src_urls": [{"site_label": "web", "url": url}],
                        "dest_urls": [{"site_label": "local", "url": f"file://{tmp_path}/out/f"}]}])
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "HOME": str(tmp_path),
            "PEGASUS_CLOUDIO_CACHE_DIR": "off", "PEGASUS_CLOUDIO_CONFIG": os.devnull}
    done = subprocess.run(OURS + ["-m", str(attempts)] + list(args), input=spec, env=dict(base, **env), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr


@pytest.fixture
def tls(tmp_path):
    return make_tls_files(tmp_path / "tls")


def test_http_goes_through_http_proxy_in_absolute_form_with_its_credentials_unlogged(tmp_path):
    with Origin() as origin, ForwardProxy(credentials="pu:pw-secret") as proxy:
        url = f"http://127.0.0.1:{origin.port}/d/f"
        rc, err = run(tmp_path, url, {"http_proxy": proxy.url.replace("http://", "http://pu:pw-secret@")}, "-d")
        assert rc == 0, err
        assert [(r.method, r.target) for r in proxy.requests] == [("GET", url)]
        assert proxy.requests[0].authorization.startswith("Basic ")
        assert origin.paths == ["/d/f"]
    assert (tmp_path / "out" / "f").read_bytes() == b"through"
    assert "pw-secret" not in err and proxy.requests[0].authorization[6:] not in err


def test_https_tunnels_through_https_proxy_and_verifies_tls_against_the_origin(tmp_path, tls):
    with Origin(tls=tls) as origin, ForwardProxy() as proxy:
        env = {"https_proxy": f"127.0.0.1:{proxy.port}", "PEGASUS_CLOUDIO_CA_BUNDLE": str(tls.ca_cert)}
        rc, err = run(tmp_path, f"https://localhost:{origin.port}/f", env)
        assert rc == 0, err
        assert [(r.method, r.target) for r in proxy.requests] == [("CONNECT", f"localhost:{origin.port}")]
        assert origin.paths == ["/f"]


def test_a_tunnel_to_an_origin_whose_certificate_does_not_name_it_fails(tmp_path):
    other = make_tls_files(tmp_path / "other", ips=("127.0.0.2",))  # names localhost and 127.0.0.2 only
    with Origin(tls=other) as origin, ForwardProxy() as proxy:
        env = {"https_proxy": proxy.url, "PEGASUS_CLOUDIO_CA_BUNDLE": str(other.ca_cert)}
        rc, err = run(tmp_path, f"https://127.0.0.1:{origin.port}/f", env)
        assert rc == 1 and "certificate verification failed" in err, err
        assert [r.method for r in proxy.requests] == ["CONNECT"] and origin.paths == []
    assert not (tmp_path / "out" / "f").exists()


def test_a_proxy_that_wants_credentials_fails_the_transfer_naming_the_proxy(tmp_path, tls):
    with Origin(tls=tls) as origin, ForwardProxy(credentials="pu:pw") as proxy:
        env = {"https_proxy": proxy.url, "PEGASUS_CLOUDIO_CA_BUNDLE": str(tls.ca_cert)}
        rc, err = run(tmp_path, f"https://localhost:{origin.port}/f", env)
        assert rc == 1 and f"proxy 127.0.0.1:{proxy.port} refused the tunnel" in err and "407" in err, err
        assert origin.paths == []


def test_no_proxy_hosts_go_direct(tmp_path):
    with Origin() as origin, ForwardProxy() as proxy:
        rc, err = run(tmp_path, f"http://127.0.0.1:{origin.port}/f",
                      {"http_proxy": proxy.url, "no_proxy": "example.org, 127.0.0.0/8"})
        assert rc == 0, err
        assert proxy.requests == [] and origin.paths == ["/f"]


def test_osg_squid_location_is_the_http_proxy_when_http_proxy_is_unset(tmp_path):
    with Origin() as origin, ForwardProxy() as proxy:
        url = f"http://127.0.0.1:{origin.port}/f"
        rc, err = run(tmp_path, url, {"OSG_SQUID_LOCATION": f"127.0.0.1:{proxy.port}"})
        assert rc == 0, err
        assert [r.target for r in proxy.requests] == [url]
        rc, err = run(tmp_path, url, {"OSG_SQUID_LOCATION": f"127.0.0.1:{proxy.port}", "http_proxy": ""})
        assert rc == 0, err
        assert len(proxy.requests) == 1 and len(origin.paths) == 2  # set-but-empty http_proxy wins: direct


def test_uppercase_http_proxy_is_ignored_like_wget_and_curl(tmp_path):
    with Origin() as origin, ForwardProxy() as proxy:
        rc, err = run(tmp_path, f"http://127.0.0.1:{origin.port}/f", {"HTTP_PROXY": proxy.url})
        assert rc == 0, err
        assert proxy.requests == [] and origin.paths == ["/f"]


def test_a_malformed_proxy_is_one_line_naming_the_variable_and_nothing_is_sent(tmp_path):
    with Origin() as origin:
        rc, err = run(tmp_path, f"http://127.0.0.1:{origin.port}/f", {"http_proxy": "ftp://u:hidden@proxy:21"})
        assert rc == 1 and "http_proxy must be [http://][user:password@]host[:port]" in err, err
        assert "hidden" not in err and origin.paths == []


@pytest.mark.parametrize("host, no_proxy, expected", [
    ("a.example.org", "example.org", True),
    ("example.org", ".example.org", True),
    ("badexample.org", "example.org", False),
    ("EXAMPLE.org", "example.ORG", True),
    ("example.org", "example.org:8080", True),
    ("anything", "*", True),
    ("10.1.2.3", "10.0.0.0/8", True),
    ("10.1.2.3", "10.1.2.4", False),
    ("::1", "[::1]", True),
    ("a.example.org", "", False),
])
def test_no_proxy_matches_as_curl_does(host, no_proxy, expected):
    assert bypassed(host, no_proxy) is expected


def test_proxy_urls_default_to_port_80_and_carry_basic_credentials():
    proxy = parse_proxy("http://u%40x:p@squid.example.org", "http_proxy")
    assert (proxy.host, proxy.port, proxy.authorization) == ("squid.example.org", 80, "Basic dUB4OnA=")
    assert str(proxy) == "squid.example.org:80"
    assert proxy_for("https", "h", {"http_proxy": "p:1"}) is None
    assert proxy_for("http", "h", {"https_proxy": "p:1"}) is None
    assert proxy_for("https", "h", {"HTTPS_PROXY": "p:3"}).port == 3
    assert proxy_for("https", "h", {"https_proxy": "", "HTTPS_PROXY": "p:3"}) is None  # as curl
    assert proxy_for("http", "h", {"HTTP_PROXY": "p:3"}) is None
    with pytest.raises(ConfigError):
        parse_proxy("https://tls-proxy:443", "https_proxy")


def test_after_a_failure_through_the_http_proxy_the_next_attempt_goes_direct_like_stock(tmp_path):
    """Stock drops http_proxy once a transfer has failed an attempt: a Squid's bad copy or outage
    must not fail every attempt."""
    with Origin() as origin, ForwardProxy(fail_first=1) as proxy:
        url = f"http://127.0.0.1:{origin.port}/f"
        env = {"OSG_SQUID_LOCATION": proxy.url, "PEGASUS_CLOUDIO_RETRY_BASE_DELAY": "0"}
        rc, err = run(tmp_path, url, env, attempts=2)
        assert rc == 0, err
        assert [r.target for r in proxy.requests] == [url] and origin.paths == ["/f"]
    assert (tmp_path / "out" / "f").read_bytes() == b"through"


@pytest.mark.parametrize("options", [{"credentials": "pu:pw"}, {"refuse": 403}], ids=["407", "403"])
def test_a_proxy_that_refuses_the_request_is_bypassed_on_the_next_attempt_like_stock(tmp_path, options):
    """Stock retries every failed transfer and drops http_proxy after a first failed attempt,
    whatever the failure: a Squid that wants credentials (407) or whose rules deny the site
    (403) costs an attempt, then the origin serves the file. A refusal is no retryable error of
    its own, so ours made no second attempt and failed the job."""
    with Origin() as origin, ForwardProxy(**options) as proxy:
        url = f"http://127.0.0.1:{origin.port}/f"
        rc, err = run(tmp_path, url, {"http_proxy": proxy.url, "PEGASUS_CLOUDIO_RETRY_BASE_DELAY": "0"}, attempts=2)
        assert rc == 0, err
        assert [r.target for r in proxy.requests] == [url] and origin.paths == ["/f"]
        assert (tmp_path / "out" / "f").read_bytes() == b"through"
        (tmp_path / "out" / "f").unlink()
        rc, err = run(tmp_path, url, {"http_proxy": proxy.url}, attempts=1)  # one attempt: the refusal, named
        assert rc == 1 and f"HTTP {options.get('refuse', 407)}" in err and origin.paths == ["/f"], err
    assert not (tmp_path / "out" / "f").exists()


def test_a_proxys_credentials_are_in_neither_its_str_nor_its_repr():
    proxy = parse_proxy("http://squid:s3cret-pass@proxy.example:3128", "http_proxy")
    assert proxy.authorization is not None and proxy.port == 3128
    for text in (str(proxy), repr(proxy), repr([proxy])):
        assert "s3cret" not in text and proxy.authorization not in text, text
