"""pegasus-cloudio-s3 beside the real pegasus-s3 5.1.3 on MinIO: shared behaviours must match
(files, listings, exit codes, messages); the 5.1.3 defects (spec §7.4) must be gone."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest

from pegasus_cloudio_testbed.stock import make_stock_home

OURS = [sys.executable, "-m", "pegasus_cloudio.s3cli.main"]


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    return make_stock_home(tmp_path_factory.mktemp("stock-s3"))


@pytest.fixture
def env(s3_env):
    return dict(s3_env, PATH=os.environ["PATH"], PYTHONPATH=os.environ.get("PYTHONPATH", ""))


@pytest.fixture
def client(minio):
    return boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                        aws_secret_access_key=minio.secret_key, region_name="us-east-1")


def run(argv, env, cwd):
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


def both(stock, args, env, cwd):
    """{'stock': (rc, out, err), 'ours': (rc, out, err)} for the same arguments."""
    return {"stock": run([str(stock.s3), *args], env, cwd), "ours": run(OURS + list(args), env, cwd)}


def keys(client, bucket):
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def test_put_get_round_trip_is_cross_compatible(stock, env, bucket, tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(3000))
    for uploader, downloader in (("stock", "ours"), ("ours", "stock")):
        url = f"s3://test@minio/{bucket}/by-{uploader}/data.bin"
        argv = {"stock": [str(stock.s3)], "ours": OURS}
        assert run(argv[uploader] + ["put", "-f", "-b", str(data), url], env, tmp_path)[0] == 0
        out = tmp_path / f"from-{uploader}.bin"
        assert run(argv[downloader] + ["get", url, str(out)], env, tmp_path)[0] == 0
        assert out.read_bytes() == data.read_bytes()


def test_listings_match(stock, env, bucket, client, tmp_path):
    for key in ("a/1.txt", "a/2.txt", "ab.txt", "b/a.txt"):
        client.put_object(Bucket=bucket, Key=key, Body=b"x")
    for url in (f"s3://test@minio/{bucket}", f"s3://test@minio/{bucket}/a", f"s3://test@minio/{bucket}/a/"):
        runs = both(stock, ["ls", url], env, tmp_path)
        assert runs["stock"][:2] == runs["ours"][:2], url
    assert both(stock, ["ls", f"s3://test@minio/{bucket}/a"], env, tmp_path)["ours"][1] == \
        "\ta/1.txt\n\ta/2.txt\n\tab.txt\n"
    runs = both(stock, ["ls", "s3://test@minio"], env, tmp_path)
    assert f"\t{bucket}\n" in runs["stock"][1] and f"\t{bucket}\n" in runs["ours"][1]
    long = run(OURS + ["ls", "-l", "-H", f"s3://test@minio/{bucket}/b"], env, tmp_path)
    assert long[0] == 0 and long[1].endswith(" b/a.txt\n") and "1B" in long[1]


def test_missing_bucket_and_key_fail_alike(stock, env, bucket, tmp_path):
    runs = both(stock, ["ls", f"s3://test@minio/{bucket}-absent"], env, tmp_path)
    assert runs["stock"][0] == runs["ours"][0] == 1
    assert f"Invalid bucket: {bucket}-absent" in runs["stock"][1] and f"Invalid bucket: {bucket}-absent" in runs["ours"][2]
    runs = both(stock, ["get", f"s3://test@minio/{bucket}/absent", str(tmp_path / "absent")], env, tmp_path)
    assert runs["stock"][0] == runs["ours"][0] == 1
    assert not (tmp_path / "absent").exists() and runs["ours"][1] == ""


def test_put_refuses_to_overwrite_without_force_alike(stock, env, bucket, tmp_path):
    src = tmp_path / "f.txt"
    src.write_text("one")
    url = f"s3://test@minio/{bucket}/f.txt"
    assert run(OURS + ["put", str(src), url], env, tmp_path)[0] == 0
    runs = both(stock, ["put", str(src), url], env, tmp_path)
    assert runs["stock"][0] == runs["ours"][0] == 1
    assert "Try --force to overwrite" in runs["ours"][2]
    src.write_text("two")
    assert run(OURS + ["put", "-f", f"file://{src}", url], env, tmp_path)[0] == 0
    assert run(OURS + ["get", url], env, tmp_path)[0] == 0
    assert (tmp_path / "f.txt").read_text() == "two"


def test_put_to_a_directory_url_appends_the_basename(stock, env, bucket, client, tmp_path):
    src = tmp_path / "g.txt"
    src.write_text("g")
    assert run(OURS + ["put", str(src), f"s3://test@minio/{bucket}/ours/"], env, tmp_path)[0] == 0
    assert run([str(stock.s3), "put", str(src), f"s3://test@minio/{bucket}/stock/"], env, tmp_path)[0] == 0
    assert keys(client, bucket) == ["ours/g.txt", "stock/"]  # 5.1.3 stores the literal key "stock/"


def test_mkdir_is_idempotent_and_takes_dotted_names(stock, env, client, tmp_path, bucket):
    for tool, argv in (("stock", [str(stock.s3)]), ("ours", OURS)):
        url = f"s3://test@minio/{bucket}.{tool}"
        assert run(argv + ["mkdir", url], env, tmp_path)[0] == 0
        assert run(argv + ["mkdir", url], env, tmp_path)[0] == 0
        assert f"{bucket}.{tool}" in [b["Name"] for b in client.list_buckets()["Buckets"]]
    runs = both(stock, ["mkdir", f"s3://test@minio/{bucket}/key"], env, tmp_path)
    assert runs["stock"][0] == runs["ours"][0] == 1 and "cannot contain a key" in runs["ours"][2]


def test_rm_checks_existence_unless_forced_alike(stock, env, bucket, client, tmp_path):
    client.put_object(Bucket=bucket, Key="k1", Body=b"1")
    runs = both(stock, ["rm", f"s3://test@minio/{bucket}/nope"], env, tmp_path)
    assert runs["stock"][0] == runs["ours"][0] == 1 and "Some keys to delete do not exist" in runs["ours"][2]
    assert run(OURS + ["rm", "-f", f"s3://test@minio/{bucket}/nope"], env, tmp_path)[0] == 0
    listing = tmp_path / "list.txt"
    listing.write_text(f"# comment\n\ns3://test@minio/{bucket}/k1\n")
    assert run(OURS + ["rm", "-F", str(listing)], env, tmp_path)[0] == 0
    assert keys(client, bucket) == []


def test_recursive_cleanup_pattern_deletes_past_1000_keys(stock, env, bucket, client, tmp_path):
    """pegasus-transfer sends ``rm -f -F`` with ``prefix/*``; 5.1.3 deletes nothing."""
    names = [f"run1/{i:04d}.dat" for i in range(1003)] + ["run1/sub/x.dat", "run10/keep.dat", "top.dat"]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: client.put_object(Bucket=bucket, Key=k, Body=b"."), names))
    listed = run(OURS + ["ls", f"s3://test@minio/{bucket}/run1/"], env, tmp_path)[1].splitlines()
    assert len(listed) == 1004  # 5.1.3 shows the first 1000 only
    spec = tmp_path / "rm.lst"
    spec.write_text(f"s3://test@minio/{bucket}/run1/*\n")
    assert run([str(stock.s3), "rm", "-f", "-F", str(spec)], env, tmp_path)[0] == 0
    assert len(keys(client, bucket)) == len(names)  # stock: "success", nothing deleted
    assert run(OURS + ["-v", "rm", "-f", "-F", str(spec)], env, tmp_path)[0] == 0
    assert keys(client, bucket) == ["run10/keep.dat", "top.dat"]
    assert run(OURS + ["rm", f"s3://test@minio/{bucket}/t?p.dat"], env, tmp_path)[0] == 0
    assert keys(client, bucket) == ["run10/keep.dat"]


def test_cp_server_side_and_overwrite_rules_alike(stock, env, bucket, client, tmp_path):
    client.put_object(Bucket=bucket, Key="src/a", Body=b"payload")
    for tool, argv in (("stock", [str(stock.s3)]), ("ours", OURS)):
        dest = f"s3://test@minio/{bucket}-{tool}/copy/a"
        assert run(argv + ["cp", "-c", f"s3://test@minio/{bucket}/src/a", dest], env, tmp_path)[0] == 0
        assert client.get_object(Bucket=f"{bucket}-{tool}", Key="copy/a")["Body"].read() == b"payload"
        assert run(argv + ["cp", f"s3://test@minio/{bucket}/src/a", dest], env, tmp_path)[0] == 1
        assert run(argv + ["cp", "-f", f"s3://test@minio/{bucket}/src/a", dest], env, tmp_path)[0] == 0
    runs = both(stock, ["cp", f"s3://test@minio/{bucket}/src/a", f"s3://other@minio/{bucket}/b"], env, tmp_path)
    assert runs["stock"][0] == runs["ours"][0] == 1 and "do not match" in runs["ours"][2]


def test_config_lookup_and_permission_checks_alike(stock, env, bucket, minio, tmp_path):
    creds = tmp_path / "s3cfg"
    minio.write_pegasus_credentials(creds, site="minio", user="test")
    bare = {"PATH": env["PATH"], "HOME": str(tmp_path / "home"), "PEGASUS_CLOUDIO_CONFIG": os.devnull}
    url = f"s3://test@minio/{bucket}"
    runs = both(stock, ["ls", url], dict(bare, S3CFG=str(creds)), tmp_path)
    assert runs["stock"][0] == runs["ours"][0] == 0
    (tmp_path / "home" / ".pegasus").mkdir(parents=True)
    os.replace(creds, tmp_path / "home" / ".pegasus" / "s3cfg")
    assert both(stock, ["ls", url], bare, tmp_path)["ours"][0] == 0
    runs = both(stock, ["-C", str(tmp_path / "absent.conf"), "ls", url], bare, tmp_path)
    assert runs["stock"][0] == runs["ours"][0] == 1 and "Config file not found" in runs["ours"][2]
    (tmp_path / "home" / ".pegasus" / "s3cfg").chmod(0o640)
    runs = both(stock, ["ls", url], bare, tmp_path)
    assert runs["stock"][0] == runs["ours"][0] == 1
    assert "too liberal" in runs["stock"][1] and "too liberal" in runs["ours"][2]
    assert minio.secret_key not in runs["ours"][2]


def test_identities_with_dashes_and_dots_work(env, bucket, minio, client, tmp_path):
    creds = tmp_path / "dashed.conf"
    creds.write_text(f"[my-minio]\nendpoint = {minio.endpoint}\n[joe.smith@my-minio]\n"
                     f"access_key = {minio.access_key}\nsecret_key = {minio.secret_key}\n")
    creds.chmod(0o600)
    src = tmp_path / "d.txt"
    src.write_text("d")
    url = f"s3://joe.smith@my-minio/{bucket}/d.txt"
    assert run(OURS + ["-C", str(creds), "put", str(src), url], env, tmp_path)[0] == 0
    assert keys(client, bucket) == ["d.txt"]


def test_usage_exit_codes_and_help(stock, env, tmp_path):
    runs = both(stock, [], env, tmp_path)
    assert runs["stock"][0] == runs["ours"][0] == 0 and "usage:" in runs["ours"][1]
    runs = both(stock, ["frobnicate"], env, tmp_path)
    assert runs["stock"][0] == runs["ours"][0] == 2
    runs = both(stock, ["ls", "s3://minio/bucket"], env, tmp_path)
    assert runs["stock"][0] == runs["ours"][0] == 1 and "User missing from URL" in runs["ours"][2]
    rc, out, _ = run(OURS + ["help", "rm"], env, tmp_path)
    assert rc == 0 and "--force" in out and "--file" in out
    assert run([str(stock.s3), "help"], env, tmp_path)[0] == 2  # documented, never implemented in 5.1.3
    rc, _, err = run(OURS + ["rmdir", "s3://test@minio/x"], env, tmp_path)
    assert rc == 1 and "4.x" in err


def test_legacy_recursive_put_and_get(env, bucket, client, tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("a")
    (tree / "sub" / "b.txt").write_text("b")
    url = f"s3://test@minio/{bucket}/up/"
    assert run(OURS + ["put", "-r", "-p", "4", "-c", "8", str(tree), url], env, tmp_path)[0] == 0
    assert keys(client, bucket) == ["up/tree/a.txt", "up/tree/sub/b.txt"]
    assert run(OURS + ["get", "-r", f"s3://test@minio/{bucket}/up/tree", str(tmp_path / "back")],
               env, tmp_path)[0] == 0
    assert (tmp_path / "back" / "sub" / "b.txt").read_text() == "b"


def test_stock_pegasus_transfer_works_on_top_of_it(env, bucket, client, tmp_path):
    """Installed as ``$PEGASUS_HOME/bin/pegasus-s3``, the stock tool's S3 calls go through ours."""
    home = make_stock_home(tmp_path / "home")
    home.s3.write_text(f"#!/bin/sh\nexec {sys.executable} -m pegasus_cloudio.s3cli.main \"$@\"\n")
    (tmp_path / "a.txt").write_text("a")
    up = [{"type": "transfer", "lfn": n, "src_urls": [{"site_label": "local", "url": f"file://{tmp_path}/a.txt"}],
           "dest_urls": [{"site_label": "minio", "url": f"s3://test@minio/{bucket}/run1/{n}"}]} for n in ("x", "y")]
    rm = [{"type": "remove", "target": {"site_label": "minio", "url": f"s3://test@minio/{bucket}/run1",
                                        "recursive": "True"}}]
    for spec in (up, rm):
        done = subprocess.run([str(home.transfer), "-m", "1"], input=json.dumps(spec), env=home.env(env), cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        if spec is up:
            assert keys(client, bucket) == ["run1/x", "run1/y"]
    assert keys(client, bucket) == []  # with 5.1.3's own pegasus-s3 both objects stay


# -- Ctrl-C and errors: what a person at a terminal meets --------------------------------------

MiB = 1 << 20


def _wait(predicate, what, timeout=60.0):
    import time
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _parts(directory):
    return [p for p in directory.rglob("*") if p.name.endswith(".part")]


def test_ctrl_c_in_get_stops_at_once_leaving_no_file_and_exit_1(proxied, minio, client, bucket, tmp_path):
    """Ctrl-C waited for the transfer in flight (8.5 s for 300 MB), then said exit 1 beside a
    complete file. Now it stops mid-body: no partial and no complete file, exit 1, one summary."""
    from pegasus_cloudio_testbed.proxy import Fault
    import signal
    proxy, proxied_env = proxied
    client.put_object(Bucket=bucket, Key="big.dat", Body=os.urandom(24 * MiB))
    proxy.set_faults([Fault.stall(120, after_bytes=4 * MiB, method="GET")])  # a slow store, 4 MiB in
    proc = subprocess.Popen(OURS + ["get", f"s3://test@minio/{bucket}/big.dat", "big.dat"], cwd=tmp_path,
                            env=dict(proxied_env, PATH=os.environ["PATH"], PEGASUS_CLOUDIO_CACHE_DIR="off"),
                            stderr=subprocess.PIPE, text=True)
    _wait(lambda: _parts(tmp_path) and _parts(tmp_path)[0].stat().st_size > 0, "a partial download")
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(timeout=30)  # the stalled body would hold it for 120 s
    err = proc.stderr.read()
    assert rc == 1, err
    assert _parts(tmp_path) == [] and not (tmp_path / "big.dat").exists()
    assert "Exiting due to signal 2: 1 transfer(s) did not finish" in err and "Traceback" not in err, err


def test_ctrl_c_in_put_aborts_the_multipart_upload(proxied, minio, client, bucket, tmp_path):
    from pegasus_cloudio_testbed.proxy import Fault
    import signal
    proxy, proxied_env = proxied
    src = tmp_path / "out.dat"
    src.write_bytes(os.urandom(12 * MiB))
    proxy.set_faults([Fault.stall(120, method="PUT", path="partNumber", times=10)])
    env = dict(proxied_env, PATH=os.environ["PATH"], PEGASUS_CLOUDIO_MULTIPART_THRESHOLD=str(5 * MiB),
               PEGASUS_CLOUDIO_MULTIPART_PART_SIZE=str(5 * MiB))
    proc = subprocess.Popen(OURS + ["put", str(src), f"s3://test@minio/{bucket}/out.dat"], cwd=tmp_path, env=env,
                            stderr=subprocess.PIPE, text=True)
    _wait(lambda: client.list_multipart_uploads(Bucket=bucket).get("Uploads"), "a multipart upload to start")
    _wait(lambda: proxy.requests_by_method.get("PUT", 0) >= 1, "a part in flight")
    proc.send_signal(signal.SIGINT)  # the parts stay stalled: the upload cannot finish first
    rc = proc.wait(timeout=30)
    err = proc.stderr.read()
    assert rc == 1, err
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads"), err
    assert keys(client, bucket) == [] and "Not finished:" in err, err


_SIGNAL_AFTER = """
import os, signal, sys
from pegasus_cloudio.dropin.signals import Interrupts
from pegasus_cloudio.s3cli.main import _Stderr
from transfer import Engine, Session, Settings, Transfer, parse_url
src, dst, finished = sys.argv[1], sys.argv[2], sys.argv[3] == "finished"
op = Transfer((parse_url("file://" + src),), parse_url("file://" + dst))
with Session(Settings(threads=1), {"PEGASUS_CLOUDIO_CACHE_DIR": "off"}) as session, \\
        Interrupts(_Stderr(), truthful=True) as interrupts:
    engine = Engine(session, on_result=interrupts.finished)
    interrupts.watch(engine, [op])
    if finished:
        engine.run([op])
    os.kill(os.getpid(), signal.SIGINT)
    sys.exit(3)  # not reached: the handler exits
"""


@pytest.mark.parametrize("finished, code", [(True, 0), (False, 1)])
def test_the_exit_status_after_ctrl_c_tells_whether_the_transfers_finished(finished, code, tmp_path):
    """Ctrl-C once every transfer finished well is success (the files are in place), as
    ``pegasus-cloudio-s3`` uses its handler; with one unfinished it is 1, and says so."""
    (tmp_path / "a").write_text("a")
    done = subprocess.run([sys.executable, "-c", _SIGNAL_AFTER, str(tmp_path / "a"), str(tmp_path / "b"),
                           "finished" if finished else "pending"], capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    if finished:
        assert (tmp_path / "b").read_text() == "a"
        assert done.stderr == "pegasus-cloudio-s3: Interrupted by signal 2 after every transfer finished\n"
    else:
        assert "did not finish" in done.stderr and "Not finished: file://" in done.stderr, done.stderr


def test_an_error_is_printed_once_and_v_gives_no_traceback(env, bucket, tmp_path):
    for flags in ([], ["-v"]):
        rc, _, err = run(OURS + flags + ["get", f"s3://test@minio/{bucket}/missing", "m"], env, tmp_path)
        assert rc == 1
        lines = [line for line in err.splitlines() if "missing" in line]
        assert len(lines) == 1 and "Traceback" not in err, err
    rc, _, err = run(OURS + ["-d", "get", f"s3://test@minio/{bucket}/missing", "m"], env, tmp_path)
    assert rc == 1 and "Traceback" in err  # -d is for debugging


def test_v_and_d_tell_what_was_used_and_never_a_secret(env, minio, bucket, tmp_path):
    """pegasus-cloudio-s3 -d get printed nothing on success. Now -v names the credentials file
    and counts connections and requests; -d adds each setting's source and the endpoint's."""
    data = tmp_path / "f"
    data.write_bytes(b"y" * 100)
    url = f"s3://test@minio/{bucket}/f"
    assert run(OURS + ["put", str(data), url], env, tmp_path)[0] == 0
    rc, _, err = run(OURS + ["-v", "get", url, "g"], env, tmp_path)
    assert rc == 0 and f"credentials file {env['PEGASUS_CREDENTIALS']}" in err, err
    assert "1 connection(s) opened, 1 request(s) sent" in err and "setting " not in err, err
    rc, _, err = run(OURS + ["-d", "get", url, "h"], dict(env, PEGASUS_CLOUDIO_THREADS="2"), tmp_path)
    assert rc == 0 and "setting PEGASUS_CLOUDIO_THREADS=2 (from the environment)" in err, err
    assert f"endpoint {minio.endpoint} from {env['PEGASUS_CREDENTIALS']} [minio]" in err, err
    assert "path-style addressing" in err and "keys from section [test@minio]" in err
    for secret in (minio.secret_key, minio.access_key):
        assert secret not in err


@pytest.mark.parametrize("name", ["Bad_Bucket", "ab", "a..b", "192.168.1.1", "-lead"])
def test_mkdir_of_an_invalid_bucket_name_says_why_before_any_request(name, proxied, tmp_path):
    """A new user's `mkdir s3://me@minio/Bad_Bucket` printed the store's "InvalidBucketName: The
    specified bucket is not valid." with no word of the rule. Now one line says it, and no
    request leaves."""
    proxy, env = proxied
    rc, out, err = run(OURS + ["mkdir", f"s3://test@minio/{name}"], dict(env, PATH=os.environ["PATH"]), tmp_path)
    assert rc == 1 and out == "", err
    assert err.strip().splitlines() == [f"mkdir s3://test@minio/{name}: {name!r} is not a valid bucket name: use "
                                        "3-63 lower-case letters, digits, '.' or '-', starting and ending with a "
                                        "letter or digit, no '..', not an IP address"], err
    assert proxy.requests == 0 and proxy.connections == 0
