"""Where a redirect may take a request that carries credentials (issue 39, item 1).

A real store (MinIO, fake-gcs-server) sits behind a proxy that answers one request with a
redirect to a recorder on another port of this host: the recorder must see no request at all
(no ``Authorization``, no PUT body), the job must fail naming the redirect, and no file may
appear where the job reads. The rule itself (:func:`transfer.http.origins.refusal`) and
Amazon's own 307s are played against a scripted server in tests/test_s3_amazon.py."""

from __future__ import annotations

import os

import pytest

from pegasus_cloudio_testbed.proxy import Fault, TcpProxy
from pegasus_cloudio_testbed.scripted import Reply, ScriptedServer
from transfer import Engine, RemoteError, Session, Settings, Transfer, parse_url
from transfer.http.origins import refusal

RECORDED = b"the recorder's bytes, not the object"


def _recorder() -> ScriptedServer:
    return ScriptedServer(lambda request: Reply(200, {"ETag": '"0"'}, RECORDED))


def _redirect(recorder: ScriptedServer, method: str, path: str) -> Fault:
    return Fault.status(307, body=b"", headers={"Location": f"{recorder.endpoint}{path}"}, method=method,
                        path=path)


def _failed_on_redirect(result, recorder: ScriptedServer) -> None:
    assert not result.ok and isinstance(result.error, RemoteError), result.error
    assert "redirect to http://127.0.0.1:" in str(result.error) and "not followed" in str(result.error)
    assert result.attempts == 1  # a refusal is permanent: not retried
    assert recorder.requests == []


@pytest.mark.parametrize("origin, location, refused", [
    ("https://s.example", "https://s.example:443/k", False),
    ("https://s.example", "http://s.example/k", True),
    ("https://s.example:9000", "https://s.example:9001/k", True),
    ("http://s.example", "https://s.example/k", True),
    ("http://s.example", "http://other.example/k", True),
    ("http://s.example", "ftp://s.example/k", True),
])
def test_the_rule_for_every_backend(origin, location, refused):
    assert (refusal(origin, location) is not None) == refused


def test_a_trusted_host_widens_the_hosts_only():
    def anywhere(_url):
        return True
    assert refusal("https://s3.example", "https://b.s3.example/k", anywhere) is None
    assert refusal("https://s3.example", "http://b.s3.example/k", anywhere) == "from https to plain http"
    assert refusal("https://s3.example", "https://b.s3.example:8443/k", anywhere) is not None
    assert refusal("https://s3.example", "https://b.s3.example/k") is not None


def test_s3_get_redirected_to_another_port_hands_over_nothing(proxied, bucket, minio, tmp_path):
    proxy, env = proxied
    url = f"s3://test@minio/{bucket}/k"
    with Session(Settings(), env) as session:
        source = tmp_path / "up"
        source.write_bytes(b"the object")
        assert Engine(session).run([Transfer((parse_url(f"file://{source}"),), parse_url(url))])[0].ok
    with _recorder() as recorder:
        proxy.set_faults([_redirect(recorder, "GET", f"/{bucket}/k")])
        with Session(Settings(max_attempts=1), env) as session:
            [result] = Engine(session).run([Transfer((parse_url(url),), parse_url(f"file://{tmp_path}/got"))])
        _failed_on_redirect(result, recorder)
    assert [name for name in os.listdir(tmp_path) if "got" in name] == []  # no file, no temp file


def test_s3_put_redirected_to_another_port_sends_no_body(proxied, bucket, tmp_path):
    proxy, env = proxied
    source = tmp_path / "secret"
    source.write_bytes(b"a body that must stay with the store")
    with _recorder() as recorder:
        proxy.set_faults([_redirect(recorder, "PUT", f"/{bucket}/k")])
        with Session(Settings(max_attempts=1), env) as session:
            [result] = Engine(session).run([Transfer((parse_url(f"file://{source}"),),
                                                     parse_url(f"s3://test@minio/{bucket}/k"))])
        _failed_on_redirect(result, recorder)


@pytest.fixture
def gcs_keyed(gcs_server, gcs_key, tmp_path):
    """(proxy, env): fake-gcs-server behind a fault proxy, reached with a service-account key,
    so every request carries a bearer token."""
    with TcpProxy((gcs_server.host, gcs_server.port)) as proxy:
        yield proxy, {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
                      "PEGASUS_CLOUDIO_GCS_ENDPOINT": proxy.url(), "GOOGLE_APPLICATION_CREDENTIALS": str(gcs_key.path)}


def gcs_settings(env):
    return Settings.from_env(env).replace(max_attempts=1)


def test_gcs_get_redirected_to_another_port_hands_over_nothing(gcs_keyed, gcs_bucket, tmp_path):
    proxy, env = gcs_keyed
    source = tmp_path / "up"
    source.write_bytes(b"the object")
    with Session(gcs_settings(env), env) as session:
        assert Engine(session).run([Transfer((parse_url(f"file://{source}"),), parse_url(f"gs://{gcs_bucket}/k"))])[0].ok
        with _recorder() as recorder:
            proxy.set_faults([_redirect(recorder, "GET", "/download/")])
            [result] = Engine(session).run([Transfer((parse_url(f"gs://{gcs_bucket}/k"),),
                                                     parse_url(f"file://{tmp_path}/got"))])
            _failed_on_redirect(result, recorder)
    assert f"gs://{gcs_bucket}/k" in str(result.error)
    assert [name for name in os.listdir(tmp_path) if "got" in name] == []


def test_gcs_put_redirected_to_another_port_sends_no_body(gcs_keyed, gcs_bucket, tmp_path):
    proxy, env = gcs_keyed
    source = tmp_path / "secret"
    source.write_bytes(b"a body that must stay with the store")
    with _recorder() as recorder:
        proxy.set_faults([_redirect(recorder, "POST", "/upload/")])
        with Session(gcs_settings(env), env) as session:
            [result] = Engine(session).run([Transfer((parse_url(f"file://{source}"),),
                                                     parse_url(f"gs://{gcs_bucket}/k"))])
        _failed_on_redirect(result, recorder)


def test_s3_same_origin_redirect_with_a_query_out_of_order_is_signed_canonically(proxied, bucket, tmp_path):
    """A 307 to the endpoint's own origin whose ``Location`` writes its query unsorted and with
    ``+`` for a space: the router sends and signs it in canonical form (MinIO checks the
    signature over that), so the followed GET succeeds; signed as written it was refused
    (SignatureDoesNotMatch)."""
    import io

    proxy, env = proxied
    url = parse_url(f"s3://test@minio/{bucket}/q")
    with Session(Settings(max_attempts=1), env) as session:
        backend = session.backend(url)
        (tmp_path / "q").write_bytes(b"queried")
        backend.put(str(tmp_path / "q"), url)
        location = f"/{bucket}/q?response-content-type=text%2Fplain&response-cache-control=no+cache"
        proxy.set_faults([Fault.status(307, body=b"", headers={"Location": location}, method="GET",
                                       path=f"/{bucket}/q")])
        proxy.reset_counters()
        sink = io.BytesIO()
        backend.get(url, sink)
    assert sink.getvalue() == b"queried"
    assert proxy.requests_by_method.get("GET") == 2 and proxy.pending_faults() == 0
