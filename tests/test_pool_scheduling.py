"""Cache-aware scheduling on a real negotiator (issue #20, item 4).

Two startds (``node1``, ``node2``) with their own caches, owned by the submitter and private
(0700), each filled by a job on its node downloading a file with the drop-in. Root writes each node's summary file (``cache-summary --write``, what the documented
systemd timer runs); each startd's cron runs ``cache-summary --read`` as HTCondor's own user
``condor`` and its machine ads carry the summary. Jobs get the rank `add_cache_rank`
generates from their inputs, and the negotiator sends each to the node holding its input.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
from pathlib import Path
from typing import Dict, Iterator

import pytest

from fixtures_pool import install_in_root
from pegasus_cloudio.p2p.summary import ATTRIBUTE, add_cache_rank, short_id
from pegasus_cloudio_testbed.condor_pool import CondorPool
from transfer import Session, parse_url

SUMMARY_DIR = "/var/lib/pegasus-cloudio"
HOLDER = {"a.dat": "node1", "b.dat": "node2"}
SIZE = 2_000_000
ENV = {"AWS_EC2_METADATA_DISABLED": "true", "PEGASUS_CLOUDIO_CONFIG": os.devnull}

CRON = """\
# where each node's jobs keep their cache (a job reads it as $$(PegasusCloudioCacheDir))
NODE1.PegasusCloudioCacheDir = "{caches}/node1"
NODE2.PegasusCloudioCacheDir = "{caches}/node2"
STARTD_ATTRS = $(STARTD_ATTRS) PegasusCloudioCacheDir
STARTD_CRON_JOBLIST = $(STARTD_CRON_JOBLIST) PCIOCACHE
STARTD_CRON_PCIOCACHE_EXECUTABLE = {bin}/pegasus-cloudio
STARTD_CRON_PCIOCACHE_PERIOD = 2s
STARTD_CRON_PCIOCACHE_MODE = Periodic
NODE1.STARTD_CRON_PCIOCACHE_ARGS = cache-summary --read {dir}/node1.ad
NODE2.STARTD_CRON_PCIOCACHE_ARGS = cache-summary --read {dir}/node2.ad
# every job is matched by the negotiator (no claim reuse by the schedd)
CLAIM_WORKLIFE = 0
"""

FILL = """\
universe = vanilla
executable = {bin}/pegasus-cloudio-transfer
arguments = -f spec.json
transfer_executable = false
should_transfer_files = NO
requirements = regexp("@{node}@", TARGET.Name) && isString(TARGET.PegasusCloudioCacheDir)
environment = "PEGASUS_CLOUDIO_CACHE_DIR=$$(PegasusCloudioCacheDir) PEGASUS_CLOUDIO_CONFIG=/dev/null"
output = job.out
error = job.err
log = job.log
queue
"""


class _Files(http.server.BaseHTTPRequestHandler):
    data = {f"/run/{lfn}": bytes([i]) * SIZE for i, lfn in enumerate(HOLDER)}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = self.data.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:  # noqa: N802
        body = self.data.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _key(url: str) -> str:
    from transfer.backends.base import CacheKeys
    with Session(env=ENV) as session:
        backend = session.backend(parse_url(url))
        assert isinstance(backend, CacheKeys)
        return backend.cache_key(parse_url(url))


@pytest.fixture(scope="module")
def ranked_pool(our_wheel: Path) -> Iterator[CondorPool]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    pool = CondorPool()
    pool.start()
    try:
        bin_dir = install_in_root(pool, our_wheel, pool.shared / "venv")
        caches = pool.user_dir("caches")
        pool.add_config("pcio-cache.conf", CRON.format(bin=bin_dir, dir=SUMMARY_DIR, caches=caches))
        pool.bin_dir = bin_dir  # type: ignore[attr-defined]
        pool.urls = {lfn: f"http://127.0.0.1:{server.server_address[1]}/run/{lfn}"  # type: ignore[attr-defined]
                     for lfn in HOLDER}
        pool.caches = _fill_caches(pool, bin_dir, caches)  # type: ignore[attr-defined]
        yield pool
    finally:
        pool.stop()
        server.shutdown()


def _fill_caches(pool: CondorPool, bin_dir: Path, home: Path) -> Dict[str, Path]:
    """Each node's cache gets its file the way workers fill caches: a job on that node
    downloads it with the drop-in, its cache on."""
    caches = {}
    for lfn, node in HOLDER.items():
        work = pool.user_dir(f"fill-{node}")
        (work / "spec.json").write_text(json.dumps([{
            "type": "transfer", "src_urls": [{"site_label": "web", "url": pool.urls[lfn]}],  # type: ignore[attr-defined]
            "dest_urls": [{"site_label": "local", "url": f"file://{work}/{lfn}"}]}]))
        ad = pool.wait_done(pool.submit(FILL.format(bin=bin_dir, node=node), cwd=work))
        assert ad["ExitCode"] == "0", (work / "job.err").read_text()[-2000:]
        assert f"@{node}@" in ad["LastRemoteHost"]
        cache = home / node
        assert cache.stat().st_mode & 0o777 == 0o700 and cache.stat().st_uid == pool.submitter_uid
        caches[node] = cache
    return caches


def _machine_summaries(pool: CondorPool) -> Dict[str, str]:
    out = pool.run(["condor_status", "-af:,", "Name", ATTRIBUTE]).stdout
    return {name: value for name, value in (line.split(",", 1) for line in out.splitlines())}


def test_condor_cannot_read_private_caches_and_says_so_in_one_line(ranked_pool: CondorPool) -> None:
    bin_dir = ranked_pool.bin_dir  # type: ignore[attr-defined]
    caches = ranked_pool.caches  # type: ignore[attr-defined]
    done = ranked_pool.run([str(bin_dir / "pegasus-cloudio"), "cache-summary"], user="condor", check=False,
                           env={"PEGASUS_CLOUDIO_P2P_USERS": f"cloudio={caches['node1']}",
                                "PEGASUS_CLOUDIO_P2P_NODE": "node1"})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert f"cannot read cache {caches['node1']}" in done.stderr
    assert f'{ATTRIBUTE} = ""' in done.stdout


def test_the_negotiator_sends_each_job_to_the_node_caching_its_input(ranked_pool: CondorPool) -> None:
    from Pegasus.api import File, Job, Workflow

    pool = ranked_pool
    bin_dir = pool.bin_dir  # type: ignore[attr-defined]
    caches = pool.caches  # type: ignore[attr-defined]
    pool.run(["mkdir", "-p", "-m", "0755", SUMMARY_DIR], user="root")
    for node, cache in caches.items():     # what the root timer runs on each node
        pool.run([str(bin_dir / "pegasus-cloudio"), "cache-summary", "--write", f"{SUMMARY_DIR}/{node}.ad"],
                 user="root", env={"PEGASUS_CLOUDIO_P2P_USERS": f"cloudio={cache}",
                                   "PEGASUS_CLOUDIO_P2P_NODE": node})
    urls = pool.urls  # type: ignore[attr-defined]
    want = {node: short_id(_key(urls[lfn])) for lfn, node in HOLDER.items()}
    _wait_for_summaries(pool, want)

    wf = Workflow("ranked")
    jobs = {lfn: [Job("reader", _id=f"{lfn}-{i}").add_inputs(File(lfn, size=2_000_000)) for i in range(2)]
            for lfn in urls}
    wf.add_jobs(*[j for js in jobs.values() for j in js])
    assert add_cache_rank(wf, urls, env=ENV) == 4
    work = pool.user_dir("ranked")
    clusters = {lfn: [pool.submit(_submit(job.profiles["condor"]["rank"]), cwd=work) for job in js]
                for lfn, js in jobs.items()}
    for lfn, ids in clusters.items():
        for cluster in ids:
            ad = pool.wait_done(cluster)
            assert f"@{HOLDER[lfn]}@" in ad["LastRemoteHost"], (lfn, ad["LastRemoteHost"])


def _submit(rank: str) -> str:
    return ("universe = vanilla\nexecutable = /bin/true\ntransfer_executable = false\n"
            f"should_transfer_files = YES\nlog = job.log\nrank = {rank}\nqueue\n")


def _wait_for_summaries(pool: CondorPool, want: Dict[str, str], timeout: float = 120.0) -> None:
    import time
    deadline = time.monotonic() + timeout
    seen: Dict[str, str] = {}
    while time.monotonic() < deadline:
        seen = _machine_summaries(pool)
        if all(want[name.split("@")[1]] in value for name, value in seen.items()) and len(seen) == 4:
            return
        time.sleep(0.5)
    raise AssertionError(f"machine ads never carried the summaries {want}: {seen}\n"
                         f"{(pool.log_dir / 'StartLog.node1').read_text()[-3000:]}")
