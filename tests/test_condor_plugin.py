"""The HTCondor plugin driven exactly as condor_starter drives it (see tests/fixtures_condor.py).

No HTCondor daemons run here, so these protocol tests are the contract: the query ad, the
concatenated input ads, the pre-filled output file, uploads, one result ad per file in a
batch with failures, missing objects, bad credentials and a server that dies mid-run,
against MinIO and local HTTPS servers.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import classad2
from botocore.config import Config
import pytest
from fixtures_condor import ERROR_DATA_TYPES, PREALLOCATED, RESULT_TYPES, file_ad, hold_reason_details, parse_results

from pegasus_cloudio.testbed.proxy import Fault, TcpProxy


def s3_client(server, **extra):
    return boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=server.access_key,
                        aws_secret_access_key=server.secret_key, region_name="us-east-1", **extra)


def put_objects(server, bucket, objects):
    client = s3_client(server)
    for key, data in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)


def assert_filter_types(ad):
    """Every attribute survives the starter's result filter unchanged (name and exact type)."""
    for name in ad.keys():
        expected = RESULT_TYPES.get(name.lower())
        assert expected is not None, f"{name} would be dropped by the starter"
        value = ad.eval(name)
        assert type(value) is expected, f"{name} = {value!r} is not {expected.__name__}"
    for entry in ad.eval("TransferErrorData") if "TransferErrorData" in ad else []:
        for name in entry.keys():
            expected = ERROR_DATA_TYPES.get(name.lower())
            assert expected is not None and type(entry.eval(name)) is expected, f"TransferErrorData.{name}"


def sandbox_leftovers(sandbox):
    """Hidden files in the sandbox besides the starter's own (request, results, job and machine ads)."""
    return sorted(p.name for p in sandbox.rglob(".*")
                  if not p.name.startswith(".cloudio_plugin.") and p.name not in (".job.ad", ".machine.ad"))


# --------------------------------------------------------------------------- query


def test_query_ad_is_what_the_starter_parses(starter):
    rc, out, err = starter.query()
    assert rc == 0 and err == ""
    query = {}
    for line in out.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        ad = classad2.parseOne(line, classad2.ParserType.Old)  # one `Name = expr` per line
        assert len(ad) == 1, line
        query.update({k: ad.eval(k) for k in ad.keys()})
    assert query["MultipleFileSupport"] is True
    assert query["ProtocolVersion"] == 4
    assert query["PluginType"] == "FileTransfer"
    assert isinstance(query["PluginVersion"], str) and query["PluginVersion"]
    methods = [m for m in re.split(r"[,\s]+", query["SupportedMethods"]) if m]
    assert {"s3", "http", "https"} <= set(methods) <= {"s3", "gs", "http", "https"}
    assert all(m.isalnum() for m in methods)  # HTCondor keys plugins by the suffix after + - .
    assert query["StartdAttrs"] in query


def test_administrator_can_narrow_the_methods(starter):
    starter.env["PEGASUS_CLOUDIO_CONDOR_METHODS"] = "s3, ftp"
    rc, out, _ = starter.query()
    assert rc == 0 and 'SupportedMethods = "s3"' in out


def test_missing_bindings_give_one_clear_line(starter, tmp_path):
    fake = tmp_path / "nobindings" / "classad2"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named classad2')\n")
    starter.env["PYTHONPATH"] = str(fake.parent)
    rc, out, err = starter.query()
    assert rc == 3 and out == ""
    assert len(err.strip().splitlines()) == 1 and "pip install 'pegasus-cloudio[condor]'" in err


# --------------------------------------------------------------------------- downloads


def test_download_batch_gets_one_result_ad_per_file(starter, minio, s3_env, bucket):
    objects = {"a.dat": os.urandom(1000), "deep/b.dat": os.urandom(300_000), "empty.dat": b""}
    put_objects(minio, bucket, dict(objects, **{"odd.dat": b"expression-valued Url"}))
    sandbox = starter.sandbox
    urls = {key: f"s3://test@minio/{bucket}/{key}" for key in objects}
    missing = f"s3://test@minio/{bucket}/no-such.dat"
    ads = ['[ PluginData = [ foo = "bar" ] ]', '[ Protocol = "s3"; s3_PluginData = [ x = 1 ] ]']
    ads += [file_ad(url, str(sandbox / os.path.basename(key))) for key, url in urls.items()]
    ads.append(file_ad(missing, str(sandbox / "no-such.dat")))
    odd = f'[ url = strcat("s3://test@minio/", "{bucket}/odd.dat"); LOCALFILENAME = "{sandbox}/odd.dat" ]'
    run = starter.run(ads + [odd], env=dict(starter.env, PEGASUS_CREDENTIALS=s3_env["PEGASUS_CREDENTIALS"]))

    assert run.returncode == 1  # one file failed for good: the job must be held
    assert len(run.ads) == 5
    for ad in run.ads:
        assert_filter_types(ad)
        assert ad.eval("TransferType") == "download" and ad.eval("TransferProtocol") == "s3"
    for key, url in urls.items():
        ad = run.ad_for(url)
        local = sandbox / os.path.basename(key)
        assert ad.eval("TransferSuccess") is True and ad.eval("TransferFileName") == str(local)
        assert ad.eval("TransferTotalBytes") == len(objects[key]) and local.read_bytes() == objects[key]
        assert ad.eval("TransferEndTime") >= ad.eval("TransferStartTime") > 1_600_000_000
    assert (sandbox / "odd.dat").read_bytes() == b"expression-valued Url"
    failed = run.ad_for(missing)
    assert failed.eval("TransferSuccess") is False
    assert missing in failed.eval("TransferError") and "does not exist" in failed.eval("TransferError")
    [entry] = failed.eval("TransferErrorData")
    assert entry.eval("ErrorType") == "Specification" and entry.eval("ErrorCode") == 404
    assert entry.eval("Retryable") == -1 and entry.eval("FailedServer") == f"{minio.host}:{minio.port}"
    assert not (sandbox / "no-such.dat").exists() and sandbox_leftovers(sandbox) == []
    text = run.outfile.read_text()
    assert text.endswith("]\n") and len(text) < PREALLOCATED  # padding truncated after the last ad


def test_malformed_ads_and_foreign_schemes_fail_alone(starter, https_files):
    https_files.objects["/ok.txt"] = b"fine"
    good = https_files.url("/ok.txt")
    ads = [file_ad(good, str(starter.sandbox / "ok.txt")), '[ Url = "https://example.org/x" ]',
           file_ad("ftp://example.org/f", str(starter.sandbox / "f"))]
    starter.env["PEGASUS_CLOUDIO_CA_BUNDLE"] = https_files.ca_file
    run = starter.run(ads)
    assert run.returncode == 1 and len(run.ads) == 3
    assert run.ad_for(good).eval("TransferSuccess") is True
    for url in ("https://example.org/x", "ftp://example.org/f"):
        ad = run.ad_for(url)
        assert_filter_types(ad)
        [entry] = ad.eval("TransferErrorData")
        assert ad.eval("TransferSuccess") is False and entry.eval("ErrorType") == "Parameter"
    assert "LocalFileName" in run.ad_for("https://example.org/x").eval("TransferError")
    assert "not served" in run.ad_for("ftp://example.org/f").eval("TransferError")


def test_flags_in_any_order_and_an_outfile_not_prepared(starter, https_files):
    https_files.objects["/x.bin"] = os.urandom(5000)
    starter.env["PEGASUS_CLOUDIO_CA_BUNDLE"] = https_files.ca_file
    infile, outfile = starter.prepare([file_ad(https_files.url("/x.bin"), str(starter.sandbox / "x.bin"))])
    outfile.unlink()
    import subprocess
    done = subprocess.run([str(starter.plugin), "-outfile", str(outfile), "-future-flag", "-infile", str(infile)],
                          env=starter.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    [ad] = parse_results(outfile.read_text())
    assert ad.eval("TransferSuccess") is True and (starter.sandbox / "x.bin").read_bytes() == https_files.objects["/x.bin"]


@pytest.mark.parametrize("request_text, why", [
    ('[ Url = "{url}"; LocalFileName = ', "ends inside ad 1 (truncated)"),
    ('[ Url = "{url}"; LocalFileName = "/x/a" ][ Url = "{url}"; LocalFileName = "/x', "ends inside ad 2"),
    ("", "holds no ads (empty)"),
    (" \n ", "holds no ads (empty)"),
    ('[ Url = "{url}"; LocalFileName = "/x/a" ] ]', "outside any ad"),
    ('[ Url = "{url}"; LocalFileName = ]', "ad 1 does not parse"),
    ('[ PluginData = [ a = 1 ] ]', "no file ads"),
])
def test_a_request_not_read_whole_is_an_error(starter, https_files, request_text, why):
    """A truncated, empty or unparsable -infile: exit 3, one line naming the file, one failed ad
    (so the starter holds the job rather than requeue it), and no request sent."""
    https_files.objects["/a"] = b"a"
    infile, outfile = starter.prepare([request_text.format(url=https_files.url("/a"))])
    done = subprocess.run(starter.argv(infile, outfile, False), env=starter.env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60)
    assert done.returncode == 3, done.stdout
    [line] = done.stdout.strip().splitlines()
    assert f"cannot read the transfer request {infile}: " in line and why in line
    assert "files transferred" not in done.stdout and https_files.auth_seen == []
    [ad] = parse_results(outfile.read_text())
    assert ad.eval("TransferSuccess") is False and ad.eval("TransferError") in line
    assert sandbox_leftovers(starter.sandbox) == []


def test_brackets_inside_strings_do_not_cut_the_request():
    from pegasus_cloudio.condor.ads import read_file_ads
    text = '[ Url = "https://h/a]b[\\"c"; LocalFileName = "/x/[y]"; Note = \'odd]name\' ][Url="s3://b/k";LocalFileName="/x/k"]'
    files = read_file_ads(text)
    assert [(f.url, f.local) for f in files] == [('https://h/a]b["c', "/x/[y]"), ("s3://b/k", "/x/k")]


# --------------------------------------------------------------------------- uploads


def test_upload_batch_reports_each_file(starter, minio, s3_env, bucket):
    sandbox = starter.sandbox
    (sandbox / "out1.dat").write_bytes(b"first output")
    (sandbox / "sub").mkdir()
    (sandbox / "sub" / "out2.dat").write_bytes(os.urandom(2_000_000))
    dest = f"s3://test@minio/{bucket}/results"
    ads = [file_ad(f"{dest}/out1.dat", str(sandbox / "out1.dat")),
           file_ad(f"{dest}/out2.dat", str(sandbox / "sub" / "out2.dat")),
           file_ad(f"{dest}/never.dat", str(sandbox / "never.dat"))]
    run = starter.run(ads, upload=True, env=dict(starter.env, PEGASUS_CREDENTIALS=s3_env["PEGASUS_CREDENTIALS"]))

    assert run.returncode == 1 and len(run.ads) == 3
    client = s3_client(minio)
    for name, local in (("out1.dat", sandbox / "out1.dat"), ("out2.dat", sandbox / "sub" / "out2.dat")):
        ad = run.ad_for(f"{dest}/{name}")
        assert_filter_types(ad)
        assert ad.eval("TransferSuccess") is True and ad.eval("TransferType") == "upload"
        assert ad.eval("TransferFileName") == str(local) and ad.eval("TransferTotalBytes") == local.stat().st_size
        assert client.get_object(Bucket=bucket, Key=f"results/{name}")["Body"].read() == local.read_bytes()
    failed = run.ad_for(f"{dest}/never.dat")
    assert failed.eval("TransferSuccess") is False and str(sandbox / "never.dat") in failed.eval("TransferError")
    [entry] = failed.eval("TransferErrorData")
    assert entry.eval("ErrorType") == "Specification" and entry.eval("FailedServer") == socket.gethostname()


def test_gcs_upload_then_download_batch(starter, gcs_env, gcs_bucket):
    """gs:// through the scheme registry, on fake-gcs-server (SIGN_S3_URLS = false mode)."""
    starter.env["STORAGE_EMULATOR_HOST"] = gcs_env["STORAGE_EMULATOR_HOST"]
    files = {"g1.dat": os.urandom(4096), "g2.dat": b"second"}
    for name, data in files.items():
        (starter.sandbox / name).write_bytes(data)
    urls = {name: f"gs://{gcs_bucket}/job/{name}" for name in files}
    run = starter.run([file_ad(urls[n], str(starter.sandbox / n)) for n in files], upload=True)
    assert run.returncode == 0, run.output
    assert all(run.ad_for(u).eval("TransferProtocol") == "gs" for u in urls.values())

    fetched = starter.sandbox / "fetched"
    missing = f"gs://{gcs_bucket}/job/absent.dat"
    run = starter.run([file_ad(urls[n], str(fetched / n)) for n in files] + [file_ad(missing, str(fetched / "absent"))])
    assert run.returncode == 1 and len(run.ads) == 3
    for name, data in files.items():
        assert run.ad_for(urls[name]).eval("TransferSuccess") is True and (fetched / name).read_bytes() == data
    [entry] = run.ad_for(missing).eval("TransferErrorData")
    assert entry.eval("ErrorType") == "Specification" and entry.eval("ErrorCode") == 404


# --------------------------------------------------------------------------- credentials


def write_credentials(path, server, secret):
    path.write_text(f"[minio]\nendpoint = {server.endpoint}\n[test@minio]\naccess_key = {server.access_key}\n"
                    f"secret_key = {secret}\n")
    path.chmod(0o600)
    return path


def test_bad_credentials_name_their_source_never_the_secret(starter, minio, bucket, tmp_path):
    creds = write_credentials(tmp_path / "wrong.conf", minio, "wrong-secret-0123456789")
    put_objects(minio, bucket, {"k.dat": b"data"})
    url = f"s3://test@minio/{bucket}/k.dat"
    run = starter.run([file_ad(url, str(starter.sandbox / "k.dat"))], env=dict(starter.env, PEGASUS_CREDENTIALS=str(creds)))
    assert run.returncode == 1
    ad = run.ad_for(url)
    error = ad.eval("TransferError")
    assert "[test@minio]" in error and str(creds) in error and "PEGASUS_CREDENTIALS" in error
    assert "wrong-secret" not in run.output + run.outfile.read_text()
    [entry] = ad.eval("TransferErrorData")
    assert entry.eval("ErrorType") == "Authorization" and entry.eval("Retryable") == -1


def test_group_readable_credentials_say_how_to_fix_them(starter, minio, bucket, tmp_path):
    creds = write_credentials(tmp_path / "open.conf", minio, minio.secret_key)
    creds.chmod(0o644)
    url = f"s3://test@minio/{bucket}/k.dat"
    run = starter.run([file_ad(url, str(starter.sandbox / "k.dat"))], env=dict(starter.env, PEGASUS_CREDENTIALS=str(creds)))
    assert run.returncode == 1
    assert f"chmod 600 {creds}" in run.ad_for(url).eval("TransferError")
    assert run.ad_for(url).eval("TransferErrorData")[0].eval("ErrorType") == "Parameter"


def test_job_variables_with_the_plugin_prefix(starter, minio, bucket):
    put_objects(minio, bucket, {"k.dat": b"via job variable"})
    write_credentials(starter.sandbox / "job-creds.conf", minio, minio.secret_key)  # shipped with the job
    env = dict(starter.env, CLOUDIO_PEGASUS_CREDENTIALS="job-creds.conf", CLOUDIO_PEGASUS_CLOUDIO_THREADS="2",
               CLOUDIO_AWS_SECRET_ACCESS_KEY="do-not-take-me")
    url = f"s3://test@minio/{bucket}/k.dat"
    run = starter.run([file_ad(url, str(starter.sandbox / "k.dat"))], env=env)
    assert run.returncode == 0, run.output
    assert (starter.sandbox / "k.dat").read_bytes() == b"via job variable"
    assert "ignoring job variable CLOUDIO_AWS_SECRET_ACCESS_KEY" in run.output
    assert "do-not-take-me" not in run.output


def test_node_configuration_and_job_override(starter, minio, bucket, tmp_path):
    put_objects(minio, bucket, {"k.dat": b"node-wide"})
    node = tmp_path / "etc"
    node.mkdir()
    write_credentials(node / "credentials.conf", minio, minio.secret_key)
    (node / "condor-plugin.conf").write_text("# node-wide\nPEGASUS_CREDENTIALS = credentials.conf\n"
                                             "PEGASUS_CLOUDIO_CONDOR_METHODS = s3\n")
    starter.env["PEGASUS_CLOUDIO_CONDOR_CONFIG"] = str(node / "condor-plugin.conf")
    rc, out, err = starter.query()
    assert rc == 0 and err == "" and 'SupportedMethods = "s3"' in out
    url = f"s3://test@minio/{bucket}/k.dat"
    run = starter.run([file_ad(url, str(starter.sandbox / "k.dat"))])
    assert run.returncode == 0, run.output
    assert (starter.sandbox / "k.dat").read_bytes() == b"node-wide"

    write_credentials(starter.sandbox / "bad.conf", minio, "not-the-secret")
    other = f"s3://test@minio/{bucket}/other.dat"  # not in the node cache: the bad key must be used
    run = starter.run([file_ad(other, str(starter.sandbox / "k2.dat"))],
                      env=dict(starter.env, CLOUDIO_PEGASUS_CREDENTIALS="bad.conf"))
    assert run.returncode == 1
    assert "CLOUDIO_PEGASUS_CREDENTIALS in the job environment" in run.ad_for(other).eval("TransferError")


def test_job_variables_reach_the_plugin_through_the_job_ad(starter, minio, bucket):
    """HTCondor 23.x passes no job variables to plugins; the job ad carries the job's environment."""
    put_objects(minio, bucket, {"k.dat": b"via the job ad"})
    write_credentials(starter.sandbox / "job creds.conf", minio, minio.secret_key)
    job_ad = starter.write_job_ad(['Environment = "CLOUDIO_PEGASUS_CREDENTIALS=\'job creds.conf\' '
                                   'CLOUDIO_PEGASUS_CLOUDIO_THREADS=2 CLOUDIO_AWS_SECRET_ACCESS_KEY=do-not-take-me '
                                   'OTHER=x"'])
    assert not any(name.startswith("CLOUDIO_") for name in starter.env)
    url = f"s3://test@minio/{bucket}/k.dat"
    run = starter.run([file_ad(url, str(starter.sandbox / "k.dat"))])
    assert run.returncode == 0, run.output
    assert (starter.sandbox / "k.dat").read_bytes() == b"via the job ad"
    assert "ignoring job variable CLOUDIO_AWS_SECRET_ACCESS_KEY" in run.output and "do-not-take-me" not in run.output

    job_ad.write_text('ClusterId = 42\nEnv = "CLOUDIO_PEGASUS_CREDENTIALS=absent.conf;OTHER=y"\n')  # V1 syntax
    run = starter.run([file_ad(url, str(starter.sandbox / "k2.dat"))])
    assert run.returncode == 1
    assert "CLOUDIO_PEGASUS_CREDENTIALS in the job environment" in run.ad_for(url).eval("TransferError")

    job_ad.unlink()
    run = starter.run([file_ad(url, str(starter.sandbox / "k3.dat"))])
    assert run.returncode == 3
    [line] = run.output.strip().splitlines()
    assert f"cannot read the job ad {job_ad}" in line and not (starter.sandbox / "k3.dat").exists()


def test_starter_variables_win_over_the_job_ad_only_where_they_agree(tmp_path):
    """24.3+ starters pass the same <PLUGIN>_* variables: the two sources are one layer."""
    from pegasus_cloudio.condor.environment import build_environment
    from pegasus_cloudio.condor.jobenv import split_v2
    ad = tmp_path / ".job.ad"
    ad.write_text('Environment = "CLOUDIO_PEGASUS_CLOUDIO_THREADS=3 CLOUDIO_AWS_REGION=\'it\'\'s\'"\n')
    env = {"_CONDOR_JOB_AD": str(ad), "CLOUDIO_PEGASUS_CLOUDIO_THREADS": "5",
           "PEGASUS_CLOUDIO_CONDOR_CONFIG": "", "HOME": str(tmp_path)}
    penv = build_environment(env, "/libexec/cloudio_plugin", str(tmp_path))
    assert penv.env["PEGASUS_CLOUDIO_THREADS"] == "5" and penv.env["AWS_REGION"] == "it's"
    assert split_v2("a=1  'b=two words' c='x''y'", "ad") == ["a=1", "b=two words", "c=x'y"]
    with pytest.raises(ValueError, match="unclosed quote"):
        split_v2("a='open", str(ad))


# --------------------------------------------------------------------------- many failures


def test_two_hundred_failures_give_a_short_hold_reason_naming_the_first_url(starter, minio, bucket, tmp_path):
    """200 files denied: the starter's joined error text stays far below its 64 KiB pipe read
    (23.9 restarted the job forever at ~90 KB), begins with the first URL and the count."""
    (tmp_path / "long-directory-name" / "of-credentials").mkdir(parents=True)
    creds = write_credentials(tmp_path / "long-directory-name" / "of-credentials" / "wrong.conf", minio, "wrong-secret")
    urls = [f"s3://test@minio/{bucket}/inputs/file-{n:03d}.dat" for n in range(200)]
    run = starter.run([file_ad(u, str(starter.sandbox / os.path.basename(u))) for u in urls],
                      env=dict(starter.env, PEGASUS_CREDENTIALS=str(creds)))
    assert run.returncode == 1
    assert 1 <= len(run.ads) <= 10 and all(ad.eval("TransferSuccess") is False for ad in run.ads)
    assert all(len(repr(ad)) < 3000 for ad in run.ads)  # one pipe message each, well below PIPE_BUF
    details = hold_reason_details(run, str(starter.plugin))
    assert len(details) < 16384, len(details)
    first = details.split("|Error: ", 1)[1]
    assert first.startswith(f"Download of {urls[0]} failed: access denied")
    assert "the first of 200 failed files, out of 200" in first
    assert first.index(f"( URL file = {urls[0]} )") > 0
    assert run.output.count("failed: access denied") == 200  # every failure in the plugin's output
    assert "0 of 200 files transferred; exit code 1" in run.output


def test_long_errors_are_cut_in_the_ad_not_in_the_output(starter, https_files):
    long_path = "/missing/" + "d" * 800 + ".dat"
    starter.env["PEGASUS_CLOUDIO_CA_BUNDLE"] = https_files.ca_file
    run = starter.run([file_ad(https_files.url(long_path), str(starter.sandbox / "x.dat"))])
    assert run.returncode == 1
    [ad] = run.ads
    assert len(ad.eval("TransferError")) <= 500 and ad.eval("TransferError").endswith("...")
    assert all(len(e.eval("ErrorString")) <= 200 for e in ad.eval("TransferErrorData"))
    assert https_files.url(long_path) in run.output


# --------------------------------------------------------------------------- config files


def test_an_unreadable_default_config_file_does_not_stop_a_transfer(starter, https_files, tmp_path):
    """HOME=/root seen by a job's user: ~/.pegasus/cloudio.conf cannot be opened (here: a directory)."""
    home = tmp_path / "root-home"
    (home / ".pegasus" / "cloudio.conf").mkdir(parents=True)
    https_files.objects["/in.dat"] = b"needs no config"
    env = dict(starter.env, HOME=str(home), PEGASUS_CLOUDIO_CA_BUNDLE=https_files.ca_file)
    del env["PEGASUS_CLOUDIO_CONFIG"]
    run = starter.run([file_ad(https_files.url("/in.dat"), str(starter.sandbox / "in.dat"))], env=env)
    assert run.returncode == 0, run.output
    assert (starter.sandbox / "in.dat").read_bytes() == b"needs no config"

    named = home / ".pegasus" / "cloudio.conf"
    run = starter.run([file_ad(https_files.url("/in.dat"), str(starter.sandbox / "in2.dat"))],
                      env=dict(env, PEGASUS_CLOUDIO_CONFIG=str(named)))
    assert run.returncode == 1 and not (starter.sandbox / "in2.dat").exists()
    error = run.ads[0].eval("TransferError")
    assert f"cannot read config file {named} (named by PEGASUS_CLOUDIO_CONFIG)" in error
    assert len(error.splitlines()) == 1 and len(https_files.auth_seen) == 1  # no request for the second run


# --------------------------------------------------------------------------- a dying server


@pytest.fixture
def behind_proxy(minio, bucket, tmp_path, starter):
    """(proxy, urls, ads): four objects a, b, slow, c fetched in that order through a proxy."""
    with TcpProxy((minio.host, minio.port)) as proxy:
        creds = minio.write_pegasus_credentials(tmp_path / "proxied.conf", endpoint=proxy.url())
        names = ["a.dat", "b.dat", "slow.dat", "c.dat"]
        put_objects(minio, bucket, {n: n.encode() * 1000 for n in names})
        urls = [f"s3://test@minio/{bucket}/{n}" for n in names]
        starter.env.update(PEGASUS_CREDENTIALS=str(creds), PEGASUS_CLOUDIO_THREADS="1")
        yield proxy, urls, [file_ad(u, str(starter.sandbox / n)) for u, n in zip(urls, names)]


def wait_until(condition, what, limit=60.0):
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def test_killed_server_is_a_transient_failure(starter, behind_proxy):
    proxy, urls, ads = behind_proxy
    proxy.set_faults([Fault.stall(60, method="GET", path="slow.dat")])
    proc, outfile = starter.start(ads)
    wait_until(lambda: proxy.pending_faults() == 0, "the request for slow.dat")
    proxy.stop()  # the server is gone: in-flight request cut, new connections refused
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 11, output  # 11 << 8: the administrator's release policy retries it
    results = parse_results(outfile.read_text())
    assert len(results) == 4
    by_url = {ad.eval("TransferUrl"): ad for ad in results}
    assert by_url[urls[0]].eval("TransferSuccess") and by_url[urls[1]].eval("TransferSuccess")
    for url in urls[2:]:
        ad = by_url[url]
        assert_filter_types(ad)
        assert ad.eval("TransferSuccess") is False and "retrying later may succeed" in ad.eval("TransferError")
        assert all(e.eval("Retryable") == 0 for e in ad.eval("TransferErrorData"))
    assert by_url[urls[3]].eval("TransferErrorData")[-1].eval("ErrorType") == "Contact"
    assert sandbox_leftovers(starter.sandbox) == [] and not (starter.sandbox / "slow.dat").exists()


def test_sigterm_reports_every_file_and_leaves_no_partial_file(starter, behind_proxy):
    proxy, urls, ads = behind_proxy
    proxy.set_faults([Fault.stall(2, after_bytes=100, method="GET", path="slow.dat")])
    proc, outfile = starter.start(ads)
    wait_until(lambda: proxy.pending_faults() == 0, "the request for slow.dat")
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 11, output
    results = {ad.eval("TransferUrl"): ad for ad in parse_results(outfile.read_text())}
    assert set(results) == set(urls)
    assert "interrupted by signal 15" in results[urls[3]].eval("TransferError")
    assert sandbox_leftovers(starter.sandbox) == []


def _running(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_plugin_stops_when_the_starter_kills_its_parent(starter, behind_proxy):
    """condor_rm mid-transfer: the starter SIGKILLs its transfer process, the plugin's parent."""
    proxy, urls, ads = behind_proxy
    proxy.set_faults([Fault.stall(60, after_bytes=100, method="GET", path="slow.dat")])
    infile, outfile = starter.prepare(ads)
    spawn = "import subprocess, sys; p = subprocess.Popen(sys.argv[1:]); print(p.pid, flush=True); p.wait()"
    parent = subprocess.Popen([sys.executable, "-c", spawn, *starter.argv(infile, outfile, False)], env=starter.env,
                              stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    wait_until(lambda: proxy.pending_faults() == 0, "the request for slow.dat")
    parent.kill()
    parent.wait()
    wait_until(lambda: not _running(pid), "the orphaned plugin to stop", 30)
    results = {ad.eval("TransferUrl"): ad for ad in parse_results(outfile.read_text())}
    assert set(results) == set(urls)
    assert "interrupted by signal 15" in results[urls[2]].eval("TransferError")
    slow = starter.sandbox / "slow.dat"  # a transfer in flight may finish (verified) before the plugin stops
    assert not slow.exists() or slow.read_bytes() == b"slow.dat" * 1000
    assert sandbox_leftovers(starter.sandbox) == []


# --------------------------------------------------------------------------- https


@pytest.fixture
def presigner(minio_tls):
    """Signs like HTCondor's shadow: SigV4 in the query string, only ``host`` signed."""
    client = s3_client(minio_tls, verify=str(minio_tls.ca_file), config=Config(signature_version="s3v4"))
    if "presigned" not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket="presigned")
    return client


def test_presigned_https_urls_download_and_upload(starter, minio_tls, presigner):
    """What HTCondor hands over for s3:// URLs when the submit file carries key files."""
    data = os.urandom(100_000)
    presigner.put_object(Bucket="presigned", Key="in.dat", Body=data)
    get_url = presigner.generate_presigned_url("get_object", Params={"Bucket": "presigned", "Key": "in.dat"})
    put_url = presigner.generate_presigned_url("put_object", Params={"Bucket": "presigned", "Key": "out.dat"})
    starter.env["PEGASUS_CLOUDIO_CA_BUNDLE"] = str(minio_tls.ca_file)

    run = starter.run([file_ad(get_url, str(starter.sandbox / "in.dat"))])
    assert run.returncode == 0, run.output
    ad = run.ad_for(get_url)
    assert ad.eval("TransferProtocol") == "https" and (starter.sandbox / "in.dat").read_bytes() == data

    (starter.sandbox / "out.dat").write_bytes(data[::-1])
    v2_client = s3_client(minio_tls, verify=str(minio_tls.ca_file), config=Config(signature_version="s3"))
    v2_url = v2_client.generate_presigned_url("put_object", Params={"Bucket": "presigned", "Key": "out-v2.dat"})
    run = starter.run([file_ad(put_url, str(starter.sandbox / "out.dat")),
                       file_ad(v2_url, str(starter.sandbox / "out.dat"))], upload=True)
    assert run.returncode == 0, run.output
    assert_filter_types(run.ad_for(put_url))
    for key in ("out.dat", "out-v2.dat"):
        assert presigner.get_object(Bucket="presigned", Key=key)["Body"].read() == data[::-1]

    forged = re.sub(r"X-Amz-Signature=[0-9a-f]+", "X-Amz-Signature=" + "0" * 64, get_url)
    run = starter.run([file_ad(forged, str(starter.sandbox / "forged.dat"))])
    assert run.returncode == 1
    error = run.ad_for(forged).eval("TransferError")
    assert "pre-signs" in error and "X-Amz-Signature" not in error and "X-Amz-Credential" not in run.output
    assert run.ad_for(forged).eval("TransferErrorData")[0].eval("ErrorType") == "Authorization"


def test_bearer_tokens_from_condor_creds(starter, https_files, condor_creds):
    https_files.objects["/private/in.dat"] = b"token-protected"
    starter.env.update(PEGASUS_CLOUDIO_CA_BUNDLE=https_files.ca_file, _CONDOR_CREDS=str(condor_creds))
    private = https_files.url("/private/in.dat", scheme="scitokens+https")
    run = starter.run([file_ad(private, str(starter.sandbox / "in.dat")),
                       file_ad(https_files.url("/private/in.dat"), str(starter.sandbox / "anon.dat")),
                       file_ad(https_files.url("/public/absent.dat"), str(starter.sandbox / "absent.dat"))])
    assert run.returncode == 1 and len(run.ads) == 3
    assert run.ad_for(private).eval("TransferSuccess") is True
    assert run.ad_for(private).eval("TransferProtocol") == "https"
    assert (starter.sandbox / "in.dat").read_bytes() == b"token-protected"
    denied = run.ad_for(https_files.url("/private/in.dat")).eval("TransferErrorData")[0]
    assert denied.eval("ErrorType") == "Authorization" and denied.eval("FailureType") == "Authentication"
    absent = run.ad_for(https_files.url("/public/absent.dat"))
    assert https_files.url("/public/absent.dat") in absent.eval("TransferError")
    assert absent.eval("TransferErrorData")[0].eval("ErrorType") == "Specification"

    (starter.sandbox / "result.dat").write_bytes(b"uploaded with a token")
    upload = https_files.url("/private/result.dat", scheme="scitokens+https")
    run = starter.run([file_ad(upload, str(starter.sandbox / "result.dat"))], upload=True)
    assert run.returncode == 0, run.output
    assert https_files.objects["/private/result.dat"] == b"uploaded with a token"
    assert https_files.token not in run.output + run.outfile.read_text()


def test_tls_is_verified(starter, https_files):
    https_files.objects["/x"] = b"x"
    run = starter.run([file_ad(https_files.url("/x"), str(starter.sandbox / "x"))])
    assert run.returncode == 1
    [entry] = run.ads[0].eval("TransferErrorData")
    assert entry.eval("ErrorType") == "Authorization" and entry.eval("FailureType") == "Authentication"
    assert "certificate" in run.ads[0].eval("TransferError") and not (starter.sandbox / "x").exists()


# --------------------------------------------------------------------------- pure helpers


@pytest.mark.parametrize("path, name", [
    ("/usr/libexec/condor/cloudio_plugin", "CLOUDIO"), ("/x/my_plugin.py", "MY"), ("fetch.py", "FETCH"),
    ("/x/pegasus-cloudio-condor-plugin", "PEGASUS-CLOUDIO-CONDOR-PLUGIN")])
def test_plugin_name_follows_htcondor(path, name):
    from pegasus_cloudio.condor.environment import plugin_name
    assert plugin_name(path) == name


def test_messages_never_show_signatures_or_passwords():
    from pegasus_cloudio.condor.outcome import safe_url
    assert safe_url("https://h/b/k?X-Amz-Signature=abc&X-Amz-Credential=AK") == "https://h/b/k?<query hidden>"
    assert safe_url("tok+https://user:pw@h:8443/p") == "tok+https://user:***@h:8443/p"
    assert safe_url("s3://joe@site/b/k") == "s3://joe@site/b/k"


def test_job_variables_map_to_library_names_and_refuse_secrets(tmp_path):
    from pegasus_cloudio.condor.environment import build_environment
    env = {"CLOUDIO_PEGASUS_CREDENTIALS": "c.conf", "cloudio_pegasus_credentials_My-Site": "/abs/s.conf",
           "CLOUDIO_AWS_SECRET_ACCESS_KEY": "x", "CLOUDIO_PEGASUS_CLOUDIO_THREADS": "4",
           "PEGASUS_CLOUDIO_CONDOR_CONFIG": str(tmp_path / "absent.conf")}
    with pytest.raises(ValueError, match="absent.conf"):
        build_environment(env, "/libexec/cloudio_plugin", str(tmp_path))
    del env["PEGASUS_CLOUDIO_CONDOR_CONFIG"]
    penv = build_environment(env, "/libexec/cloudio_plugin", str(tmp_path))
    assert penv.env["PEGASUS_CREDENTIALS"] == str(tmp_path / "c.conf")
    assert penv.env["PEGASUS_CREDENTIALS_My-Site"] == "/abs/s.conf"
    assert penv.env["PEGASUS_CLOUDIO_THREADS"] == "4" and "AWS_SECRET_ACCESS_KEY" not in penv.env
    assert penv.refused == ["CLOUDIO_AWS_SECRET_ACCESS_KEY"]
    assert penv.origin("PEGASUS_CREDENTIALS") == "CLOUDIO_PEGASUS_CREDENTIALS in the job environment"
