"""The whole key corpus through our S3 backend on moto, which follows Amazon's key rules
(``//``, ``.``/``..`` segments, trailing ``/`` and 1,024-byte keys are all legal there, unlike
on MinIO) and checks every signature."""

import io
from concurrent.futures import ThreadPoolExecutor

import pytest

from pegasus_cloudio_testbed.keys import key_corpus
from transfer import Session, Settings, parse_url
from transfer.errors import AuthError
from transfer.urls import Url

KEYS = key_corpus(1400)


def test_every_key_round_trips_lists_and_deletes(store_s3moto, tmp_path):
    env, base = store_s3moto
    with Session(Settings(threads=4), env) as session:
        root = parse_url(base + "/", site_label="moto")
        backend = session.backend(root)
        urls = [root.with_path(root.path + key) for key in KEYS]
        sources = []
        for number, key in enumerate(KEYS):
            path = tmp_path / str(number)
            path.write_bytes(key.encode() + b"!")
            sources.append(str(path))
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(backend.put, sources, urls))
            bodies = list(pool.map(lambda url: _get(backend, url), urls))
        assert bodies == [key.encode() + b"!" for key in KEYS]
        listed = {info.url.path for info in backend.list(root)}
        assert listed == {url.path for url in urls}
        assert backend.delete(urls) == [None] * len(urls)
        assert list(backend.list(root)) == []


def _get(backend, url: Url) -> bytes:
    sink = io.BytesIO()
    backend.get(url, sink)
    return sink.getvalue()


def test_a_wrong_secret_is_an_auth_error_naming_the_url(moto, tmp_path):
    """moto checks signatures: the failure is classified by status, and says which URL."""
    creds = tmp_path / "bad.conf"
    creds.write_text(f"[moto]\nendpoint = {moto.endpoint}\n[test@moto]\naccess_key = {moto.access_key}\n"
                     "secret_key = wrong\n")
    creds.chmod(0o600)
    env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path)}
    with Session(Settings(), env) as session:
        url = parse_url("s3://test@moto/some-bucket/k", site_label="moto")
        with pytest.raises(AuthError) as info:
            session.backend(url).stat(url)
    assert "s3://test@moto/some-bucket/k" in str(info.value) and "wrong" not in str(info.value)


def test_multipart_upload_round_trips_and_its_etag_checks_out(store_s3moto, tmp_path):
    import os

    from transfer.engine import Engine
    from transfer.ops import Transfer

    env, base = store_s3moto
    source = tmp_path / "big"
    source.write_bytes(os.urandom(12 << 20))
    settings = Settings(threads=3, multipart_threshold=5 << 20, multipart_part_size=5 << 20)
    with Session(settings, env) as session:
        dest = parse_url(base + "/big", site_label="moto")
        [result] = Engine(session).run([Transfer((parse_url(str(source)),), dest)])
        assert result.ok, result.error
        info = session.backend(dest).stat(dest)
        assert info.version.endswith("-3") and _get(session.backend(dest), dest) == source.read_bytes()


def test_pipelined_gets_answered_403_and_close_fail_without_waiting_out_the_read_timeout(moto, tmp_path):
    """moto answers a GET signed with a wrong secret with 403 and ``Connection: close``: the
    close ends every request that connection carried. The batch waited out the read timeout
    (62 s for 2 files); with a read timeout of 300 s it would outlast this test's 120 s."""
    import json
    import subprocess
    import sys
    creds = tmp_path / "bad.conf"
    creds.write_text(f"[moto]\nendpoint = {moto.endpoint}\n[test@moto]\naccess_key = {moto.access_key}\n"
                     "secret_key = wrong\n")
    creds.chmod(0o600)
    env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": "/dev/null",
           "PEGASUS_CLOUDIO_READ_TIMEOUT": "300", "PEGASUS_CLOUDIO_CACHE_DIR": "off",
           "AWS_EC2_METADATA_DISABLED": "true"}
    spec = [{"type": "transfer", "src_urls": [{"site_label": "moto", "url": f"s3://test@moto/some-bucket/f{i}"}],
             "dest_urls": [{"site_label": "local", "url": f"file://{tmp_path}/f{i}"}]} for i in range(2)]
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.dropin"], input=json.dumps(spec), env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    for i in range(2):
        assert f"s3://test@moto/some-bucket/f{i}" in done.stderr and not (tmp_path / f"f{i}").exists()
    assert "wrong" not in done.stderr
