"""Settings come from PEGASUS_CLOUDIO_* variables and a config file with the same names."""

import pytest

from transfer.config import Settings, parse_size
from transfer.errors import InvalidInput


def test_defaults_without_environment(tmp_path):
    settings = Settings.from_env({"HOME": str(tmp_path)})
    assert settings == Settings()


def test_environment_overrides_config_file(tmp_path):
    conf = tmp_path / "cloudio.conf"
    conf.write_text("# site defaults\nPEGASUS_CLOUDIO_THREADS = 12\nPEGASUS_CLOUDIO_MULTIPART_THRESHOLD = 32M\n")
    env = {"PEGASUS_CLOUDIO_CONFIG": str(conf), "PEGASUS_CLOUDIO_THREADS": "3"}
    settings = Settings.from_env(env)
    assert settings.threads == 3
    assert settings.multipart_threshold == 32 << 20


def test_bad_value_names_the_variable(tmp_path):
    with pytest.raises(InvalidInput) as info:
        Settings.from_env({"HOME": str(tmp_path), "PEGASUS_CLOUDIO_THREADS": "many"})
    assert "PEGASUS_CLOUDIO_THREADS" in str(info.value)


def test_bad_config_line_names_the_file_and_line(tmp_path):
    conf = tmp_path / "c.conf"
    conf.write_text("PEGASUS_CLOUDIO_THREADS = 2\nthreads: 4\n")
    with pytest.raises(InvalidInput) as info:
        Settings.from_env({"PEGASUS_CLOUDIO_CONFIG": str(conf)})
    assert str(conf) in str(info.value) and "line 2" in str(info.value)


def test_explicit_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(InvalidInput):
        Settings.from_env({"PEGASUS_CLOUDIO_CONFIG": str(tmp_path / "absent.conf")})


def test_part_size_below_s3_minimum_is_refused(tmp_path):
    with pytest.raises(InvalidInput):
        Settings.from_env({"HOME": str(tmp_path), "PEGASUS_CLOUDIO_MULTIPART_PART_SIZE": "1M"})


@pytest.mark.parametrize("text,value", [("1048576", 1 << 20), ("8M", 8 << 20), ("64MiB", 64 << 20), ("1g", 1 << 30)])
def test_sizes(text, value):
    assert parse_size(text) == value
