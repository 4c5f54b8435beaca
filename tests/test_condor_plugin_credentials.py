"""The HTCondor plugin's credentials, driven as condor_starter drives it (tests/fixtures_condor.py).

Where each credential comes from and what a message may show: Pegasus credentials files named
by job variables (from the starter's environment or, on 23.x, from the job ad), node
configuration, presigned HTTPS URLs, bearer tokens from ``$_CONDOR_CREDS``, verified TLS; and
that no signature, password or secret reaches a message or the job's variables.
"""

from __future__ import annotations

import os
import re

from botocore.config import Config
import pytest
from fixtures_condor import assert_filter_types, file_ad, put_objects, s3_client, write_credentials


# --------------------------------------------------------------------------- credentials


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



def test_the_node_gcs_key_stays_with_the_node_endpoint(tmp_path):
    from pegasus_cloudio.condor.environment import build_environment, keep_node_keys_home
    node = {"GOOGLE_APPLICATION_CREDENTIALS": "/etc/key.json", "PEGASUS_CLOUDIO_CONDOR_CONFIG": "",
            "HOME": str(tmp_path)}
    assert keep_node_keys_home(build_environment(dict(node, STORAGE_EMULATOR_HOST="emu:1"), "/x/cloudio_plugin",
                                                 str(tmp_path))) == []
    # a 24.3+ starter copies the job's <PLUGIN>_* variables under their own names: a plugin
    # installed as storage_plugin gets the job's STORAGE_EMULATOR_HOST as is
    penv = build_environment(dict(node, STORAGE_EMULATOR_HOST="job-host:80"), "/x/storage_plugin", str(tmp_path))
    [note] = keep_node_keys_home(penv)
    assert "GOOGLE_APPLICATION_CREDENTIALS" not in penv.env and "not using the node's GCS key" in note
    penv = build_environment(dict(node, CLOUDIO_STORAGE_EMULATOR_HOST="job-host:80",
                                  CLOUDIO_GOOGLE_APPLICATION_CREDENTIALS="/job/key.json"), "/x/cloudio_plugin",
                             str(tmp_path))
    assert keep_node_keys_home(penv) == [] and penv.env["GOOGLE_APPLICATION_CREDENTIALS"] == "/job/key.json"
    # the endpoint in a settings file the administrator names is the node's; in the job's, not
    from pegasus_cloudio.condor.plugin import settings_for
    admin = tmp_path / "admin.conf"
    admin.write_text("PEGASUS_CLOUDIO_GCS_ENDPOINT = https://gcs.site.example\n")
    for config, kept in ((str(admin), True), ("", False)):
        (tmp_path / ".pegasus").mkdir(exist_ok=True)
        (tmp_path / ".pegasus" / "cloudio.conf").write_text("PEGASUS_CLOUDIO_GCS_ENDPOINT = http://job-host:80\n")
        penv = build_environment(dict(node, PEGASUS_CLOUDIO_CONFIG=config), "/x/cloudio_plugin", str(tmp_path))
        settings_for(penv)
        assert ("GOOGLE_APPLICATION_CREDENTIALS" in penv.env) is kept, config


def test_a_job_cannot_send_the_nodes_gcs_token_to_its_own_endpoint(starter, gcs_key, tmp_path):
    """The administrator's GCS key (plugin environment) is for Google's endpoint: a job that sets
    CLOUDIO_STORAGE_EMULATOR_HOST (or ..._PEGASUS_CLOUDIO_GCS_ENDPOINT) to a host of its own must
    not receive the bearer token minted from that key."""
    from fixtures_condor import HttpsFiles
    from fixtures_gcs import ACCESS_TOKEN

    with HttpsFiles(tmp_path / "plain", tls=False) as catcher:
        starter.env["GOOGLE_APPLICATION_CREDENTIALS"] = str(gcs_key.path)
        for variable, value in (("STORAGE_EMULATOR_HOST", catcher.url("").split("://", 1)[1]),
                                ("PEGASUS_CLOUDIO_GCS_ENDPOINT", catcher.url(""))):
            starter.write_job_ad([f'Environment = "CLOUDIO_{variable}={value}"'])
            run = starter.run([file_ad("gs://bucket/data.bin", str(starter.sandbox / "data.bin"))])
            assert not any(seen and ACCESS_TOKEN in seen for seen in catcher.auth_seen), variable
            assert run.returncode != 0 and not (starter.sandbox / "data.bin").exists()
            assert f"CLOUDIO_{variable}" in run.output


@pytest.mark.parametrize("mode, owner", [(0o666, 0), (0o664, 0), (0o644, 12345)])
def test_a_node_configuration_other_users_can_change_is_refused(starter, https_files, tmp_path, mode, owner):
    """The node file names every job's credentials, endpoints and CA: one another pool user can
    write (or owns) would let them redirect every job's transfers. One line naming the file,
    no request, the job held."""
    https_files.objects["/in.dat"] = b"x"
    node = tmp_path / "condor-plugin.conf"
    node.write_text(f"PEGASUS_CLOUDIO_CA_BUNDLE = {https_files.ca_file}\n")
    node.chmod(mode)
    os.chown(node, owner, 0)
    starter.env["PEGASUS_CLOUDIO_CONDOR_CONFIG"] = str(node)
    run = starter.run([file_ad(https_files.url("/in.dat"), str(starter.sandbox / "in.dat"))])
    assert run.returncode == 3, run.output
    [line] = run.output.strip().splitlines()
    assert f"node configuration {node}" in line and ("chmod" in line or "owned by" in line)
    assert https_files.auth_seen == [] and not (starter.sandbox / "in.dat").exists()
    rc, out, _ = starter.query()  # the query still answers (the file counts as unset there)
    assert rc == 0 and "SupportedMethods" in out


def test_credentials_are_not_taken_from_another_users_home(starter, minio, bucket, tmp_path):
    """The starter hands the plugin its own HOME (whoever started condor_master): files there
    belong to another user, who would then choose this job's credentials, endpoints and CA."""
    put_objects(minio, bucket, {"k.dat": b"theirs"})
    other = tmp_path / "home-of-someone-else"
    (other / ".pegasus").mkdir(parents=True)
    creds = write_credentials(other / ".pegasus" / "credentials.conf", minio, minio.secret_key)
    for path in (other, other / ".pegasus", creds):
        os.chown(path, 12345, 12345)
    url = f"s3://test@minio/{bucket}/k.dat"
    run = starter.run([file_ad(url, str(starter.sandbox / "k.dat"))], env=dict(starter.env, HOME=str(other)))
    assert run.returncode == 1, run.output
    assert not (starter.sandbox / "k.dat").exists() and str(other) not in run.output
