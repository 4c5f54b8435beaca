"""The plain library API (transfer.client) and the friction points of issue #23, on a real MinIO."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from local_files import files
from inotify_support import stats_opens
from pegasus_cloudio_testbed.proxy import Fault, TcpProxy
from transfer import Engine, Remove, Session, Settings, Transfer, parse_url
from transfer.client import Client
from transfer.errors import Cancelled, ConfigError, InvalidInput, NotFound, RemoteError
from transfer.urls import Url


def test_write_read_list_remove_with_endpoint_and_keys_as_arguments(client, where):
    client.write_bytes(f"{where}/run/a.txt", b"hello")
    client.write_bytes(f"{where}/run/sub/b.txt", b"world!")
    assert client.read_bytes(f"{where}/run/a.txt") == b"hello"
    assert client.read_bytes(f"{where}/run/sub/b.txt", 1, 4) == b"orl"
    listed = client.list(f"{where}/run/")
    assert [(e.name, e.size, e.is_dir) for e in listed] == [("a.txt", 5, False), ("sub", 0, True)]
    assert listed[0].url == f"{where}/run/a.txt" and listed[0].mtime is not None
    assert [e.url for e in client.find(f"{where}/run")] == [f"{where}/run/a.txt", f"{where}/run/sub/b.txt"]
    assert client.info(f"{where}/run/sub").is_dir and client.info(f"{where}/run/a.txt").size == 5
    client.remove(f"{where}/run", recursive=True)
    assert not client.exists(f"{where}/run/a.txt") and not client.exists(f"{where}/run")


def test_copy_many_into_a_directory_destination_and_back(client, where, tmp_path):
    sources = files(tmp_path / "src", 20)
    results = client.copy([(str(p), f"{where}/in/") for p in sources])
    assert all(r.ok for r in results)
    assert sorted(e.name for e in client.list(f"{where}/in")) == [p.name for p in sources]
    out = tmp_path / "out"
    out.mkdir()
    client.copy([(f"{where}/in/{p.name}", f"{out}/") for p in sources])
    assert all((out / p.name).read_bytes() == p.read_bytes() for p in sources)


def test_bundle_members_are_files_to_list_info_read_and_remove(minio, tmp_path):
    sources = files(tmp_path / "src", 12)
    with Client(endpoint=minio.endpoint, access_key=minio.access_key, secret_key=minio.secret_key,
                bundles=True, env={}) as client:
        where = f"s3://b-{uuid.uuid4().hex[:12]}"
        client.mkdir(where)
        client.copy([(str(p), f"{where}/d/") for p in sources])
        listed = client.list(f"{where}/d")
        assert [e.name for e in listed] == [p.name for p in sources]  # no .cloudio-bundles shown
        assert client.info(f"{where}/d/{sources[3].name}").size == 300
        assert client.read_bytes(f"{where}/d/{sources[3].name}") == sources[3].read_bytes()
        assert client.read_bytes(f"{where}/d/{sources[4].name}", 10, 20) == sources[4].read_bytes()[10:20]
        assert [e.name for e in client.find(where)] == [p.name for p in sources]
        client.remove(f"{where}/d/{sources[0].name}")
        assert not client.exists(f"{where}/d/{sources[0].name}")
        assert len(client.list(f"{where}/d")) == len(sources) - 1


def test_remove_never_silently_deletes_nothing(client, where):
    client.write_bytes(f"{where}/dir/x", b"x")
    with pytest.raises(InvalidInput, match="recursive"):
        client.remove(f"{where}/dir")
    with pytest.raises(NotFound):
        client.remove(f"{where}/missing")
    assert client.read_bytes(f"{where}/dir/x") == b"x"
    session = client.session
    [result] = Engine(session).run([Remove(parse_url(f"{where}/dir/"))])
    assert not result.ok and isinstance(result.error, InvalidInput)


def test_recursive_remove_of_an_object_removes_it_and_no_neighbour(client, where):
    """remove(url, recursive=True) of an object listed 'url/' only and deleted nothing: the
    call succeeded and the object stayed (the docs: nothing is removed silently-not)."""
    for key in ("di", "dir/a", "dirt", "di2/x"):
        client.write_bytes(f"{where}/{key}", b"x")
    client.remove(f"{where}/di", recursive=True)
    assert [e.url for e in client.find(f"{where}/")] == [f"{where}/di2/x", f"{where}/dir/a", f"{where}/dirt"]
    client.remove([f"{where}/dir", f"{where}/absent"], recursive=True)  # rm -r: absent is no error
    assert [e.url for e in client.find(f"{where}/")] == [f"{where}/di2/x", f"{where}/dirt"]


def test_two_sources_copied_to_one_destination_are_refused_naming_it(client, where, tmp_path):
    """copy([(a, x), (b, x)]) ran both on the thread pool: x ended up holding a or b, whichever
    finished last, and both results said ok."""
    client.write_bytes(f"{where}/a", b"a")
    client.write_bytes(f"{where}/b", b"b")
    dest = tmp_path / "x"
    with pytest.raises(InvalidInput, match=str(dest)):
        client.copy([(f"{where}/a", str(dest)), (f"{where}/b", str(dest))])
    with pytest.raises(InvalidInput, match=str(dest)):  # the same through a directory destination
        client.copy([(f"{where}/a", str(tmp_path / "x")), (f"{where}/x", f"{tmp_path}/")])
    assert not dest.exists()
    client.copy([(f"{where}/a", str(dest)), (f"{where}/a", str(dest))])  # the same pair twice: harmless
    assert dest.read_bytes() == b"a"


def test_missing_object_is_not_found_naming_it(client, where):
    with pytest.raises(NotFound) as info:
        client.read_bytes(f"{where}/nope")
    assert "nope" in str(info.value)
    with pytest.raises(FileNotFoundError):
        client.list(f"{where}/nope")


def test_endpoint_and_keys_have_the_names_s3fs_gives_them_and_the_old_ones_as_aliases(minio, where):
    with Client(endpoint_url=minio.endpoint, key=minio.access_key, secret=minio.secret_key, env={}) as named:
        named.write_bytes(f"{where}/named", b"s3fs names")
    with Client(endpoint=minio.endpoint, access_key=minio.access_key, secret_key=minio.secret_key, env={}) as old:
        assert old.read_bytes(f"{where}/named") == b"s3fs names"
    for both in ({"endpoint_url": minio.endpoint, "endpoint": minio.endpoint},
                 {"key": "a", "access_key": "a", "secret": "b"}, {"token": "t", "session_token": "t"}):
        with pytest.raises(InvalidInput, match="one argument"):
            Client(env={}, **both)
    with pytest.raises(InvalidInput, match="key and secret"):
        Client(key="a", env={})


def test_touch_renews_the_time_keeps_bytes_and_attributes_and_creates_what_is_absent(client, where, minio):
    import boto3

    s3 = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                      aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    bucket = where[len("s3://"):]
    s3.put_object(Bucket=bucket, Key="d/a", Body=b"kept", ContentType="text/x-kept", Metadata={"who": "me"},
                  CacheControl="max-age=60")
    before = client.info(f"{where}/d/a")
    while time.time() < before.mtime + 1.5:  # the store's times are whole seconds: wait for the next one
        time.sleep(0.05)
    after = client.touch(f"{where}/d/a")
    assert after.mtime > before.mtime and client.read_bytes(f"{where}/d/a") == b"kept"
    head = s3.head_object(Bucket=bucket, Key="d/a")
    assert (head["ContentType"], head["Metadata"], head["CacheControl"]) == ("text/x-kept", {"who": "me"},
                                                                              "max-age=60")
    assert client.touch(f"{where}/d").is_dir and client.info(f"{where}/d/a").mtime >= after.mtime  # a directory
    made = client.touch(f"{where}/new")
    assert made.size == 0 and client.read_bytes(f"{where}/new") == b""


def test_conditional_writes_store_only_when_the_condition_holds(client, where):
    from transfer.errors import AlreadyExists

    client.write_bytes(f"{where}/c", b"first", if_none_match="*")
    with pytest.raises(AlreadyExists, match=f"{where}/c"):
        client.write_bytes(f"{where}/c", b"second", if_none_match="*")
    seen = client.info(f"{where}/c")
    client.write_bytes(f"{where}/c", b"third", if_match=seen.version)
    with pytest.raises(RemoteError, match=f"{where}/c") as caught:  # the version seen is gone
        client.write_bytes(f"{where}/c", b"fourth", if_match=seen.version)
    assert caught.value.status == 412 and client.read_bytes(f"{where}/c") == b"third"
    with pytest.raises(RemoteError):
        client.write_bytes(f"{where}/absent", b"x", if_match=seen.version)
    assert not client.exists(f"{where}/absent")
    for bad in ({"if_none_match": "etag"}, {"if_none_match": "*", "if_match": "e"}):
        with pytest.raises(InvalidInput, match=f"{where}/c"):
            client.write_bytes(f"{where}/c", b"x", **bad)
    assert client.read_bytes(f"{where}/c") == b"third"


def test_a_conditional_write_where_the_store_cannot_is_refused_naming_it(gcs_env, gcs_bucket):
    with Client(env=gcs_env) as client:
        for condition in ({"if_none_match": "*"}, {"if_match": "1"}):
            with pytest.raises(InvalidInput, match=f"gs://{gcs_bucket}/k"):
                client.write_bytes(f"gs://{gcs_bucket}/k", b"x", **condition)
        assert not client.exists(f"gs://{gcs_bucket}/k")


def test_content_type_cache_control_and_metadata_are_stored_returned_and_kept_by_copies(client, where, minio,
                                                                                        tmp_path):
    """Issue 33: write_bytes had no way to pass them, and fsspec's ContentType= and Metadata=
    were dropped silently."""
    import boto3

    from transfer.fsspec_fs import CloudioFileSystem

    client.write_bytes(f"{where}/a.json", b"{}", content_type="application/json", cache_control="no-cache",
                       metadata={"Run": "r1", "step": "2"})
    got = client.info(f"{where}/a.json")
    assert (got.content_type, got.cache_control, got.metadata) == ("application/json", "no-cache",
                                                                   {"run": "r1", "step": "2"})
    client.copy([(f"{where}/a.json", f"{where}/copied.json")])  # inside one store: a server-side copy
    kept = client.info(f"{where}/copied.json")
    assert (kept.content_type, kept.metadata) == ("application/json", {"run": "r1", "step": "2"})
    s3 = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                      aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    head = s3.head_object(Bucket=where[len("s3://"):], Key="a.json")
    assert (head["ContentType"], head["CacheControl"], head["Metadata"]) == ("application/json", "no-cache",
                                                                            {"run": "r1", "step": "2"})
    fs = CloudioFileSystem(skip_instance_cache=True, endpoint_url=minio.endpoint, key=minio.access_key,
                           secret=minio.secret_key, env={})
    fs.pipe_file(f"{where[5:]}/f.txt", b"x", ContentType="text/plain", Metadata={"k": "v"})
    details = fs.info(f"{where[5:]}/f.txt")
    assert (details["ContentType"], details["Metadata"]) == ("text/plain", {"k": "v"})
    fs.client.close()
    with pytest.raises(InvalidInput, match=f"{where}/bad"):
        client.write_bytes(f"{where}/bad", b"x", metadata={"k": "caf\u00e9"})
    with pytest.raises(InvalidInput, match=str(tmp_path)):
        client.write_bytes(str(tmp_path / "local"), b"x", content_type="text/plain")
    assert not client.exists(f"{where}/bad") and not (tmp_path / "local").exists()


def test_info_returns_the_stores_checksum_and_fsspec_checksum_means_the_content(client, where, minio):
    import boto3

    from transfer.fsspec_fs import CloudioFileSystem

    s3 = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                      aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    bucket = where[len("s3://"):]
    for key in ("c1", "c2"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"same bytes", ChecksumAlgorithm="CRC32")
    s3.put_object(Bucket=bucket, Key="c3", Body=b"other bytes", ChecksumAlgorithm="CRC32")
    crc = s3.head_object(Bucket=bucket, Key="c1", ChecksumMode="ENABLED")["ChecksumCRC32"]
    assert client.info(f"{where}/c1").checksum == f"crc32:{crc}"
    client.write_bytes(f"{where}/m1", b"same bytes")  # ours send the full-object CRC32 as boto3's do
    client.write_bytes(f"{where}/m2", b"same bytes")
    assert client.info(f"{where}/m1").checksum == f"crc32:{crc}"
    fs = CloudioFileSystem(skip_instance_cache=True, endpoint_url=minio.endpoint, key=minio.access_key,
                           secret=minio.secret_key, env={})
    sums = {key: fs.checksum(f"{bucket}/{key}") for key in ("c1", "c2", "c3", "m1", "m2")}
    assert sums["c1"] == sums["c2"] == sums["m1"] == sums["m2"] != sums["c3"]
    fs.client.close()


def test_a_range_at_or_past_the_end_reads_as_empty_like_a_slice(client, where):
    """A range starting at or past the end (or any range of an empty object) was HTTP 416 from
    the store, raised as RemoteError: fsspec's cat_file(path, 20, 30) and a reader looping to EOF
    failed where Python slicing (and this Client over the node cache) gives b""."""
    client.write_bytes(f"{where}/ten", b"0123456789")
    client.write_bytes(f"{where}/empty", b"")
    assert client.read_bytes(f"{where}/ten", 5, 30) == b"56789"
    assert client.read_bytes(f"{where}/ten", 10, 12) == b""
    assert client.read_bytes(f"{where}/ten", 20, 30) == b""
    assert client.read_bytes(f"{where}/empty", 0, 10) == b""
    with pytest.raises(NotFound):  # a missing object is still no empty one
        client.read_bytes(f"{where}/absent", 20, 30)


def test_write_bytes_to_a_url_ending_in_a_slash_is_refused_naming_it(client, where):
    """write_bytes("s3://b/k/") stored the object "k/k" (its spool file was named after the
    key's last component, then copied into the "directory" k/): data at a key nobody asked for."""
    with pytest.raises(InvalidInput, match=f"{where}/k/"):
        client.write_bytes(f"{where}/k/", b"x")
    assert client.find(f"{where}/") == []


def test_transfer_takes_a_url_or_strings_and_refuses_other_types_at_construction(tmp_path):
    url = parse_url(str(tmp_path / "a"))
    assert Transfer(url, str(tmp_path / "b")).sources == (url,)
    assert Transfer(str(tmp_path / "a"), str(tmp_path / "b")).dest == parse_url(str(tmp_path / "b"))
    with pytest.raises(TypeError, match="Transfer source must be a Url or str, not int"):
        Transfer((1,), url)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Transfer dest"):
        Transfer(url, None)  # type: ignore[arg-type]
    assert Transfer(url, "s3://b/dir/").dest == Url("s3", "b", "/dir/a")


def test_parse_url_takes_local_paths_literally(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    assert parse_url("$HOME/x").path == "$HOME/x"
    assert parse_url("file://$HOME/x").path == "$HOME/x"
    assert parse_url("file://$HOME/x", env={"HOME": "/h"}).path == "/h/x"  # the drop-in's rule, asked for
    assert parse_url("/data/run:1/a:b.txt").path == "/data/run:1/a:b.txt"


def test_two_threads_running_one_engine_both_finish(minio, tmp_path):
    settings = Settings(threads=4, download_part_size=64 << 10)
    data = os.urandom(640 << 10)  # ten ranged parts each: both runs use the engine's part pool
    with Client(endpoint=minio.endpoint, access_key=minio.access_key, secret_key=minio.secret_key,
                settings=settings, env={}) as client:
        where = f"s3://e-{uuid.uuid4().hex[:12]}"
        client.mkdir(where)
        for i in range(4):
            client.write_bytes(f"{where}/big{i}", data)
        done = []
        with Engine(client.session) as engine:
            def worker(n: int) -> None:
                results = engine.run([Transfer(f"{where}/big{i}", str(tmp_path / f"{n}-{i}")) for i in range(4)])
                done.append(all(r.ok for r in results))

            threads = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
        assert done == [True, True, True]
        assert all((tmp_path / f"{n}-{i}").read_bytes() == data for n in range(3) for i in range(4))


def _stalled(minio, proxy, threads: int) -> Client:
    """A client whose every GET stalls 3 s at the proxy (20 files on 2 threads: 30 s uncancelled)."""
    proxy.set_faults([Fault.stall(seconds=3, method="GET", times=10_000)])
    return Client(endpoint=proxy.url(), access_key=minio.access_key, secret_key=minio.secret_key,
                  settings=Settings(threads=threads), env={})


def test_a_cancel_event_stops_the_run_promptly(minio, tmp_path):
    with TcpProxy((minio.host, minio.port)) as proxy, _stalled(minio, proxy, 2) as client:
        cancel = threading.Event()
        pairs = [(f"s3://stalled/k{i}", str(tmp_path / f"k{i}")) for i in range(20)]
        timer = threading.Timer(0.5, cancel.set)
        started = time.monotonic()
        timer.start()
        results = client.copy(pairs, check=False, cancel=cancel)
        elapsed = time.monotonic() - started
    assert len(results) == 20
    assert sum(isinstance(r.error, Cancelled) for r in results) >= 14
    assert elapsed < 15


def test_asyncio_timeout_cancels_the_batch(minio, tmp_path):
    with TcpProxy((minio.host, minio.port)) as proxy, _stalled(minio, proxy, 2) as client:
        pairs = [(f"s3://stalled/k{i}", str(tmp_path / f"k{i}")) for i in range(20)]

        async def main() -> None:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(client.copy_async(pairs, check=False), 0.5)

        started = time.monotonic()
        asyncio.run(main())  # the loop's executor joins the cancelled batch's thread on exit
        assert time.monotonic() - started < 15


def test_retries_are_logged_at_debug(minio, caplog):
    with TcpProxy((minio.host, minio.port)) as proxy:
        with Client(endpoint=proxy.url(), access_key=minio.access_key, secret_key=minio.secret_key,
                    settings=Settings(max_attempts=2, retry_base_delay=0.01), env={}) as client:
            where = f"s3://r-{uuid.uuid4().hex[:12]}"
            client.mkdir(where)
            proxy.set_faults([Fault.status(503, method="PUT")])
            with caplog.at_level(logging.DEBUG, logger="transfer.engine"):
                client.write_bytes(f"{where}/k", b"data")
    assert any("retrying" in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records)


def test_session_env_is_used_instead_of_os_environ(minio, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", minio.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", minio.secret_key)
    env = {"AWS_EC2_METADATA_DISABLED": "true", "HOME": "/nonexistent", "AWS_ENDPOINT_URL": minio.endpoint}
    with Session(Settings(), env) as session:
        assert session.context.env is env or dict(session.context.env) == env
        with pytest.raises(Exception, match="no AWS credentials"):
            session.backend(parse_url("s3://bucket/key"))


def test_the_public_api_type_checks_under_mypy_strict(tmp_path):
    import subprocess
    import sys

    snippet = tmp_path / "user.py"
    snippet.write_text(
        "from typing import List\n"
        "from transfer import Session, parse_url\n"
        "from transfer.backends.base import ObjectInfo\n"
        "from transfer.client import Client, Entry\n"
        "def names(client: Client) -> List[str]:\n"
        "    entries: List[Entry] = client.list('s3://bucket/dir/')\n"
        "    return [e.name for e in entries if not e.is_dir]\n"
        "def keys(session: Session) -> List[ObjectInfo]:\n"
        "    url = parse_url('s3://bucket/dir')\n"
        "    return list(session.store(url).list(url))\n")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(snippet)],
                          capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, MYPYPATH=repo))
    assert done.returncode == 0, done.stdout + done.stderr


def test_ca_bundle_verifies_a_store_with_a_private_ca(minio_tls, tmp_path):
    """``Client(ca_bundle=...)``: the only way to a private CA's store short of turning TLS
    verification off (which the Client never does); an unreadable bundle fails when the Client
    is made, naming it, before any connection."""
    keys = {"access_key": minio_tls.access_key, "secret_key": minio_tls.secret_key, "env": {}}
    name = f"s3://c-{uuid.uuid4().hex[:12]}"
    with Client(endpoint=minio_tls.endpoint, ca_bundle=str(minio_tls.ca_file), **keys) as client:
        client.mkdir(name)
        client.write_bytes(f"{name}/a.txt", b"private")
        assert client.read_bytes(f"{name}/a.txt") == b"private"
    with Client(endpoint=minio_tls.endpoint, **keys) as client:  # the system's CAs do not know it
        with pytest.raises(RemoteError, match="TLS certificate verification failed"):
            client.read_bytes(f"{name}/a.txt")
    bad = tmp_path / "not-a-ca.pem"
    bad.write_text("not a certificate\n")
    with TcpProxy((minio_tls.host, minio_tls.port)) as proxy:
        with pytest.raises(ConfigError, match=f"^config {bad}: ca_bundle={bad}: cannot load CA certificates"):
            Client(endpoint=proxy.url("https"), ca_bundle=str(bad), **keys)
        assert proxy.connections == 0


def test_closing_a_client_does_not_settle_the_node_cache_its_runs_settled(minio, tmp_path):
    """Client.close() closed the node cache after the engine's runs had closed it: one more
    read of stats.json for nothing. The runs settle the counters; close() reads nothing."""
    with Client(endpoint=minio.endpoint, access_key=minio.access_key, secret_key=minio.secret_key,
                env={}, cache_dir=str(tmp_path / "cache")) as made:
        where = f"s3://c-{uuid.uuid4().hex[:12]}"
        made.mkdir(where)
        made.write_bytes(f"{where}/in.dat", b"cached input")
        assert made.read_bytes(f"{where}/in.dat") == b"cached input"  # the miss that fills the entry
        stats = next((tmp_path / "cache").rglob("stats.json"))
        fd, opens = stats_opens(stats.parent)
        try:
            assert made.read_bytes(f"{where}/in.dat") == b"cached input"
            assert opens() >= 1  # the hit's run updated the counters
            made.close()
            assert opens() == 0
        finally:
            os.close(fd)


# What an engine's worker process pays to start the plain API, beyond the interpreter's own
# start-up: none of these (the standard library's heavy modules, and the node cache unasked).
_NOT_AT_START = ("dataclasses", "inspect", "typing", "tempfile", "shutil", "random", "transfer.cache.store",
                 "transfer.bundles.staging")


def test_a_client_and_its_batch_passes_start_without_the_heavy_modules() -> None:
    code = ("import sys; before = set(sys.modules); from transfer.client import Client; "
            "c = Client(endpoint_url='http://127.0.0.1:9', key='k', secret='s'); "
            "import transfer.batched, transfer.backends._s3_pipelined, transfer.http.pipeline, transfer.writes; "
            "c.close(); print(' '.join(sorted(set(sys.modules) - before)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "transfer.client" in loaded
    assert [name for name in _NOT_AT_START if name in loaded] == []
