"""Cache-aware scheduling: the startd cron summary, the per-job condor.rank the Pegasus helper
adds, both evaluated with classad2 on machine ads whose summaries cover >= 10,000 files."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import tracemalloc

import classad2
import pytest

from pegasus_cloudio.p2p.summary import ATTRIBUTE, add_cache_rank, rank_expression, short_id, summarise
from transfer import Engine, Session, Settings, Transfer, parse_url
from p2p_support import new_cache, put

FILES_PER_MACHINE = 12_000


def machine(name, keys=(), extra_ids=FILES_PER_MACHINE, seed=0):
    """A machine ad whose summary covers ``extra_ids`` unrelated files plus ``keys``."""
    rng = random.Random(seed)
    ids = {short_id(f"s3://other/{name}/{rng.random()}") for _ in range(extra_ids)}
    ids |= {short_id(k) for k in keys}
    return classad2.ClassAd({"Name": name, ATTRIBUTE: ",".join(sorted(ids)), f"{ATTRIBUTE}Files": len(ids)})


def rank(expr, machine_ad):
    return classad2.ExprTree(expr).eval(scope=classad2.ClassAd(), target=machine_ad)


def test_the_rank_prefers_machines_holding_more_of_the_jobs_input_bytes():
    inputs = [("s3://b/run/big.fits", 50_000_000), ("s3://b/run/mid.fits", 5_000_000), ("s3://b/run/tbl", 300)]
    expr = rank_expression(inputs)
    keys = [k for k, _ in inputs]
    ads = {"all": machine("all", keys, seed=1), "big": machine("big", keys[:1], seed=2),
           "small": machine("small", keys[1:], seed=3), "none": machine("none", seed=4),
           "no-summary": classad2.ClassAd({"Name": "plain"})}
    assert len(ads["none"][ATTRIBUTE].split(",")) >= 10_000
    ranks = {name: rank(expr, ad) for name, ad in ads.items()}
    assert ranks["all"] > ranks["big"] > ranks["small"] > ranks["none"] == ranks["no-summary"] == 0
    assert abs(ranks["all"] - 55.0003) < 1e-3


def test_summary_of_a_real_cache_names_every_entry(tmp_path):
    cache = new_cache(tmp_path / "c")
    keys = [f"s3://b/k{i}" for i in range(300)]
    for k in keys:
        put(cache, k, b"x")
    assert summarise([cache.directory]) == sorted({short_id(k) for k in keys})
    assert len(summarise([cache.directory], limit=10)) == 10


def test_cache_summary_prints_a_classad_for_the_startd_cron(tmp_path):
    cache = new_cache(tmp_path / "c")
    put(cache, "s3://b/one", b"1")
    env = dict(os.environ, PEGASUS_CLOUDIO_P2P_USERS=f"alice={cache.directory}", PEGASUS_CLOUDIO_P2P_NODE="w1",
               PEGASUS_CLOUDIO_CONFIG=os.devnull)
    out = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "cache-summary"], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    ad = classad2.parseOne(out)
    assert ad[ATTRIBUTE] == short_id("s3://b/one") and ad[f"{ATTRIBUTE}Files"] == 1
    assert ad["PegasusCloudioNode"] == "w1"


def test_the_pegasus_helper_ranks_the_node_whose_cache_holds_the_input_first(s3_env, bucket, tmp_path):
    from Pegasus.api import File, Job, Workflow
    src = tmp_path / "in.fits"
    src.write_bytes(os.urandom(2_000_000))
    url = f"s3://test@minio/{bucket}/run/in.fits"
    cache = new_cache(tmp_path / "cache")
    with Session(Settings(), s3_env) as session:
        engine = Engine(session)
        assert engine.run([Transfer((parse_url(str(src)),), parse_url(url))])[0].ok
        assert Engine(session, cache=cache).run(
            [Transfer((parse_url(url),), parse_url(f"file://{tmp_path}/job/in.fits"))])[0].ok
    wf = Workflow("montage-like")
    reader = Job("mProject").add_inputs(File("in.fits", size=2_000_000)).add_outputs(File("out.fits"))
    other = Job("mAdd").add_inputs(File("not-in-catalog.fits"))
    wf.add_jobs(reader, other)
    assert add_cache_rank(wf, {"in.fits": url}, env=s3_env) == 1
    expr = reader.profiles["condor"]["rank"]
    holder = classad2.ClassAd({ATTRIBUTE: ",".join(summarise([cache.directory]))})
    assert rank(expr, holder) == 2.0
    assert rank(expr, machine("elsewhere")) == 0
    assert "rank" not in other.profiles.get("condor", {})


def test_sites_p2p_puts_the_pool_settings_on_the_compute_site_and_documents_the_helper(tmp_path):
    import yaml
    from pegasus_cloudio.sites import cli
    from pegasus_cloudio.sites.templates import argv_for
    argv = argv_for("s3-cloud-storage", str(tmp_path)) + ["--p2p", "redis://10.0.0.5:6379/0"]
    assert cli.main(cli._parser().parse_args(argv)) == 0
    sites = yaml.safe_load((tmp_path / "sites.yml").read_text())
    [compute] = [s for s in sites["sites"] if s["name"] == "condorpool"]
    env = compute["profiles"]["env"]
    assert env["PEGASUS_CLOUDIO_P2P_REDIS"] == "redis://10.0.0.5:6379/0"
    assert env["PEGASUS_CLOUDIO_P2P_TOKEN_FILE"] == "~/.pegasus/p2p.token"  # the user's own copy
    [local] = [s for s in sites["sites"] if s["name"] == "local"]
    assert "PEGASUS_CLOUDIO_P2P_REDIS" not in local.get("profiles", {}).get("env", {})
    readme = (tmp_path / "README.md").read_text()
    assert "add_cache_rank" in readme and "--p2p redis://10.0.0.5:6379/0" in readme


def _cli(*args, env):
    return subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "cache-summary", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_cache_summary_written_by_root_is_what_the_cron_publishes(tmp_path):
    cache = new_cache(tmp_path / "c")
    put(cache, "s3://b/one", b"1")
    env = dict(os.environ, PEGASUS_CLOUDIO_P2P_USERS=f"alice={cache.directory}", PEGASUS_CLOUDIO_P2P_NODE="w1",
               PEGASUS_CLOUDIO_CONFIG=os.devnull)
    target = tmp_path / "summary.ad"
    assert _cli("--write", str(target), env=env).returncode == 0
    assert target.stat().st_mode & 0o777 == 0o644
    published = _cli("--read", str(target), env=dict(os.environ, PEGASUS_CLOUDIO_CONFIG="/nonexistent"))
    assert published.returncode == 0 and published.stdout == target.read_text()
    assert classad2.parseOne(published.stdout)["PegasusCloudioNode"] == "w1"


def test_cron_publishes_an_empty_summary_when_roots_file_is_missing_or_stale(tmp_path):
    target = tmp_path / "summary.ad"
    env = dict(os.environ, PEGASUS_CLOUDIO_P2P_NODE="w2")
    missing = _cli("--read", str(target), env=env)
    assert missing.returncode == 0 and f'{ATTRIBUTE} = ""' in missing.stdout and "missing" in missing.stderr
    target.write_text(f'{ATTRIBUTE} = "abcdef"\n{ATTRIBUTE}Files = 1\nPegasusCloudioNode = "w2"\n')
    os.utime(target, (1, 1))
    stale = _cli("--read", str(target), "--max-age", "60", env=env)
    assert stale.returncode == 0 and f'{ATTRIBUTE} = ""' in stale.stdout and "older than 60 s" in stale.stderr


@pytest.mark.parametrize("fault", ["group-writable", "not-root", "link", "foreign-attribute", "too-big"])
def test_cron_refuses_a_summary_file_others_could_have_written(tmp_path, fault):
    real = tmp_path / "real.ad"
    real.write_text(f'{ATTRIBUTE} = "abcdef"\n{ATTRIBUTE}Files = 1\nPegasusCloudioNode = "w2"\n')
    target = tmp_path / "summary.ad"
    if fault == "link":
        target.symlink_to(real)
    else:
        os.replace(real, target)
    if fault == "group-writable":
        target.chmod(0o664)
    elif fault == "not-root":
        os.chown(target, 65534, 65534)
    elif fault == "foreign-attribute":
        target.write_text('Start = True\n')
    elif fault == "too-big":
        target.write_text(f'{ATTRIBUTE} = "{"a" * (5 << 20)}"\n')
    done = _cli("--read", str(target), env=dict(os.environ))
    assert done.returncode == 1 and done.stdout == ""
    assert str(target) in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_summary_follows_no_link_a_user_planted_in_the_cache(tmp_path):
    elsewhere = new_cache(tmp_path / "elsewhere")
    put(elsewhere, "s3://b/secret", b"s")
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    (planted / "objects").symlink_to(tmp_path / "elsewhere" / "objects")
    linked_root = tmp_path / "linked"
    linked_root.symlink_to(tmp_path / "elsewhere")
    unreadable = []
    assert summarise([str(planted), str(linked_root)], unreadable=unreadable) == []
    assert unreadable == [str(planted), str(linked_root)]



def test_summary_reads_a_cache_flooded_with_names_within_its_budget(tmp_path):
    """Root lists users' caches; a user can put millions of names in hers. The listing stops
    at its budget (16 * limit entries a cache), so root's memory does not grow with them:
    60,000 long names in ``objects/`` cost no more than a small cache does."""
    fast = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)  # tmpfs: the names take a second
    base = tempfile.mkdtemp(prefix="pcio-flood-", dir=fast)
    try:
        objects = os.path.join(base, "objects")
        os.mkdir(objects, mode=0o700)
        for i in range(60_000):
            os.close(os.open(os.path.join(objects, f"{'x' * 240}{i}"), os.O_CREAT | os.O_WRONLY, 0o600))
        tracemalloc.start()
        try:
            assert summarise([base], limit=100) == []
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, f"{peak} bytes at the peak of listing a flooded cache"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_summary_follows_no_link_a_user_planted_on_the_way_to_her_cache(tmp_path):
    """Root summarises ``~alice/.cache/pegasus-cloudio``; Alice owns ``~alice/.cache`` and can
    make it a link to another user's ``.cache``: root would then publish that user's entries
    as the node's. A link of root's on the way (``/home`` -> ``/srv/home``) is followed."""
    other = new_cache(tmp_path / "bob" / ".cache" / "pegasus-cloudio")
    put(other, "s3://b/bobs-private-file", b"s")
    home = tmp_path / "alice"
    home.mkdir()
    (home / ".cache").symlink_to(tmp_path / "bob" / ".cache")
    os.lchown(home / ".cache", 65534, 65534)  # Alice's link
    unreadable = []
    assert summarise([str(home / ".cache" / "pegasus-cloudio")], unreadable=unreadable) == []
    assert unreadable == [str(home / ".cache" / "pegasus-cloudio")]

    roots = tmp_path / "roots-link"  # root's own link on the way is fine
    roots.symlink_to(tmp_path / "bob")
    assert summarise([str(roots / ".cache" / "pegasus-cloudio")]) == [short_id("s3://b/bobs-private-file")]


def test_one_user_cannot_push_another_users_entries_out_of_the_summary(tmp_path):
    """Mallory plants 50 entry names in her cache with last-use times in the future; Alice's
    10 real entries, used before, still all make a summary capped at 20 ids (issue 39)."""
    alice = new_cache(tmp_path / "alice")
    keys = [f"s3://b/alice/{n}" for n in range(10)]
    for key in keys:
        put(alice, key, key.encode())
    mallory = tmp_path / "mallory"
    fakes = [f"{n:02x}{'f' * 62}" for n in range(50)]
    for name in fakes:
        shard = mallory / "objects" / name[:2]
        shard.mkdir(parents=True, exist_ok=True)
        for path in (shard / name, shard / f"{name}.meta"):
            path.write_bytes(b"x")
            os.utime(path, (4e9, 4e9))  # the year 2096
    for path in [mallory, *mallory.rglob("*")]:
        os.lchown(path, 65534, 65534)  # hers, not root's nor Alice's
    ids = summarise([str(mallory), alice.directory], limit=20)
    assert len(ids) == 20 and {short_id(k) for k in keys} <= set(ids)
    assert len(set(ids) & {name[:6] for name in fakes}) == 10  # she keeps her share
    assert summarise([str(mallory), alice.directory], limit=100) == sorted(
        {short_id(k) for k in keys} | {name[:6] for name in fakes})


def test_write_refuses_a_users_link_with_advice_for_that_case(tmp_path):
    """Run by root, ``--write`` skips a cache reached through a link of the user's; its one
    line says why and what to set, not the advice for the startd cron's user."""
    other = new_cache(tmp_path / "bob" / "cache")
    put(other, "s3://b/bobs", b"b")
    (tmp_path / "alice").mkdir()
    link = tmp_path / "alice" / "cache"
    link.symlink_to(tmp_path / "bob" / "cache")
    os.lchown(link, 65534, 65534)
    env = dict(os.environ, PEGASUS_CLOUDIO_P2P_USERS=f"alice={link}", PEGASUS_CLOUDIO_P2P_NODE="w1",
               PEGASUS_CLOUDIO_CONFIG=os.devnull)
    target = tmp_path / "summary.ad"
    done = _cli("--write", str(target), env=env)
    assert done.returncode == 0 and f'{ATTRIBUTE} = ""' in target.read_text()
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"refusing cache {link}" in lines[0], done.stderr
    assert "real path" in lines[0] and "condor" not in lines[0] and "--write" not in lines[0]
