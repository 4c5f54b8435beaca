"""The engine's pipelined first pass over small S3 downloads (transfer/batched.py), through a
fault-injecting proxy in front of a real MinIO: every file arrives whole and right, a fault
costs a file nothing but the ordinary path's usual attempts, an answer is never written to
another request's file, and no partial file is left where a job reads."""

import os

import pytest

from pegasus_cloudio_testbed.proxy import Fault
from transfer import Engine, InvalidInput, Mkdir, NotFound, RetryPolicy, Session, Settings, Transfer, TransientError, parse_url
from transfer._workers import InlineExecutor
from transfer.cache import CacheConfig, NodeCache

FAST_RETRY = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05)
COUNT = 24


def s3(bucket, key):
    return parse_url(f"s3://test@minio/{bucket}/{key}", site_label="minio")


@pytest.fixture
def stored(proxied, bucket, tmp_path):
    """COUNT small objects uploaded through the proxy; returns (proxy, env, {name: bytes})."""
    proxy, env = proxied
    src = tmp_path / "src"
    src.mkdir()
    data = {f"f{i:02d}": os.urandom(100 + i) for i in range(COUNT)}
    for name, content in data.items():
        (src / name).write_bytes(content)
    with Session(Settings(threads=3), env) as session:
        results = Engine(session).run([Transfer((parse_url(str(src / n)),), s3(bucket, n)) for n in data])
    assert all(r.ok for r in results)
    proxy.reset_counters()
    return proxy, env, data


def download(env, bucket, dest, names, threads=3):
    with Session(Settings(threads=threads), env) as session:
        return Engine(session, retry=FAST_RETRY).run(
            [Transfer((s3(bucket, n),), parse_url(f"file://{dest}/{n}")) for n in names])


def hidden(directory):
    return [n for n in os.listdir(directory) if n.startswith(".")]


def test_a_batch_is_pipelined_over_few_connections_and_arrives_whole(stored, bucket, tmp_path):
    proxy, env, data = stored
    results = download(env, bucket, tmp_path / "out", list(data))
    assert all(r.ok and r.attempts == 1 and len(r.history) == 1 for r in results)
    assert [r.bytes for r in results] == [len(v) for v in data.values()]
    assert {n: (tmp_path / "out" / n).read_bytes() for n in data} == data
    counts = proxy.snapshot()
    assert counts["requests_by_method"] == {"GET": COUNT} and counts["connections"] <= 3
    assert hidden(tmp_path / "out") == []


class CountingExecutor(InlineExecutor):
    """Runs tasks inline and counts them: each per-file transfer is one task."""

    submitted = 0

    def submit(self, fn, /, *args, **kwargs):
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def test_with_the_node_cache_misses_are_pipelined_and_fill_the_cache_as_one_by_one(stored, bucket, tmp_path):
    """The node cache is on by default: its misses take the pass too, and leave what the per-file
    fill leaves (an entry per object, the destination a hard link to it); its hits cost no GET."""
    proxy, env, data = stored
    cache = NodeCache(CacheConfig(str(tmp_path / "cache"), max_bytes=1 << 30, min_free_bytes=0, fsync=False))

    def run(out):
        executor = CountingExecutor()
        with Session(Settings(threads=3), env) as session:
            results = Engine(session, retry=FAST_RETRY, executor=executor, cache=cache).run(
                [Transfer((s3(bucket, n),), parse_url(f"file://{out}/{n}")) for n in data])
        assert all(r.ok and r.attempts == 1 for r in results), [r.error for r in results if not r.ok]
        assert {n: (out / n).read_bytes() for n in data} == data and hidden(out) == []
        return executor.submitted

    assert run(tmp_path / "first") == 0  # no file went the per-file way
    counts = proxy.snapshot()
    assert counts["requests_by_method"] == {"GET": COUNT} and counts["connections"] <= 3
    for name in data:
        st = os.stat(tmp_path / "first" / name)
        assert st.st_nlink == 2 and not st.st_mode & 0o222, (name, st)
    assert cache.stats().misses == COUNT
    proxy.reset_counters()
    run(tmp_path / "second")
    assert proxy.snapshot()["requests"] == 0
    assert cache.stats().hits == COUNT


def test_bodies_handed_over_a_few_at_a_time_are_each_one_get_made_from_the_calling_thread(
        stored, bucket, tmp_path, monkeypatch):
    """The read-ahead hands its bodies over 3 at a time and waits while this thread writes
    them: each object is one GET, no file goes the per-file way, and the results keep the
    input order."""
    import transfer.layers.store as store_module
    monkeypatch.setattr(store_module, "_RELAY", 3)
    proxy, env, data = stored
    executor = CountingExecutor()
    out = tmp_path / "out"
    with Session(Settings(threads=3), env) as session:
        results = Engine(session, retry=FAST_RETRY, executor=executor).run(
            [Transfer((s3(bucket, n),), parse_url(f"file://{out}/{n}")) for n in data])
    assert [r.op.dest.path for r in results] == [f"{out}/{n}" for n in data]
    assert all(r.ok and r.attempts == 1 and len(r.history) == 1 for r in results)
    assert {n: (out / n).read_bytes() for n in data} == data and hidden(out) == []
    assert executor.submitted == 0
    counts = proxy.snapshot()
    assert counts["requests_by_method"] == {"GET": COUNT} and counts["connections"] <= 3


@pytest.mark.parametrize("fault", [
    Fault.reset(after_bytes=0, method="GET"),
    Fault.reset(after_bytes=500, method="GET"),
    Fault.truncate(after_bytes=200, method="GET"),
    # every request head re-arms it: each connection is reset some answers into its pipeline
    Fault.reset(after_bytes=5000, method="GET", times=10_000),
], ids=["reset-before-answer", "reset-mid-answer", "truncate-mid-answer", "reset-every-few-answers"])
def test_a_connection_lost_mid_pipeline_costs_no_file_an_attempt(stored, bucket, tmp_path, fault):
    proxy, env, data = stored
    proxy.set_faults([fault])
    results = download(env, bucket, tmp_path / "out", list(data))
    assert all(r.ok and r.attempts == 1 for r in results), [r.error for r in results if not r.ok]
    assert {n: (tmp_path / "out" / n).read_bytes() for n in data} == data
    assert hidden(tmp_path / "out") == []


def test_answers_out_of_order_are_never_written_to_another_file(stored, bucket, tmp_path):
    """The proxy answers a 503 itself, at once, ahead of the store's answers to the requests
    pipelined before it: each answer's echoed tag keeps it from the wrong file."""
    proxy, env, data = stored
    # f10's request goes out behind others on the one connection (by then several are in flight)
    proxy.set_faults([Fault.status(503, method="GET", path="/f10?", times=1)])
    results = download(env, bucket, tmp_path / "out", list(data), threads=1)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert {n: (tmp_path / "out" / n).read_bytes() for n in data} == data
    assert proxy.snapshot()["requests_by_method"]["GET"] > COUNT  # answers out of step went the ordinary way


def test_persistent_faults_fail_each_file_after_its_attempts_leaving_nothing(stored, bucket, tmp_path):
    proxy, env, data = stored
    proxy.set_faults([Fault.truncate(after_bytes=50, method="GET", times=10_000)])
    names = list(data)[:4]
    results = download(env, bucket, tmp_path / "out", names)
    assert all(not r.ok and isinstance(r.error, TransientError) and r.attempts == 3 for r in results), [(r.ok, r.error, r.attempts) for r in results]
    out = tmp_path / "out"
    assert not out.exists() or os.listdir(out) == []


def test_a_missing_object_fails_alone_as_the_ordinary_path_reports_it(stored, bucket, tmp_path):
    proxy, env, data = stored
    names = list(data)[:5] + ["absent"] + list(data)[5:10]
    results = download(env, bucket, tmp_path / "out", names)
    by_name = dict(zip(names, results))
    missing = by_name.pop("absent")
    assert isinstance(missing.error, NotFound) and missing.attempts == 1
    assert "absent" in str(missing.error)
    assert all(r.ok for r in by_name.values())
    assert not (tmp_path / "out" / "absent").exists() and hidden(tmp_path / "out") == []
    # the pass goes on past the 404 (no bundle stands in): one GET per file, one look for a
    # bundle index, and the per-file path's GET of the missing file, which makes its error
    assert proxy.snapshot()["requests_by_method"]["GET"] == len(names) + 2, proxy.snapshot()


def test_a_destination_that_cannot_be_written_fails_alone(stored, bucket, tmp_path):
    proxy, env, data = stored
    names = list(data)[:6]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "blocked").write_bytes(b"a file where a directory should be")
    with Session(Settings(threads=2), env) as session:
        results = Engine(session, retry=FAST_RETRY).run(
            [Transfer((s3(bucket, n),), parse_url(f"file://{tmp_path}/out/{'blocked/' if i == 2 else ''}{n}"))
             for i, n in enumerate(names)])
    assert [r.ok for r in results] == [True, True, False, True, True, True]
    assert str(tmp_path / "out" / "blocked") in str(results[2].error)
    assert hidden(tmp_path / "out") == []


def test_large_objects_go_the_ordinary_way_among_small_ones(stored, bucket, tmp_path):
    proxy, env, data = stored
    big = os.urandom(3 << 20)
    (tmp_path / "big").write_bytes(big)
    with Session(Settings(threads=2), env) as session:
        assert Engine(session).run([Transfer((parse_url(str(tmp_path / "big")),), s3(bucket, "big"))])[0].ok
    names = list(data)[:6] + ["big"] + list(data)[6:12]
    results = download(env, bucket, tmp_path / "out", names)
    assert all(r.ok for r in results)
    assert (tmp_path / "out" / "big").read_bytes() == big
    assert all((tmp_path / "out" / n).read_bytes() == data[n] for n in names if n != "big")


def test_a_batch_over_tls_is_pipelined_too(minio_tls, tmp_path):
    creds = minio_tls.write_pegasus_credentials(tmp_path / "tls.conf", site="minio", user="test")
    env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull}
    data = {f"t{i:02d}": os.urandom(200 + i) for i in range(12)}
    for name, content in data.items():
        (tmp_path / name).write_bytes(content)
    url = "s3s://test@minio/tlsbatch/{}"
    with Session(Settings(threads=2, ca_bundle=str(minio_tls.ca_file)), env) as session:
        engine = Engine(session, retry=FAST_RETRY)
        assert all(r.ok for r in engine.run([Mkdir(parse_url(url.format(""), site_label="minio"))]))
        assert all(r.ok for r in engine.run([Transfer((parse_url(str(tmp_path / n)),),
                                                      parse_url(url.format(n), site_label="minio")) for n in data]))
        sent = session.stats.requests_sent
        results = engine.run([Transfer((parse_url(url.format(n), site_label="minio"),),
                                       parse_url(f"file://{tmp_path}/out/{n}")) for n in data])
        assert all(r.ok and r.attempts == 1 for r in results), [r.error for r in results]
        assert session.stats.requests_sent - sent == len(data)
    assert {n: (tmp_path / "out" / n).read_bytes() for n in data} == data


def test_a_store_that_refuses_the_tag_costs_a_few_requests_then_the_ordinary_path(stored, bucket, tmp_path):
    """A store (or proxy) answering every pipelined GET with an error: the pass gives up
    after a few answers, and every file comes the ordinary way."""
    proxy, env, data = stored
    proxy.set_faults([Fault.status(400, body=b"<Error><Code>InvalidArgument</Code></Error>", method="GET",
                                   path="response-cache-control", times=10_000)])
    results = download(env, bucket, tmp_path / "out", list(data))
    assert all(r.ok and r.attempts == 1 for r in results), [r.error for r in results if not r.ok]
    assert {n: (tmp_path / "out" / n).read_bytes() for n in data} == data
    assert proxy.snapshot()["requests_by_method"]["GET"] <= COUNT + 12


def test_the_signal_handlers_cleanup_may_interrupt_the_thread_holding_its_lock():
    """The engine's own thread writes files now: a SIGTERM handler removing the temp files can
    arrive while that thread is inside their bookkeeping, and must not wait on it forever."""
    import threading

    from transfer import atomic

    def handler_inside_bookkeeping():
        with atomic._LIVE._lock:
            atomic.remove_temp_files()

    thread = threading.Thread(target=handler_inside_bookkeeping, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()


def test_an_answer_with_only_its_size_to_check_is_never_framed_by_the_next_one(tmp_path):
    """A server that sends one GET's head without its body (as if it were a HEAD), for
    objects whose ETags are multipart (no MD5 to check, no checksum header): the pass must
    not take the next pipelined answer's bytes for that object's. (The ordinary path, one
    request in flight, waits for the body and fails the file.)"""
    from urllib.parse import unquote

    from pegasus_cloudio_testbed.scripted import Reply, ScriptedServer
    objects = {f"k{i}": f"object {i} ".encode() * 40 for i in range(8)}

    def answer(request):
        key = request.path.rsplit("/", 1)[1]
        tag = unquote(request.query.partition("response-cache-control=")[2].partition("&")[0])
        headers = {"ETag": '"0123456789abcdef0123456789abcdef-2"', "Content-Length": str(len(objects[key]))}
        if tag:
            headers["Cache-Control"] = tag
        return Reply(200, headers, b"" if key == "k3" else objects[key])

    with ScriptedServer(answer) as server:
        creds = tmp_path / "scripted.conf"
        creds.write_text(f"[fake]\nendpoint = {server.endpoint}\n[test@fake]\naccess_key = AK\nsecret_key = SK\n")
        creds.chmod(0o600)
        env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
               "AWS_EC2_METADATA_DISABLED": "true"}
        with Session(Settings(threads=1, read_timeout=1.0), env) as session:
            results = Engine(session, retry=RetryPolicy(max_attempts=1)).run(
                [Transfer((parse_url(f"s3://test@fake/bkt/{k}", site_label="fake"),),
                          parse_url(f"file://{tmp_path}/out/{k}")) for k in objects])
    by_key = dict(zip(objects, results))
    assert not by_key["k3"].ok and not (tmp_path / "out" / "k3").exists()
    assert all(by_key[k].ok and (tmp_path / "out" / k).read_bytes() == objects[k] for k in objects if k != "k3")


@pytest.mark.parametrize("headers,body,ok", [
    ({"etag": '"{md5}"'}, b"x" * 10, True),
    ({"etag": '"{md5}"'.upper()}, b"x" * 10, True),
    ({"etag": '"0123456789abcdef0123456789abcdef"'}, b"x" * 10, False),  # the MD5 ETag disagrees
    ({"etag": '"{md5}"', "content-length": "11"}, b"x" * 10, False),  # short body
    ({"etag": '"{md5}"', "cache-control": "pegasus-cloudio-get-8"}, b"x" * 10, False),  # another request's answer
    ({"etag": '"{md5}"', "x-amz-checksum-sha256": "{sha256}"}, b"x" * 10, True),
    ({"etag": '"{md5}"', "x-amz-checksum-sha256": "AAAA"}, b"x" * 10, False),  # a checksum header wins over the ETag
    # nothing but the size to check: left to the ordinary path (see the framing test above)
    ({"etag": '"{md5}"', "x-amz-server-side-encryption": "aws:kms"}, b"y" * 10, False),
    ({"etag": '"abc-2"'}, b"x" * 10, False),
    ({"etag": '"abc-2"', "x-amz-checksum-sha256": "{sha256}"}, b"x" * 10, True),  # multipart, checksum header
])
def test_a_pipelined_answer_is_taken_only_when_it_passes_the_checks_get_makes(headers, body, ok):
    import base64
    import hashlib

    from transfer.backends._s3_pipelined import verified as _verified
    md5, sha = hashlib.md5(b"x" * 10).hexdigest(), base64.b64encode(hashlib.sha256(b"x" * 10).digest()).decode()
    answer = {k: v.replace("{md5}", md5).replace("{MD5}", md5.upper()).replace("{sha256}", sha)
              for k, v in headers.items()}
    answer.setdefault("content-length", "10")
    answer.setdefault("cache-control", "pegasus-cloudio-get-7")
    info = _verified(s3("b", "k"), 200, answer, body, "pegasus-cloudio-get-7")
    assert (info is not None) is ok
    assert _verified(s3("b", "k"), 206, answer, body, "pegasus-cloudio-get-7") is None


def test_a_result_callback_that_raises_in_the_pass_is_neither_swallowed_nor_reported_twice(stored, bucket, tmp_path):
    """``on_result`` raising for a file the pass wrote: as on the ordinary path, the error
    leaves the run; the pass does not take it for a failed read, send the file down the
    ordinary path (a second GET, a second write) and report it a second time."""
    proxy, env, data = stored
    names = list(data)
    reported = []

    def on_result(result):
        reported.append(result.op.dest.path)
        if len(reported) == 1:
            raise RuntimeError("the caller's callback failed")

    with Session(Settings(threads=3), env) as session:
        with pytest.raises(RuntimeError, match="callback failed"):
            Engine(session, retry=FAST_RETRY, on_result=on_result).run(
                [Transfer((s3(bucket, n),), parse_url(f"file://{tmp_path}/out/{n}")) for n in names])
    assert len(reported) == len(set(reported)), "a file reported twice"
    assert proxy.snapshot()["requests_by_method"]["GET"] <= COUNT


def test_a_destination_that_names_a_directory_fails_without_a_request_or_a_new_directory(stored, bucket, tmp_path):
    """Bad input fails before the network: a destination ending in ``/`` is refused as the
    ordinary path refuses it, with no GET for it and nothing made at that path."""
    proxy, env, data = stored
    names = list(data)[:6]
    with Session(Settings(threads=2), env) as session:
        results = Engine(session, retry=FAST_RETRY).run(
            [Transfer((s3(bucket, n),), parse_url(f"file://{tmp_path}/out/{'sub/' if i == 2 else n}"))
             for i, n in enumerate(names)])
    assert [r.ok for r in results] == [True, True, False, True, True, True]
    assert isinstance(results[2].error, InvalidInput) and "directory" in str(results[2].error)
    assert proxy.snapshot()["requests_by_method"]["GET"] == len(names) - 1
    assert not (tmp_path / "out" / "sub").exists() and hidden(tmp_path / "out") == []


@pytest.mark.parametrize("bundle", [False, True], ids=["pipelined", "bundles-on"])
def test_with_the_node_cache_a_source_without_credentials_fails_alone(stored, bucket, tmp_path, bundle):
    """Asking the cache about a source builds its backend, which can fail (no credentials for
    its identity): that file fails as the per-file path reports it; the run goes on."""
    proxy, env, data = stored
    cache = NodeCache(CacheConfig(str(tmp_path / "cache"), max_bytes=1 << 30, min_free_bytes=0, fsync=False))
    names = list(data)[:4]
    ops = [Transfer((s3(bucket, n),), parse_url(f"file://{tmp_path}/out/{n}")) for n in names]
    ops.insert(2, Transfer((parse_url(f"s3://nobody@minio/{bucket}/{names[0]}", site_label="minio"),),
                           parse_url(f"file://{tmp_path}/out/orphan")))
    with Session(Settings(threads=3, bundle=bundle), env) as session:
        results = Engine(session, retry=FAST_RETRY, cache=cache).run(ops)
    assert [r.ok for r in results] == [True, True, False, True, True], [r.error for r in results]
    assert "nobody" in str(results[2].error)
    assert not (tmp_path / "out" / "orphan").exists()


def test_with_the_node_cache_an_entry_of_another_version_found_at_the_fill_is_not_handed_out(stored, bucket,
                                                                                           tmp_path):
    """A pipelined answer is the object as stored now. If, between the pass's look for hits and
    its fill, another job on the node publishes an entry of an older version (it read the
    object before it was replaced), the job gets the bytes it fetched, not the entry's, and the
    stale entry goes, as a fresh GET drops one everywhere else (NodeCache.observe). The other
    job's fill is played by the result callback of the first file done, through the cache's
    public insert."""
    from transfer.backends.base import cache_keys
    proxy, env, data = stored
    names = list(data)[:4]
    old = {n: b"old " + data[n] for n in names}
    src = tmp_path / "old"
    src.mkdir()
    for n in names:
        (src / n).write_bytes(old[n])
    cache = NodeCache(CacheConfig(str(tmp_path / "cache"), max_bytes=1 << 30, min_free_bytes=0, fsync=False))
    with Session(Settings(threads=3), env) as session:
        # the old version's ETag as the store gave it, then the object as it is now
        assert all(r.ok for r in Engine(session).run([Transfer((parse_url(str(src / n)),), s3(bucket, n))
                                                        for n in names]))
        backend = session.backend(s3(bucket, names[0]))
        keys = {n: cache_keys(backend).cache_key(s3(bucket, n)) for n in names}
        versions = {n: backend.stat(s3(bucket, n)).version for n in names}
        assert all(r.ok for r in Engine(session).run([Transfer((parse_url(str(tmp_path / "src" / n)),), s3(bucket, n))
                                                      for n in names]))
        out = tmp_path / "out"
        planted = []

        def another_job_fills(result):
            if not planted:
                for n in names:
                    if not (out / n).exists():
                        assert cache.insert_bytes(keys[n], old[n], versions[n])
                        planted.append(n)

        executor = CountingExecutor()
        results = Engine(session, retry=FAST_RETRY, executor=executor, cache=cache,
                         on_result=another_job_fills).run(
            [Transfer((s3(bucket, n),), parse_url(f"file://{out}/{n}")) for n in names])
    assert all(r.ok for r in results) and executor.submitted == 0 and planted  # every file took the pass
    assert {n: (out / n).read_bytes() for n in names} == {n: data[n] for n in names}
    for n in planted:
        with cache.pin(keys[n]) as entry:
            assert entry is None or open(entry, "rb").read() == data[n], n
