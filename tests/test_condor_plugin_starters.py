"""Result ads by starter version: a starter older than 24.4 reads one pipe message after a failure.

Such a starter (23.x, the 24.0 LTS series) lost the hold reason when a failed batch wrote
several ads and requeued the job instead of holding it (seen on the real 23.9 pool, see
tests/test_condor_plugin_pool.py). For it the plugin leaves exactly one ad on failure; a newer
starter gets one ad per file, as the protocol asks.
"""

from __future__ import annotations

import pytest
from fixtures_condor import file_ad, parse_results

from pegasus_cloudio.condor.starter import MACHINE_AD_VAR, reads_one_message_after_failure, starter_version


def _ads(starter, https_files, names):
    starter.env["PEGASUS_CLOUDIO_CA_BUNDLE"] = https_files.ca_file
    return [file_ad(https_files.url(f"/{name}"), str(starter.sandbox / name)) for name in names]


@pytest.fixture
def mixed(starter, https_files):
    """Five inputs: ok1, missing-a, ok2, missing-b, ok3 (two are absent from the server)."""
    for name in ("ok1", "ok2", "ok3"):
        https_files.objects[f"/{name}"] = name.encode()
    return _ads(starter, https_files, ["ok1", "missing-a", "ok2", "missing-b", "ok3"])


@pytest.mark.parametrize("version", ["23.9.6", "24.0.14", "24.3.9"])
def test_an_old_starter_gets_one_ad_naming_the_first_failure(starter, https_files, mixed, version):
    starter.write_machine_ad(version)
    run = starter.run(mixed)
    assert run.returncode == 1, run.output
    [ad] = run.ads
    assert ad.eval("TransferSuccess") is False and ad.eval("TransferUrl") == https_files.url("/missing-a")
    assert "[the first of 2 failed files, out of 5;" in ad.eval("TransferError")
    assert run.output.count("does not exist") == 2, run.output  # every failure still in the output
    for name in ("ok1", "ok2", "ok3"):  # the files that arrived are there, only their ads are gone
        assert (starter.sandbox / name).read_bytes() == name.encode()
    assert run.outfile.read_text().count("TransferSuccess") == 1


@pytest.mark.parametrize("version", ["24.4.0", "25.0.3"])
def test_a_newer_starter_gets_one_ad_per_file(starter, https_files, mixed, version):
    starter.write_machine_ad(version)
    run = starter.run(mixed)
    assert run.returncode == 1
    outcomes = {ad.eval("TransferUrl").rsplit("/", 1)[1]: ad.eval("TransferSuccess") for ad in run.ads}
    assert outcomes == {"ok1": True, "missing-a": False, "ok2": True, "missing-b": False, "ok3": True}


def test_a_starter_of_unknown_version_is_treated_as_old(starter, https_files, mixed):
    del starter.env[MACHINE_AD_VAR]
    run = starter.run(mixed)
    assert run.returncode == 1 and len(run.ads) == 1


def test_success_on_an_old_starter_still_reports_every_file(starter, https_files):
    starter.write_machine_ad("23.9.6")
    for name in ("a", "b", "c"):
        https_files.objects[f"/{name}"] = name.encode() * 10
    run = starter.run(_ads(starter, https_files, ["a", "b", "c"]))
    assert run.returncode == 0
    assert sorted(ad.eval("TransferUrl").rsplit("/", 1)[1] for ad in run.ads) == ["a", "b", "c"]


def test_a_rewritten_result_file_parses_whole(starter, https_files):
    """The one ad replaces longer content: nothing of the earlier ads is left after it."""
    starter.write_machine_ad("23.9.6")
    names = [f"ok{n:02d}" for n in range(30)]
    for name in names:
        https_files.objects[f"/{name}"] = b"x"
    run = starter.run(_ads(starter, https_files, names + ["missing"]))
    text = run.outfile.read_text()
    assert len(parse_results(text)) == 1 and text.endswith("]\n") and text.count("[") == text.count("]")


@pytest.mark.parametrize("text, expected", [
    ('CondorVersion = "$CondorVersion: 23.9.6 2026-07-12 PackageID: 23.9.6+dfsg-2.1+b10 $"\n', (23, 9, 6)),
    ('Name = "slot1@x"\nCondorVersion = "$CondorVersion: 25.0.3 2025-10-30 BuildID: 8 $"\n', (25, 0, 3)),
    ('CondorVersion = "$CondorVersion: 23.9 $"\n', None),
    ('CondorVersion = "$CondorVersion: $"\n', None),
    ('Name = "no version here"\n', None),
    ("", None),
])
def test_the_version_is_read_from_the_machine_ad(tmp_path, text, expected):
    path = tmp_path / ".machine.ad"
    path.write_text(text)
    assert starter_version({MACHINE_AD_VAR: str(path)}) == expected


def test_a_missing_or_unreadable_machine_ad_is_an_unknown_version(tmp_path):
    assert starter_version({}) is None
    assert starter_version({MACHINE_AD_VAR: str(tmp_path / "absent")}) is None
    assert starter_version({MACHINE_AD_VAR: str(tmp_path)}) is None  # a directory
    assert reads_one_message_after_failure(None) and reads_one_message_after_failure((24, 3, 99))
    assert not reads_one_message_after_failure((24, 4, 0))
