"""HTTP credentials are scoped to scheme, host and port (``docs/security.md``): a
``header.*`` value from the Pegasus credentials file goes to its origin only, never along a
redirect to plain HTTP or to another port of the same host. Real HTTPS and HTTP servers."""

from __future__ import annotations

import io
from http.server import BaseHTTPRequestHandler

import pytest

from pegasus_cloudio_testbed.certs import make_tls_files
from pegasus_cloudio_testbed.webserver import serve
from transfer import Session, Settings, parse_url
from transfer.credentials import PegasusCredentialsFile

SECRET = "s3cr3t-header-value"


class Recorder:
    """A server on 127.0.0.1 (HTTPS with ``tls``) recording each request's headers; it
    redirects to ``redirect`` when set, else answers 200 ``ok``."""

    def __init__(self, tls=None, redirect=None):
        self.seen, self.redirect = [], None
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                recorder.seen.append(dict(self.headers))
                if recorder.redirect:
                    self.send_response(302)
                    self.send_header("Location", recorder.redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = serve(Handler, tls)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"

    def secrets_seen(self):
        return [h for h in self.seen if any(SECRET in v for v in h.values())]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def tls(tmp_path):
    return make_tls_files(tmp_path / "tls")


def fetch(tmp_path, tls, url, sections):
    creds = tmp_path / "credentials.conf"
    creds.write_text("".join(f"[{name}]\nheader.X-Secret = {SECRET}\n" for name in sections))
    creds.chmod(0o600)
    env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": "/dev/null"}
    with Session(Settings(ca_bundle=str(tls.ca_cert)), env) as session:
        parsed = parse_url(url)
        sink = io.BytesIO()
        session.backend(parsed).get(parsed, sink)
        return sink.getvalue()


@pytest.mark.parametrize("sections", [["127.0.0.1"], ["https://127.0.0.1"], ["https://127.0.0.1:{a}"]])
def test_a_redirect_from_https_to_plain_http_carries_no_credentials(tmp_path, tls, sections):
    plain = Recorder()
    secure = Recorder(tls)
    secure.redirect = f"{plain.url}/data"
    try:
        body = fetch(tmp_path, tls, f"{secure.url}/data", [s.format(a=secure.port) for s in sections])
        assert body == b"ok" and len(plain.seen) == 1
        assert plain.secrets_seen() == []
    finally:
        plain.close()
        secure.close()


def test_a_redirect_to_another_port_of_the_same_host_carries_no_credentials(tmp_path, tls):
    other = Recorder(tls)
    first = Recorder(tls)
    first.redirect = f"{other.url}/data"
    try:
        body = fetch(tmp_path, tls, f"{first.url}/data", ["127.0.0.1", f"https://127.0.0.1:{first.port}"])
        assert body == b"ok" and len(other.seen) == 1
        assert len(first.secrets_seen()) == 1  # its own origin gets them
        assert other.secrets_seen() == []
    finally:
        other.close()
        first.close()


def test_sections_name_an_origin_with_its_port(tmp_path):
    creds = tmp_path / "c.conf"
    creds.write_text("[https://h.example:8443]\nheader.A = 1\n[http://h.example]\nheader.B = 2\n"
                     "[h.example]\nheader.C = 3\n")
    creds.chmod(0o600)
    parsed = PegasusCredentialsFile(str(creds))
    assert parsed.headers_for("https", "h.example", 8443) == {"a": "1"}
    assert parsed.headers_for("http", "h.example", 80) == {"b": "2"}
    assert parsed.headers_for("http", "h.example", 8080) == {}
    assert parsed.headers_for("https", "h.example", 443) == {"c": "3"}  # a bare host: https on 443
    assert parsed.headers_for("http", "h.example", None) == {"b": "2"}
