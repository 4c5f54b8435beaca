"""S3 and GCS through a forward proxy, as stock pegasus-s3 (botocore) goes: ``HTTP_PROXY``/``http_proxy``
for an http endpoint, ``HTTPS_PROXY``/``https_proxy`` for an https one, ``NO_PROXY``/``no_proxy``,
read as ``urllib.request.getproxies()`` reads them (not wget's rules, which http:// URLs keep)."""

import json
import os
import socket
import subprocess
import sys

import uuid

import boto3
import pytest
from botocore.utils import get_environ_proxies

from pegasus_cloudio_testbed.forward_proxy import ForwardProxy
from transfer import Session, Settings, parse_url
from transfer.errors import ConfigError
from transfer.http.pool import ConnectionPool
from transfer.http.proxy import absolute_form, boto_proxy_for, parse_proxy

OURS = [sys.executable, "-m", "pegasus_cloudio.dropin"]


def transfer(src, dest, lfn, src_site="local", dest_site="local"):
    return {"type": "transfer", "lfn": lfn, "src_urls": [{"site_label": src_site, "url": src}],
            "dest_urls": [{"site_label": dest_site, "url": dest}]}


def run(spec, env, cwd, *args):
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""),  # the code under test
            "PEGASUS_CLOUDIO_CACHE_DIR": "off"}
    done = subprocess.run(OURS + list(args), input=json.dumps(spec), env=dict(base, **env), cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr


def put_and_get(tmp_path, bucket, env, count=6, *args):
    """Upload ``count`` small files to MinIO with the drop-in, then download them (one run each)."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    for i in range(count):
        (src / f"f{i}").write_bytes(os.urandom(300 + i))
    up = [transfer(f"file://{src}/f{i}", f"s3://test@minio/{bucket}/p/f{i}", f"f{i}", dest_site="minio")
          for i in range(count)]
    rc, err = run(up, env, tmp_path, "-n", "4", *args)
    if rc != 0:
        return rc, err
    down = [transfer(f"s3://test@minio/{bucket}/p/f{i}", f"file://{tmp_path}/dst/f{i}", f"f{i}", src_site="minio")
            for i in range(count)]
    rc, more = run(down, env, tmp_path, "-n", "4", *args)
    return rc, err + more


def same_files(tmp_path, count=6):
    return all((tmp_path / "dst" / f"f{i}").read_bytes() == (tmp_path / "src" / f"f{i}").read_bytes()
               for i in range(count))


def test_an_http_endpoint_goes_through_HTTP_PROXY_with_its_credentials_unlogged(tmp_path, s3_env, bucket, minio):
    """Upper-case HTTP_PROXY, which wget ignores, is botocore's for an http endpoint: every
    request (uploads, the pipelined small GETs, the ordinary ones) in absolute form at the proxy."""
    with ForwardProxy(credentials="pu:pw-secret") as proxy:
        env = dict(s3_env, HTTP_PROXY=proxy.url.replace("http://", "http://pu:pw-secret@"))
        rc, err = put_and_get(tmp_path, bucket, env, 6, "-d")
        assert rc == 0, err
        seen = list(proxy.requests)
    assert same_files(tmp_path)
    origin = f"http://{minio.host}:{minio.port}/{bucket}/p/f"
    assert {r.method for r in seen} >= {"PUT", "GET"}
    assert all(r.target.startswith(origin) for r in seen), [r.target for r in seen]
    assert all(r.authorization == seen[0].authorization and r.authorization for r in seen)
    assert any("response-cache-control=pegasus-cloudio-get-" in r.target for r in seen)  # the pipelined pass too
    assert "pw-secret" not in err and seen[0].authorization[6:] not in err


def test_an_endpoint_that_NO_PROXY_names_goes_direct(tmp_path, s3_env, bucket, minio):
    with ForwardProxy() as proxy:
        env = dict(s3_env, HTTP_PROXY=proxy.url, HTTPS_PROXY=proxy.url, NO_PROXY=f"example.org,{minio.host}")
        rc, err = put_and_get(tmp_path, bucket, env, 2)
        assert rc == 0, err
        assert proxy.requests == []
    assert same_files(tmp_path, 2)


@pytest.fixture
def bucket_tls(minio_tls):
    name = f"t-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=minio_tls.endpoint, aws_access_key_id=minio_tls.access_key,
                 aws_secret_access_key=minio_tls.secret_key, region_name="us-east-1",
                 verify=str(minio_tls.ca_file)).create_bucket(Bucket=name)
    return name


def test_an_https_endpoint_tunnels_through_HTTPS_PROXY_and_verifies_the_store(tmp_path, minio_tls, bucket_tls):
    """HTTP_PROXY is not the https endpoint's; HTTPS_PROXY is, as a CONNECT tunnel."""
    creds = minio_tls.write_pegasus_credentials(tmp_path / "creds.conf", site="minio", user="test")
    env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
           "AWS_EC2_METADATA_DISABLED": "true", "PEGASUS_CLOUDIO_CA_BUNDLE": str(minio_tls.ca_file)}
    with ForwardProxy() as wrong, ForwardProxy() as proxy:
        rc, err = put_and_get(tmp_path, bucket_tls, dict(env, HTTP_PROXY=wrong.url, HTTPS_PROXY=proxy.url), 3)
        assert rc == 0, err
        assert wrong.requests == []
        host = minio_tls.endpoint.partition("://")[2]
        assert proxy.requests and {(r.method, r.target) for r in proxy.requests} == {("CONNECT", host)}
    assert same_files(tmp_path, 3)


@pytest.mark.parametrize("value", ["ftp://u:hidden@proxy:21", "http://u:hidden@proxy:99999",
                                   "https://u:hidden@tls:443"])
def test_a_malformed_proxy_is_one_line_naming_the_variable_and_no_request_is_made(tmp_path, proxied, bucket, value):
    counter, env = proxied
    (tmp_path / "f").write_bytes(b"x")
    spec = [transfer(f"file://{tmp_path}/f", f"s3://test@minio/{bucket}/f", "f", dest_site="minio")]
    rc, err = run(spec, dict(env, AWS_EC2_METADATA_DISABLED="true", HTTP_PROXY=value), tmp_path)
    assert rc == 1
    named = [line for line in err.splitlines() if "HTTP_PROXY" in line]
    assert len(named) == 1 and "HTTP_PROXY must be [http://][user:password@]host[:port]" in named[0], err
    assert "hidden" not in err
    assert counter.snapshot()["connections"] == 0


# ---------------------------------------------------------------------------- the rules, against botocore's


ENVS = [
    {"HTTP_PROXY": "p1:3128"},
    {"http_proxy": "p1:3128", "HTTP_PROXY": "p2:3128"},
    {"HTTP_PROXY": "p2:3128", "http_proxy": "p1:3128"},
    {"HTTP_PROXY": "p2:3128", "http_proxy": ""},
    {"HTTP_PROXY": "", "Http_Proxy": "p3:8080"},
    {"HTTPS_PROXY": "p4:3128"},
    {"HTTP_PROXY": "p2:3128", "REQUEST_METHOD": "GET"},
    {"http_proxy": "p1", "REQUEST_METHOD": "GET"},
    {"HTTP_PROXY": "//p5:81"},
    {"HTTP_PROXY": "http://u%40x:p@p6:82/"},
    {"HTTP_PROXY": "p1:3128", "NO_PROXY": "127.0.0.1"},
    {"HTTP_PROXY": "p1:3128", "NO_PROXY": "*"},
    {"HTTP_PROXY": "p1:3128", "NO_PROXY": "*,other"},
    {"HTTP_PROXY": "p1:3128", "NO_PROXY": "127.0.0.0/8"},
    {"HTTP_PROXY": "p1:3128", "NO_PROXY": "127.0.0.1", "no_proxy": ""},
    {"HTTP_PROXY": "p1:3128", "no_proxy": ".example.org"},
    {"HTTP_PROXY": "p1:3128", "no_proxy": "example.org:9000"},
    {"HTTP_PROXY": "p1:3128", "no_proxy": "example.org:9001"},
    {"HTTP_PROXY": "p1:3128", "no_proxy": " EXAMPLE.org "},
    {"HTTP_PROXY": "p1:3128", "no_proxy": "ample.org"},
]
ENDPOINTS = ["http://127.0.0.1:9000", "http://s3.example.org:9000", "https://s3.example.org", "http://S3.Example.org"]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("env", ENVS, ids=[" ".join(f"{k}={v}" for k, v in e.items()) for e in ENVS])
def test_the_proxy_is_the_one_botocore_picks(monkeypatch, env, endpoint):
    for name in list(os.environ):
        if name.lower().endswith("_proxy") or name == "REQUEST_METHOD":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    scheme = endpoint.partition(":")[0]
    theirs = get_environ_proxies(endpoint).get(scheme)  # what botocore's client for this endpoint uses
    ours = boto_proxy_for(scheme, endpoint, dict(os.environ))
    if theirs is None:
        assert ours is None
    else:
        expected = parse_proxy(theirs if theirs.startswith("http") else "http:" + theirs if theirs.startswith("//")
                               else "http://" + theirs, "x")
        assert ours == expected


def test_a_proxy_for_the_other_scheme_is_checked_only_when_used():
    env = {"HTTPS_PROXY": "ftp://nonsense", "HTTP_PROXY": "p:1"}
    assert boto_proxy_for("http", "http://h:9000", env) == parse_proxy("p:1", "HTTP_PROXY")
    with pytest.raises(ConfigError) as refused:
        boto_proxy_for("https", "http://h:9000", env)
    assert refused.value.message.startswith("HTTPS_PROXY must be")


def test_other_endpoints_of_a_proxied_pool_keep_its_proxy_for_its_scheme():
    proxy = parse_proxy("p:3128", "HTTP_PROXY")
    pool = ConnectionPool("http://s3.example.org", max_idle=1, proxy=proxy)
    assert pool.sibling("http://s3.eu-west-1.example.org").proxy == proxy
    assert pool.sibling("https://s3.eu-west-1.example.org").proxy is None
    other = parse_proxy("q:1", "HTTPS_PROXY")
    assert pool.sibling("https://s3.eu-west-1.example.org", other).proxy == other


def test_a_plain_http_request_through_a_proxy_names_its_own_host_in_absolute_form():
    """A virtual-hosted bucket's request says its host in Host: the proxy must connect there."""
    proxy = parse_proxy("http://u:p@p:1", "HTTP_PROXY")
    target, headers = absolute_form("/k?x=1", [("Host", "b.s3.example.org"), ("A", "1")], "s3.example.org", proxy)
    assert target == "http://b.s3.example.org/k?x=1"
    assert headers == [("Host", "b.s3.example.org"), ("A", "1"), ("Proxy-Authorization", proxy.authorization)]
    target, headers = absolute_form("/b/k", iter([("A", "1")]), "s3.example.org:9000", parse_proxy("p:1", "x"))
    assert (target, headers) == ("http://s3.example.org:9000/b/k", [("A", "1")])


# ---------------------------------------------------------------------------- warm sockets


def test_a_proxied_endpoint_takes_no_warm_socket_and_is_not_reported_for_one(s3_env, bucket, minio, tmp_path):
    """The node stager dials ahead the addresses a job's copy reports: a proxied endpoint must
    be neither dialled from a warm socket nor reported (the site's only way out is the proxy)."""
    from transfer.http import warm
    warm.discard()  # what earlier tests' connections in this process recorded
    address = (minio.host, minio.port)
    lent = socket.create_connection(address)
    warm.adopt(address, [lent])
    try:
        with ForwardProxy() as proxy:
            with Session(Settings(threads=2), dict(s3_env, HTTP_PROXY=proxy.url)) as session:
                url = parse_url(f"s3://test@minio/{bucket}", site_label="minio")
                session.backend(url).make_dirs(url)
            assert [r.method for r in proxy.requests] == ["HEAD"]
        assert warm.used() == []
        assert warm.take(address) is lent  # still there: not taken by the proxied connection
    finally:
        lent.close()
        warm.discard()


# ---------------------------------------------------------------------------- GCS: the same rules


def gcs_round_trip(tmp_path, bucket, env, count=2):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    for i in range(count):
        (src / f"f{i}").write_bytes(os.urandom(500 + i))
    rc, err = run([transfer(f"file://{src}/f{i}", f"gs://{bucket}/p/f{i}", f"f{i}", dest_site="gcs")
                   for i in range(count)], env, tmp_path, "-d")
    if rc == 0:
        rc, more = run([transfer(f"gs://{bucket}/p/f{i}", f"file://{tmp_path}/dst/f{i}", f"f{i}", src_site="gcs")
                        for i in range(count)], env, tmp_path, "-d")
        err += more
    return rc, err


@pytest.fixture
def gcs_keyed_env(gcs_server, gcs_key, tmp_path):
    """GCS on the emulator with a service-account key: the token endpoint is asked too."""
    return {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
            "PEGASUS_CLOUDIO_GCS_ENDPOINT": gcs_server.endpoint, "GOOGLE_APPLICATION_CREDENTIALS": str(gcs_key.path)}


def test_gcs_and_its_token_endpoint_go_through_HTTP_PROXY(tmp_path, gcs_server, gcs_bucket, gcs_key, gcs_keyed_env):
    with ForwardProxy(credentials="pu:pw-secret") as proxy:
        env = dict(gcs_keyed_env, HTTP_PROXY=proxy.url.replace("http://", "http://pu:pw-secret@"))
        rc, err = gcs_round_trip(tmp_path, gcs_bucket, env)
        assert rc == 0, err
        seen = list(proxy.requests)
    assert same_files(tmp_path, 2)
    assert gcs_key.grants and ("POST", gcs_key.token_uri) in {(r.method, r.target) for r in seen}
    assert all(r.target.startswith((gcs_server.endpoint + "/", gcs_key.token_uri)) for r in seen), seen
    assert sum(r.target.startswith(gcs_server.endpoint) for r in seen) >= 4  # two uploads, two downloads
    assert all(r.authorization == seen[0].authorization and r.authorization for r in seen)
    assert "pw-secret" not in err and seen[0].authorization[6:] not in err


def test_gcs_goes_direct_to_an_endpoint_NO_PROXY_names(tmp_path, gcs_bucket, gcs_keyed_env, gcs_key):
    with ForwardProxy() as proxy:
        env = dict(gcs_keyed_env, HTTP_PROXY=proxy.url, no_proxy="127.0.0.1")
        rc, err = gcs_round_trip(tmp_path, gcs_bucket, env)
        assert rc == 0, err
        assert proxy.requests == [] and gcs_key.grants
    assert same_files(tmp_path, 2)


def test_gcs_with_a_malformed_proxy_is_one_line_naming_the_variable_and_no_request_is_made(tmp_path, gcs_proxied,
                                                                                           gcs_bucket):
    counter, env = gcs_proxied
    (tmp_path / "f").write_bytes(b"x")
    spec = [transfer(f"file://{tmp_path}/f", f"gs://{gcs_bucket}/f", "f", dest_site="gcs")]
    rc, err = run(spec, dict(env, http_proxy="http://u:hidden@:3128"), tmp_path)
    assert rc == 1
    named = [line for line in err.splitlines() if "http_proxy" in line]
    assert len(named) == 1 and "http_proxy must be [http://][user:password@]host[:port]" in named[0], err
    assert "hidden" not in err and counter.snapshot()["connections"] == 0


# ---------------------------------------------------------------------------- the AWS chain's STS


def test_the_web_identity_exchange_asks_sts_through_the_proxy_as_botocore_does(tmp_path):
    from pegasus_cloudio_testbed.scripted import Reply, ScriptedServer
    from transfer.backends.aws_chain import aws_s3_config

    answer = ("<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>"
              "<AccessKeyId>AK1</AccessKeyId><SecretAccessKey>s1</SecretAccessKey><SessionToken>t1</SessionToken>"
              "<Expiration>2099-01-01T00:00:00Z</Expiration></Credentials></AssumeRoleWithWebIdentityResult>"
              "</AssumeRoleWithWebIdentityResponse>").encode()
    (tmp_path / "token").write_text("jwt")
    with ScriptedServer(lambda request: Reply(200, {}, answer)) as sts, ForwardProxy() as proxy:
        env = {"HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true", "AWS_ROLE_ARN": "arn:aws:iam::1:role/r",
               "AWS_WEB_IDENTITY_TOKEN_FILE": str(tmp_path / "token"), "AWS_ENDPOINT_URL_STS": sts.endpoint,
               "HTTP_PROXY": proxy.url}
        assert aws_s3_config(env).source().access_key == "AK1"
        assert [(r.method, r.target) for r in proxy.requests] == [("POST", sts.endpoint + "/")]
