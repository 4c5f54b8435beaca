"""Credentials are found where Pegasus and AWS look, refused when unsafe, and never printed."""

import os

import pytest

from transfer.backends.aws_chain import aws_s3_config
from transfer.credentials import (
    PegasusCredentialsFile,
    pegasus_credentials_path,
    pegasus_s3_config,
)
from transfer.errors import ConfigError

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


def write_creds(path, mode=0o600, body=None):
    path.write_text(body or (
        "[amazon]\nendpoint = https://s3.us-west-2.amazonaws.com/\nregion = us-west-2\n"
        f"[joe@amazon]\naccess_key = AKIAEXAMPLE\nsecret_key = {SECRET}\n"
        "[https://data.example.org]\nheader.Private-Token = tok123\n"))
    os.chmod(path, mode)
    return str(path)


def test_site_specific_variable_wins_with_dashes_as_underscores(tmp_path):
    env = {"PEGASUS_CREDENTIALS": "/generic", "PEGASUS_CREDENTIALS_my_site": "/specific", "HOME": "/h"}
    assert pegasus_credentials_path("my-site", env) == "/specific"
    assert pegasus_credentials_path("other", env) == "/generic"
    assert pegasus_credentials_path(None, {"HOME": "/h"}) == "/h/.pegasus/credentials.conf"


def test_s3_identity_resolves_endpoint_region_and_keys(tmp_path):
    creds = PegasusCredentialsFile(write_creds(tmp_path / "c.conf"))
    config = pegasus_s3_config(creds, "joe@amazon")
    assert config.endpoint == "https://s3.us-west-2.amazonaws.com"
    assert config.region == "us-west-2"
    assert config.credentials.access_key == "AKIAEXAMPLE"
    assert SECRET not in repr(config)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_group_or_world_readable_file_is_refused_with_the_fix(tmp_path, mode):
    path = write_creds(tmp_path / "c.conf", mode=mode)
    with pytest.raises(ConfigError) as info:
        PegasusCredentialsFile(path)
    assert f"chmod 600 {path}" in str(info.value)


def test_missing_identity_section_is_named_and_secret_free(tmp_path):
    creds = PegasusCredentialsFile(write_creds(tmp_path / "c.conf"))
    with pytest.raises(ConfigError) as info:
        pegasus_s3_config(creds, "ann@amazon")
    assert "[ann@amazon]" in str(info.value)
    assert SECRET not in str(info.value)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        PegasusCredentialsFile(str(tmp_path / "absent.conf"))
    assert "not found" in str(info.value)


def test_http_headers_by_origin(tmp_path):
    creds = PegasusCredentialsFile(write_creds(tmp_path / "c.conf"))
    assert creds.headers_for("https", "data.example.org") == {"private-token": "tok123"}  # names are case-insensitive
    assert creds.headers_for("https", "elsewhere.org") == {}


def test_aws_chain_environment_then_shared_files(tmp_path):
    env = {"HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": "AKENV", "AWS_SECRET_ACCESS_KEY": "s",
           "AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9/"}
    config = aws_s3_config(env)
    assert (config.credentials.access_key, config.region, config.endpoint) == ("AKENV", "eu-west-1", "http://127.0.0.1:9")
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[dev]\naws_access_key_id = AKFILE\naws_secret_access_key = s2\n")
    (tmp_path / ".aws" / "config").write_text("[profile dev]\nregion = ap-south-1\n")
    config = aws_s3_config({"HOME": str(tmp_path), "AWS_PROFILE": "dev"})
    assert (config.credentials.access_key, config.region) == ("AKFILE", "ap-south-1")
