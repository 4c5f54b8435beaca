"""Bad S3 input gets a one-line error naming the URL or setting, and nothing is sent."""

import pytest

from pegasus_cloudio_testbed.scripted import ScriptedServer
from transfer import Session, Settings, parse_url
from transfer.errors import ConfigError, InvalidInput


@pytest.fixture
def fake(tmp_path):
    with ScriptedServer() as server:
        yield server


def _session(tmp_path, endpoint, region=None):
    creds = tmp_path / "c.conf"
    creds.write_text(f"[site]\nendpoint = {endpoint}\n" + (f"region = {region}\n" if region else "")
                     + "[u@site]\naccess_key = a\nsecret_key = b\n")
    creds.chmod(0o600)
    return Session(Settings(), {"PEGASUS_CREDENTIALS": str(creds), "HOME": str(tmp_path)}), creds


def _one_line(err):
    text = str(err)
    assert "\n" not in text and text
    return text


@pytest.mark.parametrize("bucket", ["ab", "a" * 64, "Bad..dots", "-dash", "dash-", "192.168.1.2", "sp ace",
                                    "under_score_", "ümlaut"])
def test_invalid_bucket_names_are_refused_before_sending(tmp_path, fake, bucket):
    session, _ = _session(tmp_path, fake.endpoint)
    url = parse_url(f"s3://u@site/{bucket}/key")
    with session, pytest.raises(InvalidInput) as info:
        session.backend(url).stat(url)
    text = _one_line(info.value)
    assert "bucket" in text and f"s3://u@site/{bucket}/key" in text
    assert fake.requests == []


def test_a_key_over_1024_bytes_is_refused_naming_its_size(tmp_path, fake):
    session, _ = _session(tmp_path, fake.endpoint)
    url = parse_url("s3://u@site/bucket/" + "é" * 513)  # 1,026 bytes of UTF-8
    with session, pytest.raises(InvalidInput) as info:
        session.backend(url).get(url, open("/dev/null", "wb"))
    assert "1026 bytes" in _one_line(info.value) and "1024" in str(info.value)
    assert fake.requests == []


@pytest.mark.parametrize("endpoint", ["s3.example.org", "ftp://s3.example.org", "https://s3.example.org/prefix",
                                      "https://user@s3.example.org", "https://s3.example.org:99999",
                                      "https://s3 example.org", "https://s3.example.org?x=1"])
def test_malformed_endpoints_name_the_credentials_file_and_section(tmp_path, endpoint):
    session, creds = _session(tmp_path, endpoint)
    url = parse_url("s3://u@site/bucket/key")
    with session, pytest.raises(ConfigError) as info:
        session.backend(url)
    text = _one_line(info.value)
    assert "endpoint" in text and f"{creds} [site]" in text


@pytest.mark.parametrize("region", ["us west 2", "../../x", "US-WEST-2"])
def test_malformed_regions_are_refused(tmp_path, fake, region):
    session, creds = _session(tmp_path, fake.endpoint, region)
    url = parse_url("s3://u@site/bucket/key")
    with session, pytest.raises(ConfigError) as info:
        session.backend(url)
    assert "region" in _one_line(info.value) and str(creds) in str(info.value)


def test_good_names_pass(tmp_path, fake):
    session, _ = _session(tmp_path, fake.endpoint, "eu-central-1")
    with session:
        for text in ("s3://u@site/my.bucket-1/k", "s3://u@site/Legacy_Bucket/k", "s3://u@site/abc/" + "k" * 1024):
            url = parse_url(text)
            session.backend(url).stat(url)
    assert len(fake.requests) == 3


def test_rm_with_a_non_utf8_list_is_one_line_and_sends_nothing(tmp_path, fake):
    """Before: a UnicodeDecodeError traceback."""
    import os
    import subprocess
    import sys
    _, creds = _session(tmp_path, fake.endpoint)
    listing = tmp_path / "urls.txt"
    listing.write_bytes(b"s3://u@site/bucket/a\ns3://u@site/bucket/caf\xe9\n")
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.s3cli.main", "rm", "-F", str(listing)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env=dict(os.environ, PEGASUS_CREDENTIALS=str(creds), HOME=str(tmp_path)))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.splitlines()
    assert str(listing) in line and "line 2" in line and "UTF-8" in line
    assert fake.requests == []


def test_the_library_asks_no_instance_metadata_off_ec2(tmp_path):
    """Before: with no credentials, the chain sent a PUT to 169.254.169.254. The link runs only
    on a machine whose firmware says EC2, or when its endpoint is named (tests, proxies)."""
    from transfer.backends.aws_chain import aws_s3_config, on_ec2
    with pytest.raises(ConfigError) as info:
        aws_s3_config({"HOME": str(tmp_path)})  # this machine: no AWS firmware markers
    assert "not an EC2 instance" in str(info.value)
    vendor = tmp_path / "sys_vendor"
    vendor.write_text("Amazon EC2\n")
    assert on_ec2([(str(tmp_path / "absent"), "ec2"), (str(vendor), "amazon ec2")])
    vendor.write_text("QEMU\n")
    assert not on_ec2([(str(vendor), "amazon ec2")])
