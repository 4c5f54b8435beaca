"""Settings come from PEGASUS_CLOUDIO_* variables and, when asked, a config file with the same names."""

import pytest

from transfer import Session
from transfer.config import Settings, parse_size
from transfer.errors import InvalidInput
from transfer.knobs import layered


def test_defaults_without_environment(tmp_path):
    settings = Settings.from_env({"HOME": str(tmp_path)})
    assert settings == Settings()


def test_environment_overrides_config_file(tmp_path):
    conf = tmp_path / "cloudio.conf"
    conf.write_text("# site defaults\nPEGASUS_CLOUDIO_THREADS = 12\nPEGASUS_CLOUDIO_MULTIPART_THRESHOLD = 32M\n")
    env = {"PEGASUS_CLOUDIO_CONFIG": str(conf), "PEGASUS_CLOUDIO_THREADS": "3"}
    settings = Settings.from_env(env, config_file=True)
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
        Settings.from_env({"PEGASUS_CLOUDIO_CONFIG": str(conf)}, config_file=True)
    assert str(conf) in str(info.value) and "line 2" in str(info.value)


def test_explicit_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(InvalidInput):
        Settings.from_env({"PEGASUS_CLOUDIO_CONFIG": str(tmp_path / "absent.conf")}, config_file=True)


def test_part_size_below_s3_minimum_is_refused(tmp_path):
    with pytest.raises(InvalidInput):
        Settings.from_env({"HOME": str(tmp_path), "PEGASUS_CLOUDIO_MULTIPART_PART_SIZE": "1M"})


@pytest.mark.parametrize("text,value", [("1048576", 1 << 20), ("8M", 8 << 20), ("64MiB", 64 << 20), ("1g", 1 << 30),
                                        (" 2 K ", 2 << 10), ("3KB", 3 << 10), ("7b", 7)])
def test_sizes(text, value):
    assert parse_size(text) == value


def home_with_config(tmp_path, text):
    conf = tmp_path / ".pegasus" / "cloudio.conf"
    conf.parent.mkdir(exist_ok=True)
    conf.write_bytes(text if isinstance(text, bytes) else text.encode())
    return conf


def test_the_library_reads_the_config_file_only_when_asked(tmp_path):
    home_with_config(tmp_path, "PEGASUS_CLOUDIO_THREADS = 13\n")
    env = {"HOME": str(tmp_path)}
    assert Settings.from_env(env).threads == 8
    with Session(env=env) as session:  # the library's front door: arguments and environment only
        assert session.settings.threads == 8
    assert Settings.from_env(env, config_file=True).threads == 13


def test_a_non_utf8_byte_in_the_config_file_is_one_error_naming_file_and_line(tmp_path):
    conf = home_with_config(tmp_path, b"PEGASUS_CLOUDIO_THREADS = 2\nPEGASUS_CLOUDIO_BUNDLE = \xff\n")
    with pytest.raises(InvalidInput) as info:
        Settings.from_env({"HOME": str(tmp_path)}, config_file=True)
    assert str(conf) in str(info.value) and "line 2" in str(info.value) and "UTF-8" in str(info.value)


def test_an_unreadable_default_config_file_is_skipped_with_a_warning(tmp_path, caplog):
    conf = tmp_path / ".pegasus" / "cloudio.conf"
    conf.mkdir(parents=True)  # a directory: open() fails as for a file without read permission
    assert Settings.from_env({"HOME": str(tmp_path)}, config_file=True) == Settings()
    assert any(str(conf) in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    with pytest.raises(InvalidInput) as info:  # the same file named explicitly is an error
        Settings.from_env({"PEGASUS_CLOUDIO_CONFIG": str(conf)}, config_file=True)
    assert str(conf) in str(info.value)


def test_empty_values_count_as_unset_in_every_source(tmp_path):
    home_with_config(tmp_path, "PEGASUS_CLOUDIO_THREADS = 5\nPEGASUS_CLOUDIO_READ_TIMEOUT =\n")
    values = layered({"HOME": str(tmp_path), "PEGASUS_CLOUDIO_THREADS": " "}, config_file=True,
                     command_line={"PEGASUS_CLOUDIO_MAX_ATTEMPTS": None})
    assert values["PEGASUS_CLOUDIO_THREADS"] == "5"
    assert "PEGASUS_CLOUDIO_READ_TIMEOUT" not in values and "PEGASUS_CLOUDIO_MAX_ATTEMPTS" not in values


def test_a_flag_that_is_neither_on_nor_off_names_the_variable(tmp_path):
    with pytest.raises(InvalidInput) as info:
        Settings.from_env({"PEGASUS_CLOUDIO_BUNDLE": "sometimes"})
    assert "PEGASUS_CLOUDIO_BUNDLE" in str(info.value)


@pytest.mark.parametrize("text", ["", "M", "1.5M", "-3", "12Q", "١٢"])
def test_malformed_sizes_are_refused(text):
    with pytest.raises(ValueError):
        parse_size(text)
