"""The drop-in without a stager: bundle members enter the node cache after the job's files are in
place and the command has exited (a child process inserts them), and a later job reads them
from the cache."""

import json
import os

from transfer.cache import cache_from_settings

from test_stager import entry, run_job, wait_for


def test_bundle_members_enter_the_node_cache_after_the_drop_in_exits(native_dropin, proxied, bucket, tmp_path):
    proxy, env = proxied
    src = tmp_path / "src"
    src.mkdir()
    names = [f"m{i:02d}" for i in range(12)]
    for name in names:
        (src / name).write_bytes(name.encode() * 30)
    url = f"s3://test@minio/{bucket}/run"
    common = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""), **env,
              "PEGASUS_CLOUDIO_BUNDLE": "1", "PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES": "0",
              "PEGASUS_CLOUDIO_CACHE_DIR": "off"}
    up = [entry(f"file://{src}/{n}", f"{url}/{n}", "local", "minio") for n in names]
    done = run_job(native_dropin, [], common, tmp_path, stdin=json.dumps(up).encode())
    assert done.returncode == 0, done.stderr.decode()
    cache_dir = tmp_path / "cache"
    node = dict(common, PEGASUS_CLOUDIO_CACHE_DIR=str(cache_dir))

    def members_cached():
        cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(cache_dir), "HOME": env["HOME"]})
        try:
            return sorted(e.meta.key.rsplit("#member=", 1)[1][:3] for e in cache.entries())
        finally:
            cache.close()

    for job in ("first", "second"):
        (tmp_path / job).mkdir()
        proxy.reset_counters()
        down = [entry(f"{url}/{n}", f"file://{tmp_path}/{job}/{n}", "minio", "local") for n in names]
        done = run_job(native_dropin, [], node, tmp_path / job, stdin=json.dumps(down).encode())
        assert done.returncode == 0, done.stderr.decode()
        assert b"All transfers completed successfully." in done.stderr
        # every file complete and the job's own (not a link into the cache) when the command exits
        for n in names:
            assert (tmp_path / job / n).read_bytes() == n.encode() * 30
            assert os.stat(tmp_path / job / n).st_nlink == 1 or job == "second"
        if job == "first":
            assert proxy.snapshot()["requests"] >= 2  # the listing and the bundle
            wait_for(lambda: members_cached() == names, "the members inserted behind the job")
    assert proxy.snapshot()["requests"] <= 2  # the directory's index; every member's bytes from the cache
    assert not list(cache_dir.rglob("*.part"))
