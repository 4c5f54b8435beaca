"""The plugin through the real ``condor_starter``, on two pools (tests/fixtures_pool.py): HTCondor
23.9 from Debian 13 (id ``23.9``) and 25.x from Debian testing (id ``25.x``); every test runs on both.

Installed as docs/condor.md says, on the execute host (the pool's root, Python 3.13): a venv
with the system site packages (Debian's python3-htcondor gives ``classad2``), the wheel
built from this checkout, a link ``/usr/libexec/condor/cloudio_plugin``, listed last in
``FILETRANSFER_PLUGINS``; ``SIGN_S3_URLS = false`` (mode B), so ``s3://USER@SITE/...`` URLs
reach the plugin as written. MinIO runs on the host's loopback behind a counting proxy;
credentials travel with each job (``credentials.conf``, mode 0600) and are named by the
job's ``CLOUDIO_PEGASUS_CREDENTIALS``, which a 23.9 starter does not pass to plugins: the
plugin reads it from the job ad. The 23.9 starter speaks protocol 2 to the plugin (it knows no
other multi-file version), a 25.6+ starter the plugin's ``ProtocolVersion = 4``: the starters log
at ``D_FULLDEBUG`` and the protocol test reads the plugin's input from the StarterLog. Every wait
is on a condition with a bound.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Sequence, Tuple

import boto3
import pytest

from pegasus_cloudio.condor.ads import split_ads
from pegasus_cloudio_testbed.condor_pool import CondorPool
from pegasus_cloudio_testbed.condor_root import SUITE, TESTING_SUITE
from pegasus_cloudio_testbed.proxy import Fault, TcpProxy

PLUGIN = "/usr/libexec/condor/cloudio_plugin"
VENV = "/opt/pegasus-cloudio"
THREADS = 4
PLUGIN_CONFIG = f"""\
FILETRANSFER_PLUGINS = $(FILETRANSFER_PLUGINS), {PLUGIN}
SIGN_S3_URLS = false
# the plugin's stderr on failure lands here, for the tests' diagnostics
LOG_FILETRANSFER_PLUGIN_STDOUT_ON_FAILURE = D_ALWAYS
# the plugin's command line and (25.x) its input file, for the protocol test
STARTER_DEBUG = D_FULLDEBUG
"""
# (suite, the HTCondor series its root must run) and the multi-file protocol its starter must speak
POOLS = [pytest.param((SUITE, (23, 9)), id="23.9"), pytest.param((TESTING_SUITE, (25,)), id="25.x")]
PROTOCOL = {SUITE: 2, TESTING_SUITE: 4}
STARTD_HOME = 'STARTD_EXEC1_ENVIRONMENT = "HOME=/root"\n'
JOB = """\
#!/bin/sh
ls -a > listing.txt
sha256sum *.dat > sums.txt 2>/dev/null || true
echo "summary of $(ls *.dat 2>/dev/null | wc -l) inputs" > summary.txt
head -c 70000 /dev/urandom > result.dat
"""


def wait_for(condition: Callable[[], object], what: str, limit: float = 180.0,
             diagnose: Callable[[], str] = lambda: "") -> object:
    deadline = time.monotonic() + limit
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {limit:.0f} s waiting for {what}\n{diagnose()}")
        time.sleep(0.5)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", params=POOLS)
def plugin_pool(request: pytest.FixtureRequest, our_wheel: Path) -> Iterator[CondorPool]:
    """A pool of its own (one startd, two slots) on the parameter's root, with the plugin
    installed from our wheel (tests/fixtures_pool.py)."""
    suite, series = request.param
    wheel = our_wheel
    # HOME=/root, as a master started from a root shell hands it down: the job's user cannot
    # read /root/.pegasus/cloudio.conf, and that default file must not stop any transfer.
    with CondorPool(startds=("exec1",), slots=2, binds=[wheel.parent], config=STARTD_HOME, suite=suite) as pool:
        assert pool.version[:len(series)] == series, f"the {suite} root runs HTCondor {pool.version}"
        assert "HOME=/root" in _startd_environment(pool), "the startd runs without HOME=/root"
        pool.run(["python3", "-m", "venv", "--system-site-packages", VENV], user="root")
        pool.run([f"{VENV}/bin/pip", "install", "--quiet", "--no-index", "--no-deps", str(wheel)], user="root")
        pool.run(["ln", "-s", f"{VENV}/bin/pegasus-cloudio-condor-plugin", PLUGIN], user="root")
        pool.add_config("cloudio-plugin.conf", PLUGIN_CONFIG)  # a reconfig: the startd asks the plugins again
        wait_for(lambda: _advertised(pool), "the startd to advertise the plugin (PegasusCloudioPluginVersion)",
                 120, lambda: _log_tail(pool, "StartLog.exec1", "FILETRANSFER|plugin"))
        yield pool


def _startd_environment(pool: CondorPool) -> List[str]:
    namespace = os.readlink(f"/proc/{pool.master_pid}/ns/mnt")
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if (b"condor_startd" in Path(f"/proc/{pid}/cmdline").read_bytes()
                    and os.readlink(f"/proc/{pid}/ns/mnt") == namespace):
                return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
    return []


def _advertised(pool: CondorPool) -> bool:
    out = pool.run(["condor_status", "-af", "PegasusCloudioPluginVersion"], check=False).stdout.split()
    return bool(out) and all(v != "undefined" for v in out)


def _log_tail(pool: CondorPool, name: str, pattern: str) -> str:
    try:
        lines = (pool.log_dir / name).read_text(errors="replace").splitlines()
    except OSError as err:
        return f"{name}: {err}"
    return "\n".join([line for line in lines if re.search(pattern, line)][-20:])


@pytest.fixture
def store(minio, bucket) -> Iterator["Store"]:
    with TcpProxy((minio.host, minio.port)) as proxy:
        yield Store(minio, bucket, proxy)


class Store:
    """MinIO behind a counting proxy; Pegasus-style URLs ``s3://test@minio/<bucket>/<key>``."""

    def __init__(self, minio, bucket: str, proxy: TcpProxy) -> None:
        self.minio, self.bucket, self.proxy = minio, bucket, proxy
        self.client = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                                   aws_secret_access_key=minio.secret_key, region_name="us-east-1")

    def url(self, key: str) -> str:
        return f"s3://test@minio/{self.bucket}/{key}"

    def put(self, objects: Dict[str, bytes]) -> None:
        for key, data in objects.items():
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def credentials(self, secret: str = "") -> str:
        return (f"[minio]\nendpoint = {self.proxy.url()}\n[test@minio]\naccess_key = {self.minio.access_key}\n"
                f"secret_key = {secret or self.minio.secret_key}\n")


def job_dir(pool: CondorPool, name: str, store: Store, *, secret: str = "") -> Path:
    """A submit directory owned by the submitter: job.sh and a 0600 credentials.conf."""
    work = pool.user_dir(name)
    (work / "job.sh").write_text(JOB)
    (work / "job.sh").chmod(0o755)
    (work / "credentials.conf").write_text(store.credentials(secret))
    (work / "credentials.conf").chmod(0o600)
    for path in work.iterdir():
        os.chown(path, pool.submitter_uid, pool.submitter_gid)
    return work


def submit_text(inputs: Sequence[str], *, outputs: str = "sums.txt, listing.txt", extra: str = "") -> str:
    listed = ", ".join(["credentials.conf", *inputs])
    return f"""\
executable = job.sh
transfer_input_files = {listed}
environment = "CLOUDIO_PEGASUS_CREDENTIALS=credentials.conf CLOUDIO_PEGASUS_CLOUDIO_THREADS={THREADS}"
should_transfer_files = YES
when_to_transfer_output = ON_EXIT
transfer_output_files = {outputs}
output = job.out
error = job.err
log = job.log
{extra}
queue
"""


def job_ad(pool: CondorPool, cluster: int) -> Dict[str, str]:
    """The job's ad from the queue, or from the history once it left."""
    done = pool.run(["condor_q", f"{cluster}.0", "-l"], check=False)
    if not done.stdout.strip():
        return pool.history(cluster)
    return {k: v for k, _, v in (line.partition(" = ") for line in done.stdout.splitlines()) if v}


def wait_held(pool: CondorPool, cluster: int, limit: float = 180.0) -> Dict[str, str]:
    def held() -> Dict[str, str]:
        ad = job_ad(pool, cluster)
        assert ad.get("JobStatus") != "4", f"job {cluster} completed: expected a hold"
        return ad if ad.get("JobStatus") == "5" else {}
    found = wait_for(held, f"job {cluster} to be held", limit)
    assert isinstance(found, dict)
    return found


def unquote(value: str) -> str:
    return value[1:-1] if value.startswith('"') else value


def plugin_processes() -> List[int]:
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if PLUGIN.encode() in cmdline:
            found.append(int(pid))
    return found


# --------------------------------------------------------------------------- tests


def test_the_starter_accepts_the_query_and_advertises_the_methods(plugin_pool: CondorPool) -> None:
    out = plugin_pool.run(["condor_status", "-af", "HasFileTransferPluginMethods",
                           "PegasusCloudioPluginVersion"]).stdout.splitlines()
    assert out, "no slots"
    for line in out:
        methods, version = line.rsplit(" ", 1)
        assert {"s3", "http", "https"} <= set(re.split(r"[,\s]+", methods)), line
        assert version not in ("", "undefined"), line


def starter_log_lines(pool: CondorPool, marker: str) -> List[str]:
    """The text after ``marker`` on every line of every StarterLog that holds it."""
    found = []
    for path in sorted(pool.log_dir.glob("StarterLog*")):
        for line in path.read_text(errors="replace").splitlines():
            if marker in line:
                found.append(line.split(marker, 1)[1])
    return found


def protocol_of(plugin_input: str) -> int:
    """The multi-file protocol of a plugin input that carries the job's ``PluginData``: 4 when
    it travels in a non-file ad ahead of the file ads, 2 when it is copied into every file ad."""
    ads = split_ads(plugin_input)
    files = [ad for ad in ads if re.search(r"\bUrl\s*=", ad, re.I)]
    others = [ad for ad in ads if ad not in files]
    if others and re.search(r"\bPluginData\s*=", others[0]) and not any("PluginData" in ad for ad in files):
        return 4
    if files and all("PluginData" in ad for ad in files):
        return 2
    raise AssertionError(f"no PluginData where protocol 2 or 4 puts it: {plugin_input[:600]}")


def test_the_starter_speaks_the_newest_protocol_it_knows(plugin_pool: CondorPool, store: Store) -> None:
    """The plugin answers ``ProtocolVersion = 4``; a 25.6+ starter then sends a job's
    ``PluginData`` as a non-file ad (logged at D_FULLDEBUG as "with plugin input"), which the
    plugin skips. A 23.9 starter knows only protocol 2: it runs the plugin with ``-infile``
    and neither logs the input nor sends ``PluginData``. The file arrives either way."""
    store.put({"probe/p.dat": b"protocol probe"})
    work = job_dir(plugin_pool, "protocol", store)
    url = store.url("probe/p.dat")
    probe = 'My.PluginData = [ probe = "cloudio-protocol-probe" ]'
    cluster = plugin_pool.submit(submit_text([url], extra=probe), cwd=work)
    assert plugin_pool.wait_done(cluster)["ExitCode"] == "0"
    assert "p.dat" in (work / "listing.txt").read_text()
    invoked = [line for line in starter_log_lines(plugin_pool, "FILETRANSFER: invoking: ") if PLUGIN in line]
    assert any("-infile" in line and "-upload" not in line for line in invoked), invoked[-3:]
    inputs = [text for text in starter_log_lines(plugin_pool, "FILETRANSFER: with plugin input: ") if url in text]
    if PROTOCOL[plugin_pool.suite] == 2:
        assert not inputs and plugin_pool.version < (25, 6, 1), (plugin_pool.version, inputs[-1:])
        return
    assert len(inputs) == 1, inputs
    assert "cloudio-protocol-probe" in inputs[0], inputs[0][:600]
    assert protocol_of(inputs[0]) == 4, inputs[0][:600]


def test_two_hundred_inputs_arrive_byte_exact_on_few_connections(plugin_pool: CondorPool, store: Store) -> None:
    objects = {f"inputs/f{n:03d}.dat": os.urandom(1000 + 37 * n) for n in range(210)}
    store.put(objects)
    work = job_dir(plugin_pool, "two-hundred", store)
    store.proxy.reset_counters()
    cluster = plugin_pool.submit(submit_text([store.url(k) for k in objects]), cwd=work)
    ad = plugin_pool.wait_done(cluster)
    assert ad["ExitCode"] == "0"
    sums = {name: digest for digest, name in (line.split() for line in (work / "sums.txt").read_text().splitlines())}
    assert len(sums) == len(objects)
    for key, data in objects.items():
        assert sums[os.path.basename(key)] == hashlib.sha256(data).hexdigest(), key
    assert store.proxy.requests_by_method.get("GET", 0) == len(objects)
    assert store.proxy.connections <= THREADS + 2, store.proxy.connections
    assert "credentials.conf" in (work / "listing.txt").read_text()


def test_a_missing_object_holds_the_job_naming_the_url(plugin_pool: CondorPool, store: Store) -> None:
    store.put({"present.dat": b"here"})
    work = job_dir(plugin_pool, "missing", store)
    missing = store.url("absent/nothing.dat")
    cluster = plugin_pool.submit(submit_text([store.url("present.dat"), missing]), cwd=work)
    ad = wait_held(plugin_pool, cluster)
    plugin_pool.run(["condor_rm", str(cluster)])
    reason = unquote(ad["HoldReason"])
    assert missing in reason and "does not exist" in reason, reason
    assert ad["HoldReasonCode"] == "13" and ad["HoldReasonSubCode"] == str(1 << 8), ad


def test_outputs_go_to_output_destination_and_remaps(plugin_pool: CondorPool, store: Store) -> None:
    work = job_dir(plugin_pool, "outputs", store)
    cluster = plugin_pool.submit(submit_text([], outputs="result.dat, summary.txt",
                                             extra=f"output_destination = {store.url('results/')}"), cwd=work)
    assert plugin_pool.wait_done(cluster)["ExitCode"] == "0"
    assert len(store.get("results/result.dat")) == 70000
    assert store.get("results/summary.txt") == b"summary of 0 inputs\n"
    assert not (work / "result.dat").exists()

    work = job_dir(plugin_pool, "remaps", store)
    remap = f'transfer_output_remaps = "result.dat = {store.url("remapped/r.dat")}"'
    cluster = plugin_pool.submit(submit_text([], outputs="result.dat, summary.txt", extra=remap), cwd=work)
    assert plugin_pool.wait_done(cluster)["ExitCode"] == "0"
    assert len(store.get("remapped/r.dat")) == 70000 and not (work / "result.dat").exists()
    assert (work / "summary.txt").read_text() == "summary of 0 inputs\n"


def test_a_job_removed_mid_transfer_leaves_no_plugin_and_no_partial_file(plugin_pool: CondorPool,
                                                                         store: Store) -> None:
    store.put({"big/slow.dat": os.urandom(3 << 20), "big/quick.dat": b"q"})
    # two hits: the pipelined pass's GET, which drops an answer over 1 MiB after its head, then
    # the per-file GET that stalls the plugin mid-transfer
    store.proxy.set_faults([Fault.stall(120, after_bytes=200_000, method="GET", path="slow.dat", times=2)])
    work = job_dir(plugin_pool, "removed", store)
    cluster = plugin_pool.submit(submit_text([store.url("big/slow.dat"), store.url("big/quick.dat")]), cwd=work)
    wait_for(lambda: store.proxy.pending_faults() == 0, "the plugin to be stalled in slow.dat")
    assert plugin_processes(), "no plugin process while a transfer is stalled"
    plugin_pool.run(["condor_rm", str(cluster)])
    wait_for(lambda: not plugin_pool.run(["condor_q", str(cluster), "-af", "ClusterId"]).stdout.strip(),
             "the job to leave the queue", 120)
    wait_for(lambda: not plugin_processes(), "every plugin process to end", 60)

    def leftovers() -> str:  # the sandbox, with any temporary or partial download in it
        return plugin_pool.run(["find", "/var/lib/condor/execute-exec1", "-mindepth", "1"], user="root").stdout

    wait_for(lambda: not leftovers().strip(), "the execute directory to be empty", 60, leftovers)


def test_one_missing_input_among_many_holds_the_job_on_its_first_run(plugin_pool: CondorPool, store: Store) -> None:
    """A 23.9 starter reads one pipe message after a failed transfer, and every result ad is one:
    with 120 success ads ahead of the final status it lost the hold reason and requeued the job,
    which then ran again (and failed the same way). The plugin now leaves it one ad."""
    present = {f"mixed/f{n:03d}.dat": b"m" * n for n in range(120)}
    store.put(present)
    missing = store.url("mixed/zzz-absent.dat")
    work = job_dir(plugin_pool, "mixed", store)
    store.proxy.reset_counters()
    cluster = plugin_pool.submit(submit_text([store.url(k) for k in present] + [missing]), cwd=work)
    ad = wait_held(plugin_pool, cluster)
    plugin_pool.run(["condor_rm", str(cluster)])
    assert ad["HoldReasonCode"] == "13" and ad.get("NumHolds") == "1", ad
    assert ad.get("NumShadowStarts") == "1", (ad.get("NumShadowStarts"), store.proxy.requests)
    # one run: a GET per input in the pipelined pass, after its 404 one look for a bundle
    # holding the file, and the per-file path's own GET of the missing file (which makes the error)
    assert store.proxy.requests_by_method.get("GET", 0) == len(present) + 3, store.proxy.requests_by_method
    reason = unquote(ad["HoldReason"])
    assert missing in reason and "does not exist" in reason, reason


def test_two_hundred_failures_hold_the_job_once_with_a_short_reason(plugin_pool: CondorPool, store: Store) -> None:
    """23.9 restarted such a job when the joined error texts were long (~90 KB), and when the
    plugin wrote several failed ads (see the test above)."""
    keys = [f"denied/f{n:03d}.dat" for n in range(200)]
    store.put({keys[0]: b"x"})
    work = job_dir(plugin_pool, "denied", store, secret="wrong-secret-key-0123456789")
    cluster = plugin_pool.submit(submit_text([store.url(k) for k in keys]), cwd=work)
    ad = wait_held(plugin_pool, cluster)
    plugin_pool.run(["condor_rm", str(cluster)])
    reason = unquote(ad["HoldReason"])
    assert ad["HoldReasonCode"] == "13" and ad.get("NumHolds") == "1", ad
    assert ad.get("NumShadowStarts") == "1", ad.get("NumShadowStarts")
    # the plugin ran once (every 403 is final: one request per file on the per-file path, after
    # the pipelined pass gave up at its first 403 with at most one GET in flight per connection),
    # and the starter read its report
    assert len(keys) < store.proxy.requests <= len(keys) + THREADS + 2, (store.proxy.requests, ad.get("NumShadowStarts"))
    assert "Failed to read status report" not in (plugin_pool.log_dir / "ShadowLog").read_text(errors="replace")
    assert len(reason) < 16384, len(reason)
    first = reason[reason.find("Download of "):]   # 23.9: after "|Error: "; 25.x: after "Details: "
    assert first.startswith(f"Download of {store.url(keys[0])} failed: access denied"), first[:400]
    assert "the first of 200 failed files, out of 200" in first
    assert "wrong-secret" not in reason


def test_a_store_that_throttles_to_the_end_holds_the_job_as_retryable(plugin_pool: CondorPool, store: Store) -> None:
    """Issue 37 item 5: every request answered 503 SlowDown until the plugin's time bound for
    throttling (PEGASUS_CLOUDIO_THROTTLE_TIMEOUT, 2 s here) runs out;
    the starter holds the job with the subcode the release policy of docs/condor.md retries
    (11 << 8), and the reason says the store throttled it."""
    store.put({"throttled/t.dat": b"t"})
    store.proxy.set_faults([Fault.status(503, times=100_000)])
    work = job_dir(plugin_pool, "throttled", store)
    submit = submit_text([store.url("throttled/t.dat")]).replace(
        f"CLOUDIO_PEGASUS_CLOUDIO_THREADS={THREADS}",
        f"CLOUDIO_PEGASUS_CLOUDIO_THREADS={THREADS} CLOUDIO_PEGASUS_CLOUDIO_THROTTLE_TIMEOUT=2 "
        "CLOUDIO_PEGASUS_CLOUDIO_RETRY_BASE_DELAY=0.05 CLOUDIO_PEGASUS_CLOUDIO_RETRY_MAX_DELAY=0.2")
    cluster = plugin_pool.submit(submit, cwd=work)
    ad = wait_held(plugin_pool, cluster)
    plugin_pool.run(["condor_rm", str(cluster)])
    reason = unquote(ad["HoldReason"])
    assert ad["HoldReasonCode"] == "13" and ad["HoldReasonSubCode"] == str(11 << 8), ad
    assert store.url("throttled/t.dat") in reason and "slow down" in reason, reason
    assert store.proxy.requests >= 2


def test_an_upload_throttled_to_the_end_is_released_by_the_documented_policy(plugin_pool: CondorPool,
                                                                             store: Store) -> None:
    """A 23.9 starter holds a failed output transfer with subcode 1, whatever the plugin's exit
    code: the release policy of docs/condor.md (its 5 minutes' wait aside) must still release
    the job whose upload the store throttled to the end (exit 11), on both pools, and only
    through the plugin's transient mark where the subcode does not say it."""
    store.proxy.set_faults([Fault.status(503, times=100_000)])
    work = job_dir(plugin_pool, "throttled-out", store)
    submit = submit_text([], outputs="result.dat", extra=f"output_destination = {store.url('throttled-out/')}")
    submit = submit.replace(
        f"CLOUDIO_PEGASUS_CLOUDIO_THREADS={THREADS}",
        f"CLOUDIO_PEGASUS_CLOUDIO_THREADS={THREADS} CLOUDIO_PEGASUS_CLOUDIO_THROTTLE_TIMEOUT=2 "
        "CLOUDIO_PEGASUS_CLOUDIO_RETRY_BASE_DELAY=0.05 CLOUDIO_PEGASUS_CLOUDIO_RETRY_MAX_DELAY=0.2")
    cluster = plugin_pool.submit(submit, cwd=work)
    ad = wait_held(plugin_pool, cluster)
    policy, by_subcode = release_policy()
    released = [plugin_pool.run(["condor_q", f"{cluster}.0", "-af", expr]).stdout.strip()
                for expr in (policy, by_subcode)]
    plugin_pool.run(["condor_rm", str(cluster)])
    reason = unquote(ad["HoldReason"])
    assert ad["HoldReasonCode"] == "12" and store.proxy.requests >= 2, ad
    assert "slow down" in reason and "[pegasus-cloudio: transient, exit 11]" in reason, reason
    assert released[0] == "true", (released, ad["HoldReasonSubCode"], reason)
    # 23.9 gives subcode 1 (the subcode alone misses the hold); 25.x the plugin's exit code
    assert (ad["HoldReasonSubCode"], released[1]) in {("1", "false"), (str(11 << 8), "true")}, (ad, released)


def release_policy() -> Tuple[str, str]:
    """docs/condor.md's SYSTEM_PERIODIC_RELEASE as one expression without its wait (``> 300``
    made ``> -1``), and the same with the subcode test alone (the policy before 23.9's subcode 1)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "condor.md").read_text()
    found = re.search(r"^SYSTEM_PERIODIC_RELEASE = \$\(SYSTEM_PERIODIC_RELEASE:False\) \|\|(.*?)\n```", text,
                      re.M | re.S)
    assert found, "docs/condor.md has no SYSTEM_PERIODIC_RELEASE policy"
    policy = " ".join(found.group(1).replace("\\\n", " ").split())
    assert "> 300" in policy and "HoldReasonSubCode =?= 2816 ||" in policy, policy
    policy = policy.replace("> 300", "> -1")
    start = policy.index("(HoldReasonSubCode =?= 2816 ||")
    end = policy.index(") &&", policy.index("regexp(")) + 1
    return policy, policy[:start] + "HoldReasonSubCode =?= 2816" + policy[end:]


def test_a_job_that_swaps_its_job_ad_for_a_fifo_is_held_naming_it(plugin_pool: CondorPool, store: Store) -> None:
    """Issue 39 item 4: the job replaces ``$_CONDOR_JOB_AD`` in its sandbox with a FIFO before
    stage-out. The plugin opened it and blocked until the starter killed it, with no result ad;
    now the output transfer fails at once, the hold naming the file."""
    work = job_dir(plugin_pool, "fifo-ad", store)
    (work / "job.sh").write_text(JOB + 'rm -f "$_CONDOR_JOB_AD" && mkfifo "$_CONDOR_JOB_AD"\n')
    cluster = plugin_pool.submit(submit_text([], outputs="result.dat",
                                             extra=f"output_destination = {store.url('fifo-ad/')}"), cwd=work)
    ad = wait_held(plugin_pool, cluster)
    plugin_pool.run(["condor_rm", str(cluster)])
    reason = unquote(ad["HoldReason"])
    assert ad["HoldReasonCode"] == "12", ad  # (a 23.9 starter gives output failures subcode 1)
    assert "cannot read the job ad" in reason and "a FIFO, not a regular file" in reason, reason
    assert store.proxy.requests == 0
