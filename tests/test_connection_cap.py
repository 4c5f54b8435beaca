"""One cap on connections per endpoint for the whole process: however many threads (or
multipart part pools inside file tasks) send, at most ``max_open`` connections are in use."""

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pegasus_cloudio_testbed.proxy import TcpProxy
from pegasus_cloudio_testbed.scripted import Reply, ScriptedServer
from transfer import Session, Settings, parse_url
from transfer.engine import Engine
from transfer.errors import TransientError
from transfer.http.connection import Timeouts
from transfer.http.pool import ConnectionPool
from transfer.ops import Transfer


def test_many_threads_share_at_most_max_open_connections():
    busy = [0, 0]  # in flight now, most ever
    lock = threading.Lock()

    def slow(request):
        with lock:
            busy[0] += 1
            busy[1] = max(busy[1], busy[0])
        time.sleep(0.01)
        with lock:
            busy[0] -= 1
        return Reply(200, {}, b"ok")

    with ScriptedServer(slow) as server:
        pool = ConnectionPool(server.endpoint, max_idle=3, max_open=3)

        def one(_i):
            with pool.request("GET", "/") as response:
                return response.read()

        with ThreadPoolExecutor(20) as threads:
            assert set(threads.map(one, range(200))) == {b"ok"}
        assert server.connections <= 3 and busy[1] <= 3


def test_a_pool_that_stays_full_fails_after_the_read_timeout_instead_of_hanging():
    with ScriptedServer(lambda r: Reply(200, {"Content-Length": "100"}, b"x" * 100)) as server:
        pool = ConnectionPool(server.endpoint, max_idle=1, max_open=1, timeouts=Timeouts(1.0, 0.2))
        held = pool.request("GET", "/")  # body never read: the one connection stays taken
        with pytest.raises(TransientError, match="connections stayed busy"):
            pool.request("GET", "/")
        held.discard()
        with pool.request("GET", "/") as response:
            assert response.read() == b"x" * 100


def test_parallel_multipart_uploads_stay_within_threads_plus_two(minio, bucket, tmp_path):
    """Four large files, each split into parts by its own part pool, four threads: before the
    cap up to threads x threads connections could be open."""
    with TcpProxy((minio.host, minio.port)) as proxy:
        creds = minio.write_pegasus_credentials(tmp_path / "c.conf", endpoint=proxy.url())
        env = {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull}
        settings = Settings(threads=4, multipart_threshold=5 << 20, multipart_part_size=5 << 20)
        ops = []
        for number in range(4):
            path = tmp_path / f"big{number}"
            path.write_bytes(os.urandom(26 << 20))
            ops.append(Transfer((parse_url(str(path)),), parse_url(f"s3://test@minio/{bucket}/big{number}")))
        peak, done = [0], threading.Event()

        def watch():  # part threads alive at once: one shared pool, not one per upload
            while not done.is_set():
                peak[0] = max(peak[0], sum(t.name.startswith("part") for t in threading.enumerate()))
                time.sleep(0.002)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            with Session(settings, env) as session:
                results = Engine(session).run(ops)
        finally:
            done.set()
            watcher.join()
        assert all(r.ok for r in results), [r.error for r in results]
        assert proxy.connections <= settings.threads + 2
        assert 1 <= peak[0] <= settings.threads
