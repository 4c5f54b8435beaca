"""The whole key corpus through our S3 backend on moto, which follows Amazon's key rules
(``//``, ``.``/``..`` segments, trailing ``/`` and 1,024-byte keys are all legal there, unlike
on MinIO) and checks every signature."""

import io
from concurrent.futures import ThreadPoolExecutor

import pytest

from pegasus_cloudio.testbed.keys import key_corpus
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
