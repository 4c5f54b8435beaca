"""A broken body resumes inside its request (issue 39, item 11): MinIO behind a proxy that
resets, cuts or stalls a GET's answer part-way; the file's one attempt completes from the
byte it reached, with a ranged GET pinned to the ETag, a bounded number of times."""

from __future__ import annotations

import hashlib
import io
import os

import pytest

from pegasus_cloudio_testbed.proxy import Fault
from transfer import Engine, RemoteError, Session, Settings, Transfer, TransientError, parse_url
from transfer.http.resume import RESUMES

SIZE = 3 << 20  # one object, under two download parts: one GET and its resumes
CUT = 1 << 20


@pytest.fixture
def stored(proxied, bucket, tmp_path):
    """(proxy, env, URL, bytes): one object in MinIO, read through the proxy."""
    proxy, env = proxied
    data = os.urandom(SIZE)
    source = tmp_path / "source"
    source.write_bytes(data)
    url = f"s3://test@minio/{bucket}/obj"
    with Session(Settings(), env) as session:
        assert Engine(session).run([Transfer((parse_url(f"file://{source}"),), parse_url(url))])[0].ok
    proxy.reset_counters()
    return proxy, env, url, data


def download(env, url, dest, **settings):
    with Session(Settings(max_attempts=1, **settings), env) as session:
        [result] = Engine(session).run([Transfer((parse_url(url),), parse_url(f"file://{dest}"))])
    return result


@pytest.mark.parametrize("cut", [Fault.reset(CUT, method="GET", path="/obj"),
                                 Fault.truncate(CUT, method="GET", path="/obj"),
                                 Fault.reset(0, method="GET", path="/obj")],
                         ids=["reset", "closed", "reset-before-any-byte"])
def test_a_cut_body_completes_within_one_attempt(stored, tmp_path, cut):
    proxy, env, url, data = stored
    proxy.set_faults([cut])
    result = download(env, url, tmp_path / "got")
    assert result.ok and result.attempts == 1, result.error
    assert hashlib.sha256((tmp_path / "got").read_bytes()).digest() == hashlib.sha256(data).digest()
    assert proxy.requests_by_method == {"GET": 2}


def test_a_stalled_body_resumes_after_the_read_timeout(stored, tmp_path):
    proxy, env, url, data = stored
    proxy.set_faults([Fault.stall(30, CUT, method="GET", path="/obj")])
    result = download(env, url, tmp_path / "got", read_timeout=1.0)
    assert result.ok and result.attempts == 1, result.error
    assert (tmp_path / "got").read_bytes() == data


def test_the_backend_get_resumes_into_its_sink_and_checks_the_whole_body(stored):
    """The node cache's fill path: ``get`` into a sink, the checksum over both answers."""
    proxy, env, url, data = stored
    proxy.set_faults([Fault.reset(CUT, method="GET", path="/obj"), Fault.truncate(2 * CUT, method="GET", path="/obj")])
    sink = io.BytesIO()
    with Session(Settings(), env) as session:
        info = session.backend(parse_url(url)).get(parse_url(url), sink)
    assert info.size == SIZE and sink.getvalue() == data
    assert proxy.requests_by_method == {"GET": 3}


def test_resumes_are_bounded_then_the_attempt_fails_leaving_no_file(stored, tmp_path):
    proxy, env, url, _ = stored
    proxy.set_faults([Fault.reset(CUT // 4, method="GET", path="/obj", times=50)])
    result = download(env, url, tmp_path / "got")
    assert not result.ok and isinstance(result.error, TransientError)
    assert proxy.requests_by_method == {"GET": 1 + RESUMES}
    assert [n for n in os.listdir(tmp_path) if "got" in n] == []


def test_an_object_replaced_between_cut_and_resume_is_not_spliced(stored, tmp_path):
    """The resume is pinned to the first answer's ETag: a store that answers 412 (If-Match
    failed) ends the attempt with the change named, and nothing is written."""
    proxy, env, url, _ = stored
    proxy.set_faults([Fault.reset(CUT, method="GET", path="/obj"),
                      Fault.status(412, body=b"<Error><Code>PreconditionFailed</Code></Error>", method="GET",
                                   path="/obj")])
    result = download(env, url, tmp_path / "got")
    assert not result.ok and isinstance(result.error, RemoteError) and "changed" in str(result.error)
    assert [n for n in os.listdir(tmp_path) if "got" in n] == []
