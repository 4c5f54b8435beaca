"""The drop-in without a stager: bundle members, and the small files its pipelined pass reads,
enter the node cache after the job's files are in place and the command has exited (a child
process inserts them), and a later job reads them from the cache."""

import json
import os

from transfer.cache import cache_from_settings

from test_stager import entry, read_bundle, run_job, upload_bundle, wait_for


def job_env(env):
    """A job's environment without a stager: bundles on, the cache off unless a test names one."""
    return {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""), **env,
            "PEGASUS_CLOUDIO_BUNDLE": "1", "PEGASUS_CLOUDIO_CACHE_MIN_FREE_BYTES": "0",
            "PEGASUS_CLOUDIO_CACHE_DIR": "off"}


def test_bundle_members_enter_the_node_cache_after_the_drop_in_exits(native_dropin, proxied, bucket, tmp_path):
    proxy, env = proxied
    common = job_env(env)
    names, url = upload_bundle(native_dropin, common, bucket, tmp_path)
    cache_dir = tmp_path / "cache"
    node = dict(common, PEGASUS_CLOUDIO_CACHE_DIR=str(cache_dir))

    def members_cached():
        cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(cache_dir), "HOME": env["HOME"]})
        try:
            return sorted(e.meta.key.rsplit("#member=", 1)[1][:3] for e in cache.entries())
        finally:
            cache.close()

    for job in ("first", "second"):
        proxy.reset_counters()
        done = read_bundle(native_dropin, node, names, url, tmp_path / job)  # every file complete at exit
        assert b"All transfers completed successfully." in done.stderr
        if job == "first":  # each written once, into a file in the cache linked here (as a body read ahead)
            assert all(os.stat(tmp_path / job / n).st_nlink == 2 for n in names)
            assert proxy.snapshot()["requests"] >= 2  # the listing and the bundle
            wait_for(lambda: members_cached() == names, "the members inserted behind the job")
    assert proxy.snapshot()["requests"] <= 2  # the directory's index; every member's bytes from the cache
    assert not list(cache_dir.rglob("*.part"))


def test_the_inserting_child_holds_nothing_of_the_jobs(native_dropin, proxied, bucket, tmp_path):
    """The child that inserts the members after the command exited is no longer the job's: no
    descriptor of it and not its working directory (a job's scratch directory may be a mount
    the execute node removes when the job ends), even while an insert waits (here on a
    member's lock, which this test holds)."""
    import json
    import subprocess

    from test_stager import one_member_to_hold
    from transfer.cache.locks import EXCLUSIVE, held
    proxy, env = proxied
    common = job_env(env)
    names, url = upload_bundle(native_dropin, common, bucket, tmp_path)
    cache_dir = tmp_path / "cache"
    node = dict(common, PEGASUS_CLOUDIO_CACHE_DIR=str(cache_dir))
    cache, lock, job, down = one_member_to_hold(native_dropin, node, names, url, cache_dir, tmp_path)

    def holders():
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                paths = [os.readlink(f"/proc/{pid}/cwd")]
                paths += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            except OSError:  # gone meanwhile
                continue
            if any(path == str(job) or path.startswith(f"{job}/") for path in paths):
                found.append(pid)
        return found

    with held(lock, EXCLUSIVE):  # the child's insert of this member waits
        done = subprocess.run(list(native_dropin), input=json.dumps(down).encode(), capture_output=True,
                              env=node, cwd=job, timeout=120)
        assert done.returncode == 0, done.stderr.decode()
        assert len(cache.entries()) < len(names)  # the child is still at work
        assert holders() == []
    wait_for(lambda: len(cache.entries()) == len(names), "the second job's inserts")
    cache.close()


def test_output_the_jobs_stdout_cannot_take_ends_as_python_does_with_the_inserts_still_made(
        native_dropin, proxied, bucket, tmp_path):
    """Bundle inserts pending, and output on a stdout whose reader is gone: the command ends as
    an interpreter that cannot flush a standard stream does (120, no traceback), its files in
    place; the members still reach the node cache."""
    import json
    import subprocess

    from test_stager import entry
    proxy, env = proxied
    common = job_env(env)
    names, url = upload_bundle(native_dropin, common, bucket, tmp_path)
    cache_dir = tmp_path / "cache"
    node = dict(common, PEGASUS_CLOUDIO_CACHE_DIR=str(cache_dir))
    job = tmp_path / "job"
    job.mkdir()
    down = [entry(f"{url}/{n}", f"file://{job}/{n}", "minio", "local") for n in names]
    down[0].update(lfn=names[0], generate_checksum=True)  # its integrity data goes to stdout (buffered)
    reader, writer = os.pipe()
    os.close(reader)  # the job's stdout has no reader: flushing it fails (EPIPE)
    try:
        done = subprocess.run(list(native_dropin), input=json.dumps(down).encode(), stdout=writer,
                              stderr=subprocess.PIPE, env=node, cwd=job, timeout=120)
    finally:
        os.close(writer)
    err = done.stderr.decode()
    assert done.returncode == 120, err
    assert "Traceback" not in err and "All transfers completed successfully." in err, err
    assert all((job / n).read_bytes() == n.encode() * 30 for n in names)
    cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(cache_dir), "HOME": env["HOME"]})
    try:
        wait_for(lambda: len(cache.entries()) == len(names), "the members inserted behind the job")
    finally:
        cache.close()


def test_small_files_a_job_reads_enter_the_node_cache_after_it_exits(native_dropin, proxied, bucket, tmp_path):
    """A miss costs the job what no cache costs (issue 38): each of its files is written once,
    as without the cache, but into the cache (read-only, as an entry) and hard-linked into the
    job; the entries are made of those very files behind its answer, with each object's
    version; the next job on the node reads every file from the cache without a GET."""
    proxy, env = proxied
    node = dict(job_env(env), PEGASUS_CLOUDIO_BUNDLE="0", PEGASUS_CLOUDIO_CACHE_DIR=str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    names = [f"s{i:02d}" for i in range(20)]
    for name in names:
        (src / name).write_bytes(name.encode() * 15)
    url = f"s3://test@minio/{bucket}/small"
    up = [entry(f"file://{src}/{n}", f"{url}/{n}", "local", "minio") for n in names]
    assert run_job(native_dropin, [], dict(node, PEGASUS_CLOUDIO_CACHE_DIR="off"), tmp_path,
                   stdin=json.dumps(up).encode()).returncode == 0

    def cached():
        cache = cache_from_settings({"PEGASUS_CLOUDIO_CACHE_DIR": str(tmp_path / "cache"), "HOME": env["HOME"]})
        try:
            return {e.meta.key.rsplit("/", 1)[1]: e.meta for e in cache.entries()}
        finally:
            cache.close()

    for job in ("first", "second"):
        (tmp_path / job).mkdir()
        proxy.reset_counters()
        down = [entry(f"{url}/{n}", f"file://{tmp_path / job}/{n}", "minio", "local") for n in names]
        done = run_job(native_dropin, [], node, tmp_path / job, stdin=json.dumps(down).encode())
        assert done.returncode == 0, done.stderr.decode()
        assert all((tmp_path / job / n).read_bytes() == n.encode() * 15 for n in names)
        if job == "first":
            assert all(os.stat(tmp_path / job / n).st_nlink == 2 for n in names)  # written once, linked
            assert {os.stat(tmp_path / job / n).st_mode & 0o777 for n in names} == {0o444 & ~_umask()}
            assert proxy.requests_by_method.get("GET", 0) == len(names)
            wait_for(lambda: sorted(cached()) == names, "the entries made behind the job")
            assert {(m.source, m.version is not None) for m in cached().values()} == {("download", True)}
    assert proxy.requests_by_method.get("GET", 0) == 0  # every file a hit
    assert all(os.stat(tmp_path / "second" / n).st_nlink == 3 for n in names)  # hard links of the entries
    assert all(os.stat(tmp_path / "second" / n).st_ino == os.stat(tmp_path / "first" / n).st_ino for n in names)
    assert not list((tmp_path / "cache").rglob("*.part"))


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask
