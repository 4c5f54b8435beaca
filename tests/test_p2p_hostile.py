"""Hostile peers against the peer client (``docs/security.md``, "A job slot" and "The network"):
a peer that trickles its body, and a peer that stalls for every file of a batch.

A user who can write the replica index can point a node's URL anywhere in the pool's networks,
and a peer may be slow on its own: either way it must cost a job a bounded time, after which
the job reads the store (``docs/p2p.md``: "a slow peer falls back to the store").
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from typing import Dict, List

import pytest

from transfer.p2p.client import PeerClient
from transfer.peers import Replica
from p2p_support import SCOPE, MemorySink, client_config, holder


class FakePeer:
    """A listener on loopback whose ``_run`` (a thread) plays a hostile peer."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.accepted: List[socket.socket] = []
        threading.Thread(target=self._run, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def _run(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.listener.close()
        for conn in self.accepted:
            conn.close()


class Trickler(FakePeer):
    """A plain HTTP peer answering with ``response``: its first ``prompt`` bytes at once, then
    one byte every ``gap`` seconds (each well inside the client's timeouts); ``sent`` counts
    the bytes sent."""

    def __init__(self, response: bytes, prompt: int, gap: float) -> None:
        self.response, self.prompt, self.gap, self.sent = response, prompt, gap, 0
        super().__init__()

    def _run(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.recv(65536)
            try:
                conn.sendall(self.response[:self.prompt])
                self.sent = self.prompt
                while self.sent < len(self.response):
                    conn.sendall(self.response[self.sent:self.sent + 1])
                    self.sent += 1
                    time.sleep(self.gap)
            except OSError:
                pass


BODY = b"t" * 200
HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 200\r\n\r\n"
PADDED = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * 200 + b"\r\nContent-Length: 200\r\n\r\n"


@pytest.mark.parametrize("response, prompt", [(HEAD + BODY, len(HEAD)), (PADDED + BODY, 0)],
                         ids=["body", "headers"])
def test_a_trickling_peer_is_given_up_and_the_store_is_read(response, prompt):
    peer = Trickler(response, prompt, gap=0.05)  # 10 s at one byte per 50 ms
    try:
        r = Replica("k", len(BODY), hashlib.sha256(BODY).hexdigest())
        client = PeerClient(client_config(first_byte_timeout=1.0, read_timeout=1.0))
        sink = MemorySink()
        report = client.fetch("k", [holder("x", f"http://127.0.0.1:{peer.port}/v1/alice", r)], sink, SCOPE)
        client.close()
        assert report.size is None and sink.data == b""
        assert "too slow" in report.failures[0]
        assert peer.sent < len(response)  # given up before the trickle ended, not at its end
    finally:
        peer.close()


class Staller(FakePeer):
    """A peer that accepts connections and never answers; counts them."""

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted.append(conn)


def test_a_stalling_peer_costs_one_timeout_per_job_not_one_per_file():
    peer = Staller()
    try:
        client = PeerClient(client_config(first_byte_timeout=0.2))
        url = f"http://127.0.0.1:{peer.port}/v1/alice"
        failures = []
        for i in range(6):
            r = Replica(f"k{i}", 4, "00" * 32)
            report = client.fetch(r.key, [holder("x", url, r)], MemorySink(), SCOPE)
            assert report.size is None
            failures += report.failures
        client.close()
        assert len(peer.accepted) == 1, f"the stalled peer was asked {len(peer.accepted)} times"
        assert "timed out" in failures[0] and all("failed recently" in f for f in failures[1:])
    finally:
        peer.close()


def test_claims_planted_in_the_index_cost_one_wait_per_job_not_one_per_file(tmp_path):
    """Anyone who can write Redis can plant a claim (with no expiry, naming a live node) on
    every key a reader will claim (claim names follow from entry names): the reader then
    waits ``claim_seconds`` for a replica that never comes. It does so once, not per file."""
    import redis
    from pegasus_cloudio_testbed.redis import RedisServer
    from transfer.p2p import describer
    from transfer.p2p.index import NodeInfo, PeerIndex
    from transfer.p2p.source import PeerIndexSource
    from p2p_support import new_cache
    with RedisServer() as server:
        index = PeerIndex(redis.Redis.from_url(server.url), "t")
        index.heartbeat([NodeInfo("b/alice", "https://127.0.0.1:1/v1/alice", "b")], 60)
        keys = {f"k{i}": SCOPE for i in range(4)}
        for key in keys:
            index._redis.set(index.claim_key(key, SCOPE), "b/alice")
        cache = new_cache(tmp_path / "c")
        warnings: List[str] = []
        source = PeerIndexSource(index, PeerClient(client_config()), "a/alice", claim_seconds=0.3,
                                 describe=describer(cache), grant=cache.grant, warn=warnings.append)
        source.lookup(keys)
        assert all(source.holds(k) for k in keys)  # in flight on b, as far as the index says
        assert [source.fetch(k, MemorySink()) for k in keys] == [None] * 4
        source.close()
        assert source.counters["claims_waited"] == 1
        assert any("claim" in w for w in warnings)


def test_a_redis_password_is_never_put_in_a_jobs_environment():
    """``sites --p2p URL`` puts the URL in the compute site's job environment, which every
    pool user can read (``condor_q -l``): a URL carrying Redis's password is refused, with a
    message that does not repeat it."""
    from pegasus_cloudio.sites.options import SetOptions, problems
    opts = SetOptions(mode="cloud-storage", work_dir="/w", install_bin="/b", provider="s3", bucket="bkt",
                      p2p_redis="rediss://:s3cret-pw@10.0.0.5:6379/0")
    found = [p for p in problems(opts) if p.startswith("--p2p ")]
    assert len(found) == 1 and "password" in found[0] and "s3cret-pw" not in found[0]
    assert not [p for p in problems(SetOptions(mode="cloud-storage", work_dir="/w", install_bin="/b", provider="s3",
                                               bucket="bkt", p2p_redis="redis://10.0.0.5:6379/0"))
                if p.startswith("--p2p ")]


class Collector(FakePeer):
    """A fake peer (Mallory's listener): records the first request's headers, answers 503."""

    def __init__(self) -> None:
        self.headers: Dict[str, str] = {}
        super().__init__()

    def _run(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            for line in data.split(b"\r\n\r\n")[0].decode().split("\r\n")[1:]:
                name, _, value = line.partition(":")
                self.headers[name.strip()] = value.strip()
            conn.sendall(b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def test_plain_http_a_proof_collected_by_a_fake_peer_is_refused_by_the_real_daemon(tmp_path):
    """P2P_PLAIN_HTTP: any job can point alice's node URL in the index at a listener of its
    own; alice's client sends it the token and a proof for her entry, and the listener replays
    them to alice's daemon. No sniffing needed, so a plain proof is bound to the address the
    reader dialled: the replay gets 404, and alice's own reads still work."""
    import http.client
    from transfer.cache.layout import digest_of
    from p2p_support import fetch, new_cache, put, serve, url_of
    secret = b"alice's private bytes"
    cache = new_cache(tmp_path / "a")
    r = put(cache, "s3://b/secret", secret)
    with serve(tmp_path / "a") as server:
        mallory = Collector()
        report, _ = fetch(client_config(), r.key, [holder("n1/alice", f"http://127.0.0.1:{mallory.port}/v1/alice", r)])
        assert report.size is None and "X-Pcio-Proof" in mallory.headers
        mallory.close()
        conn = http.client.HTTPConnection(*server.address, timeout=5)
        conn.request("GET", f"/v1/alice/{digest_of(r.key)}", headers=mallory.headers)
        response = conn.getresponse()
        body = response.read()
        conn.close()
        assert response.status == 404 and secret not in body
        report, sink = fetch(client_config(), r.key, [holder("n1/alice", url_of(server, tls=False), r)])
        assert report.size == len(secret) and bytes(sink.data) == secret


def test_junk_in_every_entry_costs_a_job_one_warning_not_one_per_file(tmp_path):
    """docs/security.md: Alice's readers ignore values whose tag does not verify "with one
    warning". Anyone who can write Redis can put a junk field into every entry (they are
    all listed by SCAN): a job reading many files still prints one line."""
    import redis
    from pegasus_cloudio_testbed.redis import RedisServer
    from transfer.p2p.index import NodeInfo, PeerIndex
    from transfer.p2p.source import PeerIndexSource
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        index = PeerIndex(client, "t")
        index.heartbeat([NodeInfo("a/alice", "https://127.0.0.1:1/v1/alice", "a")], 60)
        keys = {f"k{i}": SCOPE for i in range(20)}
        index.register("a/alice", [Replica(k, 4, "ab" * 32, SCOPE) for k in keys])
        for name in client.scan_iter("t:*:r:*"):
            client.hset(name, mapping={"m/mallory": "junk", "a/alice-x": f"{'0' * 16} {'cd' * 32} {'0' * 32}"})
        warnings: List[str] = []
        source = PeerIndexSource(index, PeerClient(client_config()), "b/alice", warn=warnings.append)
        source.lookup(keys)
        source.close()
        assert all(source.holds(k) for k in keys)  # alice's real entries still count
        assert len(warnings) == 1, warnings[:3]
