"""The GCS backend against a real fake-gcs-server, with a counting, fault-injecting proxy in between."""

import base64
import gzip
import io
import json
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import google_crc32c
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from pegasus_cloudio_testbed.fakegcs import FakeGcsServer
from pegasus_cloudio_testbed.ports import free_port
from pegasus_cloudio_testbed.proxy import Fault, TcpProxy
from transfer import (
    AuthError,
    ChecksumMismatch,
    ConfigError,
    Engine,
    NotFound,
    RemoteError,
    Remove,
    Session,
    Settings,
    Throttled,
    Transfer,
    TransientError,
    parse_url,
)
from transfer.backends._gcs_auth import DEFAULT_ENDPOINT, resolve

FAST = dict(retry_base_delay=0.01, retry_max_delay=0.05)
JSON_503 = json.dumps({"error": {"code": 503, "message": "Backend Error"}}).encode()


def gs(bucket, key, site=None):
    return parse_url(f"gs://{bucket}/{key}", site_label=site)


def local(path):
    return parse_url(f"file://{path}")


def crc32c(data):
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode()


def put_bytes(session, url, data, tmp_path):
    src = tmp_path / f"upload-{len(data)}.tmp"
    src.write_bytes(data)
    return session.backend(url).put(str(src), url)


def leftovers(directory):
    return [name for name in os.listdir(directory) if name.endswith(".part")]


# --------------------------------------------------------------------------- requests and connections


def test_batch_is_one_request_per_file_on_a_bounded_pool(gcs_proxied, gcs_bucket, tmp_path, caplog):
    proxy, env = gcs_proxied
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    names = [f"f{i:03d}" for i in range(300)]
    for i, name in enumerate(names):
        (src / name).write_bytes(os.urandom(100 + i))
    settings = Settings(threads=4, **FAST)  # pool: 6 connections; the engine runs 12 workers on it
    with Session(settings, env) as session:
        up = Engine(session, threads=12).run([Transfer((local(src / n),), gs(gcs_bucket, f"b/{n}")) for n in names])
    assert all(r.ok for r in up)
    assert proxy.requests_by_method == {"POST": 300} and proxy.connections <= settings.threads + 2
    proxy.reset_counters()
    with Session(settings, env) as session:
        down = Engine(session, threads=12).run([Transfer((gs(gcs_bucket, f"b/{n}"),), local(dst / n)) for n in names])
    assert all(r.ok for r in down)
    assert all((dst / n).read_bytes() == (src / n).read_bytes() for n in names)
    assert proxy.requests_by_method == {"GET": 300}  # no metadata request before a download
    assert proxy.connections <= settings.threads + 2
    assert "pool is full" not in caplog.text


def test_server_side_copy_moves_no_bytes_through_the_client(gcs_proxied, gcs_bucket, tmp_path):
    proxy, env = gcs_proxied
    data = os.urandom(50_000)
    with Session(Settings(), env) as session:
        put_bytes(session, gs(gcs_bucket, "orig"), data, tmp_path)
        proxy.reset_counters()
        [result] = Engine(session).run([Transfer((gs(gcs_bucket, "orig"),), gs(gcs_bucket, "copy/of/orig"))])
        assert result.ok and result.bytes == len(data)
        assert proxy.bytes_down < 10_000 and "GET" not in proxy.requests_by_method
        sink = io.BytesIO()
        session.backend(gs(gcs_bucket, "x")).get(gs(gcs_bucket, "copy/of/orig"), sink)
    assert sink.getvalue() == data


# --------------------------------------------------------------------------- verification and faults


def test_a_corrupted_body_fails_the_crc32c_check_and_the_retry_completes(gcs_proxied, gcs_bucket, tmp_path):
    proxy, env = gcs_proxied
    data = os.urandom(3000)
    corrupted = bytes([data[0] ^ 0x01]) + data[1:]  # same length, one bit flipped
    fault = Fault.status(200, body=corrupted, method="GET", path="/download/",
                         headers={"x-goog-hash": f"crc32c={crc32c(data)}", "x-goog-generation": "1",
                                  "x-goog-stored-content-length": str(len(data))})
    with Session(Settings(**FAST), env) as session:
        put_bytes(session, gs(gcs_bucket, "c"), data, tmp_path)
        proxy.set_faults([fault])
        with pytest.raises(ChecksumMismatch):
            session.backend(gs(gcs_bucket, "c")).get(gs(gcs_bucket, "c"), io.BytesIO())
        proxy.set_faults([fault])
        [result] = Engine(session).run([Transfer((gs(gcs_bucket, "c"),), local(tmp_path / "out/c"))])
    assert result.ok and result.attempts == 2
    assert isinstance(result.history[0].error, ChecksumMismatch)
    assert (tmp_path / "out/c").read_bytes() == data and leftovers(tmp_path / "out") == []


def test_a_body_cut_short_is_detected_and_retried(gcs_proxied, gcs_bucket, tmp_path):
    proxy, env = gcs_proxied
    data = os.urandom(300_000)
    cut = Fault.truncate(after_bytes=100_000, method="GET", path="/download/")
    with Session(Settings(**FAST), env) as session:
        put_bytes(session, gs(gcs_bucket, "t"), data, tmp_path)
        proxy.set_faults([cut])
        with pytest.raises((TransientError, ChecksumMismatch)) as info:
            session.backend(gs(gcs_bucket, "t")).get(gs(gcs_bucket, "t"), io.BytesIO())
        assert info.value.retryable
        proxy.set_faults([cut])
        [result] = Engine(session).run([Transfer((gs(gcs_bucket, "t"),), local(tmp_path / "t"))])
    assert result.ok and result.attempts == 2 and (tmp_path / "t").read_bytes() == data


def test_503_is_throttled_and_retried(gcs_proxied, gcs_bucket, tmp_path):
    proxy, env = gcs_proxied
    with Session(Settings(max_attempts=3, **FAST), env) as session:
        put_bytes(session, gs(gcs_bucket, "s"), b"slow down", tmp_path)
        proxy.set_faults([Fault.status(503, body=JSON_503, method="GET", times=2)])
        [result] = Engine(session).run([Transfer((gs(gcs_bucket, "s"),), local(tmp_path / "s"))])
    assert result.ok and result.attempts == 3
    assert all(isinstance(a.error, Throttled) for a in result.history[:2])
    assert (tmp_path / "s").read_bytes() == b"slow down"


def test_404_and_403_are_not_retried_and_leave_no_file(gcs_proxied, gcs_bucket, tmp_path):
    proxy, env = gcs_proxied
    with Session(Settings(max_attempts=3, **FAST), env) as session:
        put_bytes(session, gs(gcs_bucket, "private"), b"secret", tmp_path)
        proxy.set_faults([Fault.status(403, body=b'{"error": {"code": 403}}', method="GET", path="private")])
        missing, denied = Engine(session).run([
            Transfer((gs(gcs_bucket, "absent"),), local(tmp_path / "out/absent")),
            Transfer((gs(gcs_bucket, "private"),), local(tmp_path / "out/private"))])
    assert not missing.ok and missing.attempts == 1 and isinstance(missing.error, NotFound)
    assert not denied.ok and denied.attempts == 1 and isinstance(denied.error, AuthError)
    assert len(missing.history) == len(denied.history) == 1 and proxy.pending_faults() == 0
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


@pytest.fixture
def resumable_store(tmp_path):
    """(proxy, env, bucket): a server that sends resumable chunks back through the proxy."""
    port = free_port()
    with TcpProxy(("127.0.0.1", port)) as proxy, FakeGcsServer(port=port, external_url=proxy.url()) as server:
        server.create_bucket("resumable")
        yield proxy, {"HOME": str(tmp_path), "STORAGE_EMULATOR_HOST": proxy.url()}, "resumable"


RESUMABLE = dict(multipart_threshold=1 << 20, multipart_part_size=5 << 20, **FAST)


def test_large_upload_is_resumable_in_chunks_and_round_trips(resumable_store, tmp_path):
    proxy, env, bucket = resumable_store
    data = os.urandom((11 << 20) + 7)
    with Session(Settings(**RESUMABLE), env) as session:
        info = put_bytes(session, gs(bucket, "big"), data, tmp_path)
        assert info.size == len(data) and proxy.requests_by_method == {"POST": 1, "PUT": 3}
        proxy.reset_counters()
        proxy.set_faults([Fault.status(503, body=JSON_503, method="PUT", times=1)])  # never reaches the server
        put_bytes(session, gs(bucket, "big"), data, tmp_path)
        assert proxy.requests_by_method == {"POST": 1, "PUT": 4}  # the refused chunk was sent again
        [result] = Engine(session).run([Transfer((gs(bucket, "big"),), local(tmp_path / "big.out"))])
    assert result.ok and (tmp_path / "big.out").read_bytes() == data


def test_a_resumable_upload_that_stored_wrong_bytes_is_deleted_and_retried(resumable_store, tmp_path):
    """fake-gcs-server appends a re-sent chunk instead of ignoring the part it already has
    (GCS does not), so a reset after the server took a chunk corrupts the object: the
    CRC32C check must catch it and the object must not stay under its name. The chunk's
    retries get a deadline (retry_max_delay x max_attempts) longer than RESUMABLE's 0.15 s:
    google's retry counts it from the first attempt, which in a process's first resumable
    upload (imports, connections) can take longer alone, and then the reset chunk is never
    sent again."""
    proxy, env, bucket = resumable_store
    data = os.urandom((6 << 20) + 1)
    (tmp_path / "src").write_bytes(data)
    resend = Fault.reset(after_bytes=0, method="PUT", times=1)
    with Session(Settings(**dict(RESUMABLE, retry_max_delay=10.0)), env) as session:
        backend = session.backend(gs(bucket, "r"))
        proxy.set_faults([resend])
        with pytest.raises(ChecksumMismatch):
            backend.put(str(tmp_path / "src"), gs(bucket, "r"))
        with pytest.raises(NotFound):
            backend.stat(gs(bucket, "r"))
        proxy.set_faults([resend])
        [result] = Engine(session).run([Transfer((local(tmp_path / "src"),), gs(bucket, "r"))])
        assert result.ok and result.attempts == 2
        sink = io.BytesIO()
        backend.get(gs(bucket, "r"), sink)
    assert sink.getvalue() == data


def test_batch_delete_of_more_than_100_objects(gcs_proxied, gcs_bucket, tmp_path):
    proxy, env = gcs_proxied
    (tmp_path / "one").write_bytes(b"1")
    keys = [f"del/{i}" for i in range(230)]
    with Session(Settings(threads=8, **FAST), env) as session:
        assert all(r.ok for r in Engine(session).run(
            [Transfer((local(tmp_path / "one"),), gs(gcs_bucket, k)) for k in keys]))
        proxy.reset_counters()
        backend = session.backend(gs(gcs_bucket, "x"))
        errors = backend.delete([gs(gcs_bucket, k) for k in keys] + [gs(gcs_bucket, "del/never-existed")])
        assert errors == [None] * 231
        assert proxy.requests_by_method == {"POST": 3}  # 100 + 100 + 31 calls
        assert list(backend.list(gs(gcs_bucket, "del"))) == []


def test_recursive_remove_respects_the_prefix_boundary(gcs_env, gcs_bucket, tmp_path):
    with Session(Settings(), gcs_env) as session:
        for key in ("run/a", "run/sub/b", "run2/c"):
            put_bytes(session, gs(gcs_bucket, key), key.encode(), tmp_path)
        [result] = Engine(session).run([Remove(gs(gcs_bucket, "run"), recursive=True)])
        remaining = [i.url.path for i in session.backend(gs(gcs_bucket, "x")).list(gs(gcs_bucket, ""))]
    assert result.ok and remaining == ["/run2/c"]


def test_a_listed_object_whose_name_starts_with_a_slash_is_itself_read_and_removed(gcs_server, gcs_env, gcs_bucket):
    """GCS names may start with "/" (other tools write them): the listing's URL of "/lead"
    reads and removes "/lead", never the object "lead" beside it."""
    for name, data in (("/lead", b"slash"), ("lead", b"plain")):
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        request = urllib.request.Request(f"{gcs_server.endpoint}/upload/storage/v1/b/{gcs_bucket}/o?{query}",
                                         data=data, method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass
    with Session(Settings(), gcs_env) as session:
        backend = session.backend(gs(gcs_bucket, "x"))
        found = {}
        for info in backend.list(gs(gcs_bucket, "")):
            sink = io.BytesIO()
            backend.get(info.url, sink)
            found[info.url.path] = sink.getvalue()
        assert found == {"//lead": b"slash", "/lead": b"plain"}
        assert backend.delete([gs(gcs_bucket, "").with_path("//lead")]) == [None]
        assert [i.url.path for i in backend.list(gs(gcs_bucket, ""))] == ["/lead"]


def bucket_exists(server, name):
    try:
        with urllib.request.urlopen(f"{server.endpoint}/storage/v1/b/{name}", timeout=10):
            return True
    except urllib.error.HTTPError as err:
        assert err.code == 404
        return False


def test_make_dirs_creates_a_missing_bucket_once(gcs_env, gcs_server):
    name = f"mk-{os.urandom(6).hex()}"
    assert not bucket_exists(gcs_server, name)
    with Session(Settings(), gcs_env) as session:
        backend = session.backend(gs(name, "run/dir"))
        backend.make_dirs(gs(name, "run/dir"))
        assert bucket_exists(gcs_server, name)
        backend.make_dirs(gs(name, "run/dir"))


def test_make_dirs_racing_another_creator(gcs_proxied, gcs_bucket):
    """GET says 404, create says 409: ours if we can read it, else taken by another project."""
    proxy, env = gcs_proxied
    not_yet = Fault.status(404, body=b"{}", method="GET", path=f"/b/{gcs_bucket}?")
    with Session(Settings(), env) as session:
        backend = session.backend(gs(gcs_bucket, "x"))
        proxy.set_faults([not_yet])
        backend.make_dirs(gs(gcs_bucket, "run"))
        assert proxy.requests_by_method == {"GET": 2, "POST": 1} and proxy.pending_faults() == 0
        proxy.set_faults([not_yet, Fault.status(403, body=b"{}", method="GET", path=f"/b/{gcs_bucket}?")])
        with pytest.raises(AuthError, match="another project"):
            backend.make_dirs(gs(gcs_bucket, "run"))


# --------------------------------------------------------------------------- credentials and endpoint


def test_json_key_of_the_site_is_used_and_one_token_serves_the_batch(gcs_server, gcs_bucket, gcs_key, tmp_path):
    env = {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_GCS_ENDPOINT": gcs_server.endpoint,
           "GOOGLE_PKCS12_my_site": str(gcs_key.path),
           "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "not-used.json")}
    (tmp_path / "f").write_bytes(b"keyed")
    ops = [Transfer((local(tmp_path / "f"),), gs(gcs_bucket, f"k/{i}", site="my-site")) for i in range(5)]
    with Session(Settings.from_env(env), env) as session:
        results = Engine(session).run(ops)
        assert all(r.ok for r in results), [str(r.error) for r in results]
    [claims] = gcs_key.grants  # verified against the key's public half by the token endpoint
    assert claims["iss"] == gcs_key.client_email and "devstorage" in claims["scope"]


def test_a_key_the_token_endpoint_rejects_is_an_auth_error_not_retried(gcs_server, gcs_bucket, gcs_key, tmp_path):
    info = json.loads(gcs_key.path.read_text())
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    info["private_key"] = other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()).decode()
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(info))
    wrong.chmod(0o600)
    env = {"HOME": str(tmp_path), "GOOGLE_APPLICATION_CREDENTIALS": str(wrong)}
    (tmp_path / "f").write_bytes(b"x")
    with Session(Settings(gcs_endpoint=gcs_server.endpoint, max_attempts=3, **FAST), env) as session:
        [result] = Engine(session).run([Transfer((local(tmp_path / "f"),), gs(gcs_bucket, "f"))])
    assert not result.ok and result.attempts == 1 and isinstance(result.error, AuthError)
    assert "private_key" not in str(result.error) and "BEGIN" not in str(result.error)


def test_group_readable_key_is_refused_with_the_fix(gcs_server, gcs_bucket, gcs_key, tmp_path):
    gcs_key.path.chmod(0o640)
    env = {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_GCS_ENDPOINT": gcs_server.endpoint,
           "GOOGLE_APPLICATION_CREDENTIALS": str(gcs_key.path)}
    with Session(Settings.from_env(env), env) as session, pytest.raises(ConfigError) as info:
        session.backend(gs(gcs_bucket, "x"))
    assert f"chmod 600 {gcs_key.path}" in str(info.value)
    assert gcs_key.grants == []


def test_p12_key_is_refused_saying_json_keys_work(gcs_server, tmp_path):
    key = tmp_path / "legacy.p12"
    key.write_bytes(b"\x30\x82\x09\x9a\x02\x01\x03" + os.urandom(64))
    key.chmod(0o600)
    env = {"HOME": str(tmp_path), "GOOGLE_PKCS12": str(key), "STORAGE_EMULATOR_HOST": gcs_server.endpoint}
    with Session(Settings(), env) as session, pytest.raises(ConfigError) as info:
        session.backend(gs("any", "x"))
    assert "PKCS#12" in str(info.value) and "JSON" in str(info.value)


def test_no_credentials_for_a_real_endpoint_is_a_config_error(tmp_path):
    with Session(Settings(), {"HOME": str(tmp_path)}) as session, pytest.raises(ConfigError) as info:
        session.backend(gs("bucket", "x", site="cloud"))
    assert "GOOGLE_PKCS12_cloud" in str(info.value) and "GOOGLE_APPLICATION_CREDENTIALS" in str(info.value)


def test_credentials_and_endpoint_precedence(tmp_path):
    settings = Settings()
    env = {"GOOGLE_PKCS12_a_b": "/k/site.json", "GOOGLE_PKCS12": "/k/all.json",
           "GOOGLE_APPLICATION_CREDENTIALS": "/k/adc.json"}
    assert resolve("a-b", env, settings).key_path == "/k/site.json"
    assert resolve("other", env, settings).key_path == "/k/all.json"
    assert resolve(None, {"GOOGLE_APPLICATION_CREDENTIALS": "/k/adc.json"}, settings).key_path == "/k/adc.json"
    assert resolve(None, env, settings).endpoint == DEFAULT_ENDPOINT
    emulator = resolve(None, {"STORAGE_EMULATOR_HOST": "localhost:9023"}, settings)
    assert emulator.endpoint == "http://localhost:9023" and emulator.anonymous
    configured = settings.replace(gcs_endpoint="https://gcs.example.org/")
    both = resolve(None, {"STORAGE_EMULATOR_HOST": "localhost:9023", "PEGASUS_CLOUDIO_GCS_ANONYMOUS": "1"},
                   configured)
    assert both.endpoint == "https://gcs.example.org" and both.anonymous and not both.emulator
    with pytest.raises(ConfigError):
        resolve(None, {}, settings.replace(gcs_endpoint="gcs.example.org"))


def test_missing_google_libraries_are_a_clear_config_error(tmp_path):
    code = ("import sys; sys.modules['google_crc32c'] = None\n"  # as if it were not installed
            "from transfer import ConfigError, Session, parse_url\n"
            "try:\n    Session(env={'HOME': sys.argv[1]}).backend(parse_url('gs://bucket/key'))\n"
            "except ConfigError as err:\n    print(err)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "'google_crc32c'" in done.stdout and "pip install 'pegasus-cloudio[gcs]'" in done.stdout


# --------------------------------------------------------------------------- stored gzip


def put_gzip_encoded(server, bucket, key, data):
    """Store ``gzip(data)`` with ``Content-Encoding: gzip``, as ``gsutil cp -Z`` does."""
    query = urllib.parse.urlencode({"uploadType": "media", "name": key, "contentEncoding": "gzip"})
    request = urllib.request.Request(f"{server.endpoint}/upload/storage/v1/b/{bucket}/o?{query}",
                                     data=gzip.compress(data, mtime=0), method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)


def test_a_gzip_encoded_object_is_read_decompressed_as_gcs_serves_it(gcs_server, gcs_env, gcs_bucket, tmp_path):
    """GCS (and gsutil/gcloud cp) hand back the decompressed bytes of a ``Content-Encoding:
    gzip`` object; its stored CRC32C/MD5 are of the compressed bytes, and still checked."""
    data = b"line of text, compressible\n" * 20000
    resource = put_gzip_encoded(gcs_server, gcs_bucket, "log.txt", data)
    assert resource["crc32c"] == crc32c(gzip.compress(data, mtime=0)) and int(resource["size"]) < len(data)
    with Session(Settings(), gcs_env) as session:
        sink = io.BytesIO()
        info = session.backend(gs(gcs_bucket, "log.txt")).get(gs(gcs_bucket, "log.txt"), sink)
        assert sink.getvalue() == data and info.size == len(data)
        [result] = Engine(session).run([Transfer((gs(gcs_bucket, "log.txt"),), local(tmp_path / "out/log.txt"))])
        assert result.ok, result.error
        assert (tmp_path / "out/log.txt").read_bytes() == data
        # a range of the stored bytes is no range of the file: refused, never handed back
        with pytest.raises(RemoteError, match="gzip"):
            session.backend(gs(gcs_bucket, "log.txt")).get(gs(gcs_bucket, "log.txt"), io.BytesIO(), (0, 100))


def test_a_gzip_encoded_body_unlike_the_stored_crc32c_is_refused(gcs_proxied, gcs_bucket, tmp_path):
    """The stored CRC32C is of the compressed bytes: a valid gzip body of other bytes fails it."""
    proxy, env = gcs_proxied
    stored, other = gzip.compress(b"right" * 1000), gzip.compress(b"wrong" * 1000)
    fault = Fault.status(200, body=other, method="GET", path="/download/",
                         headers={"x-goog-hash": f"crc32c={crc32c(stored)}", "x-goog-generation": "1",
                                  "content-encoding": "gzip", "x-goog-stored-content-encoding": "gzip",
                                  "x-goog-stored-content-length": str(len(other))})
    with Session(Settings(max_attempts=1, **FAST), env) as session:
        proxy.set_faults([fault])
        with pytest.raises(ChecksumMismatch):
            session.backend(gs(gcs_bucket, "z")).get(gs(gcs_bucket, "z"), io.BytesIO())
