"""Hostile transfer specifications: one-line errors naming the entry, exit 1, nothing written."""

import json
import os
import subprocess
import sys

import pytest

OURS = [sys.executable, "-m", "pegasus_cloudio.dropin"]


def run(tmp_path, *args, spec=b"", env=None):
    done = subprocess.run(OURS + list(args), input=spec, cwd=tmp_path, capture_output=True, timeout=60,
                          env=dict(os.environ, HOME=str(tmp_path), PEGASUS_CLOUDIO_CACHE_DIR="off", **(env or {})))
    return done.returncode, done.stderr.decode()


def transfer(src, dst, **source_extra):
    return {"type": "transfer", "src_urls": [{"site_label": "local", "url": src, **source_extra}],
            "dest_urls": [{"site_label": "local", "url": dst}]}


def assert_clean_failure(tmp_path, rc, err, *needles):
    assert rc == 1, err
    assert "Traceback" not in err and "RecursionError" not in err, err
    for needle in needles:
        assert needle in err, err
    assert sorted(os.listdir(tmp_path)) == ["in.dat"] or sorted(os.listdir(tmp_path)) == ["in.dat", "spec"]


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "in.dat"
    path.write_bytes(b"input")
    return path


def test_non_utf8_file_given_with_f_is_a_one_line_error(tmp_path, source):
    spec = tmp_path / "spec"
    spec.write_bytes(b'[{"type": "transfer", "lfn": "\xff\xfe"}]')
    rc, err = run(tmp_path, "-f", str(spec))
    assert_clean_failure(tmp_path, rc, err, "not UTF-8", str(spec))


def test_non_utf8_on_stdin_is_a_one_line_error(tmp_path, source):
    rc, err = run(tmp_path, spec=b'[{"lfn": "\xff"}]')
    assert_clean_failure(tmp_path, rc, err, "not UTF-8")


def test_deep_nesting_is_refused_without_a_recursion_error(tmp_path, source):
    rc, err = run(tmp_path, spec=b"[" * 100_000)
    assert_clean_failure(tmp_path, rc, err, "transfer specification")


@pytest.mark.parametrize("extra, needle", [
    ({"url_override": 5}, "'url' must be a string"),
    ({"priority": {"a": 1}}, "priority"),
    ({"priority": None}, "priority"),
    ({"priority": "1.5"}, "src_urls[0] priority '1.5' is not a whole number"),
    ({"site_label_override": ["x"]}, "'site_label' must be a string"),
])
def test_wrongly_typed_fields_name_the_entry(tmp_path, source, extra, needle):
    entry = transfer(f"file://{source}", f"file://{tmp_path}/out.dat")
    if "url_override" in extra:
        entry["src_urls"][0]["url"] = extra.pop("url_override")
    if "site_label_override" in extra:
        entry["src_urls"][0]["site_label"] = extra.pop("site_label_override")
    entry["src_urls"][0].update(extra)
    rc, err = run(tmp_path, spec=json.dumps([entry]).encode())
    assert_clean_failure(tmp_path, rc, err, "entry 0", needle)


@pytest.mark.parametrize("field, value", [("lfn", 5), ("lfn", ["f.a"]), ("linkage", {"a": 1})])
def test_a_non_string_lfn_or_linkage_names_the_entry_before_anything_is_written(tmp_path, source, field, value):
    entry = dict(transfer(f"file://{source}", f"file://{tmp_path}/out.dat"), generate_checksum=True,
                 verify_checksum_remote=True, **{field: value})
    rc, err = run(tmp_path, spec=json.dumps([entry]).encode(),
                  env={"KICKSTART_INTEGRITY_DATA": str(tmp_path / "integrity.yml")})
    assert_clean_failure(tmp_path, rc, err, "entry 0", f"'{field}' must be a string")


@pytest.mark.parametrize("target", [{"site_label": "local", "url": "/tmp/x", "recursive": "maybe"},
                                    {"site_label": "local", "url": "/tmp/x", "recursive": [1]}, "notanobject"])
def test_bad_remove_entries_are_refused(tmp_path, source, target):
    rc, err = run(tmp_path, spec=json.dumps([{"type": "remove", "target": target}]).encode())
    assert_clean_failure(tmp_path, rc, err, "entry 0")


def test_missing_ca_bundle_names_the_setting_and_the_path(tmp_path, source):
    spec = json.dumps([transfer("https://127.0.0.1:9/x", f"file://{tmp_path}/out.dat")]).encode()
    rc, err = run(tmp_path, spec=spec, env={"PEGASUS_CLOUDIO_CA_BUNDLE": "/nonexistent/ca.pem"})
    assert rc == 1 and "Traceback" not in err
    assert "PEGASUS_CLOUDIO_CA_BUNDLE=/nonexistent/ca.pem" in err and "internal error" not in err
    assert not (tmp_path / "out.dat").exists()


def test_a_url_without_host_or_bucket_is_malformed_and_nothing_is_asked_of_any_network(tmp_path, source):
    """Before: ``s3://`` walked the AWS credential chain, instance metadata included."""
    from pegasus_cloudio_testbed.scripted import ScriptedServer
    with ScriptedServer() as metadata:  # stands in for 169.254.169.254: it must hear nothing
        env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": metadata.endpoint}
        for text in ("s3://", "s3:///key", "gs://", "https://"):
            spec = json.dumps([transfer(f"file://{source}", text)]).encode()
            rc, err = run(tmp_path, spec=spec, env=env)
            assert_clean_failure(tmp_path, rc, err, "entry 0", "malformed URL", text)
            assert len([line for line in err.splitlines() if "CRITICAL" in line]) == 1, err
        assert metadata.requests == [] and metadata.connections == 0


def test_an_empty_url_names_its_entry(tmp_path, source):
    spec = json.dumps([transfer(f"file://{source}", f"file://{tmp_path}/out"), transfer("", f"file://{tmp_path}/x")])
    rc, err = run(tmp_path, spec=spec.encode())
    assert_clean_failure(tmp_path, rc, err, "entry 1: empty URL")


def test_a_non_utf8_byte_in_the_config_file_is_one_line_naming_file_and_line(tmp_path, source):
    conf = tmp_path / ".pegasus" / "cloudio.conf"
    conf.parent.mkdir()
    conf.write_bytes(b"PEGASUS_CLOUDIO_THREADS = 4\n# caf\xe9\n")
    spec = json.dumps([transfer(f"file://{source}", f"file://{tmp_path}/out")]).encode()
    rc, err = run(tmp_path, spec=spec)
    assert rc == 1 and "Traceback" not in err, err
    assert str(conf) in err and "line 2" in err and "UTF-8" in err
    assert not (tmp_path / "out").exists()


# Runs the drop-in with an audit hook that stops (and reports) any removal outside the test's
# directory before it happens: the test of a guard against removing "/" must not depend on it.
_GUARDED = """
import os, sys
ALLOWED = os.environ["ALLOWED_ROOT"]
def guard(event, args):
    if event in ("shutil.rmtree", "os.remove", "os.rmdir") and args and isinstance(args[0], str):
        if not os.path.abspath(args[0]).startswith(ALLOWED + "/"):
            sys.stderr.write("ATTEMPTED %s %s\\n" % (event, args[0]))
            raise PermissionError("test guard: %s %s" % (event, args[0]))
sys.addaudithook(guard)
from pegasus_cloudio.dropin.main import main
sys.exit(main())
"""


@pytest.mark.parametrize("url", ["file:///", "file://$UNDEFINED_IN_THIS_JOB/", "file:///*", "file://$UNDEFINED_IN_THIS_JOB/*",
                                 "file:///tmp/.."])
def test_a_recursive_remove_of_the_root_directory_is_refused_before_anything_is_removed(tmp_path, source, url):
    """GNU rm (stock pegasus-transfer's tool) refuses 'rm -r /' (--preserve-root) and takes a quoted
    '/*' literally; an undefined variable in a cleanup URL must not wipe the machine."""
    spec = json.dumps([{"type": "remove", "target": {"site_label": "local", "url": url, "recursive": "True"}}])
    done = subprocess.run([sys.executable, "-c", _GUARDED], input=spec.encode(), cwd=tmp_path, capture_output=True,
                          timeout=60, env=dict(os.environ, HOME=str(tmp_path), PEGASUS_CLOUDIO_CACHE_DIR="off",
                                               ALLOWED_ROOT=str(tmp_path)))
    err = done.stderr.decode()
    assert "ATTEMPTED" not in err, err
    assert done.returncode == 1 and "root directory" in err, err
