"""The hostile-bundle corpus on Azure (real Azurite), as tests/test_bundles_hostile.py runs it on
MinIO: one damaged bundle affects only its own members, and a listing from a name (a file, a
directory, a container) finds bundle members as files."""

from __future__ import annotations

import io
import os

import pytest

from transfer import Engine, RetryPolicy, Session, Settings, Transfer, parse_url
from transfer.bundles.format import pack
from transfer.client import Client
from transfer.errors import NotFound

FAST = RetryPolicy(max_attempts=2, base_delay=0.001, max_delay=0.01)
BUNDLES = "D/.cloudio-bundles"


def bundle_bytes(members):
    out = io.BytesIO()
    pack(members, out)
    return out.getvalue()


def stage(env, root, names, dest, *, bundle):
    """One job: stage ``ROOT/D/<name>`` for each name into ``dest``; returns the results."""
    with Session(Settings(threads=4, bundle=bundle), env) as session:
        return Engine(session, retry=FAST).run([Transfer((parse_url(f"{root}/D/{n}"),), parse_url(f"file://{dest}/{n}"))
                                                for n in names])


@pytest.mark.parametrize("bundling", [True, False])
@pytest.mark.parametrize("damage", ["truncated", "hostile-name", "bad-magic", "lying-member"])
def test_one_bad_bundle_affects_only_its_own_members(store_azure, azure_sdk, tmp_path, bundling, damage):
    env, root = store_azure
    azure_sdk.upload_blob(f"{BUNDLES}/001-good.pcb", bundle_bytes([("m1", b"good one")]))
    bad = bundle_bytes([("m2", b"in the bad bundle"), ("m3", b"also")])
    bad = {"truncated": bad[:-6],
           "hostile-name": bad.replace(b'"m2"', b'"/x"'),
           "bad-magic": b"JUNK" + bad[4:],
           "lying-member": bad[:-4] + b"EVIL"}[damage]
    azure_sdk.upload_blob(f"{BUNDLES}/002-bad.pcb", bad)
    azure_sdk.upload_blob("D/plain", b"plain object")
    results = stage(env, root, ["m1", "plain", "missing"], tmp_path / "job", bundle=bundling)
    assert results[0].ok, results[0].error
    assert (tmp_path / "job" / "m1").read_bytes() == b"good one"
    assert results[1].ok and (tmp_path / "job" / "plain").read_bytes() == b"plain object"
    missing = results[2]
    assert not missing.ok and isinstance(missing.error, NotFound), missing.error
    assert f"{root}/D/missing" in str(missing.error)
    if damage != "lying-member":  # that bundle's index is fine: it is searched, so no note
        assert "002-bad.pcb" in str(missing.error)
    results = stage(env, root, ["m3"], tmp_path / "job2", bundle=bundling)  # the damaged one's
    assert not results[0].ok and f"{root}/D/m3" in str(results[0].error)
    assert "002-bad.pcb" in str(results[0].error)
    assert sorted(os.listdir(tmp_path / "job")) == ["m1", "plain"]
    assert not (tmp_path / "job2").exists() or os.listdir(tmp_path / "job2") == []


def test_listing_from_a_name_finds_bundle_members_as_files(store_azure, azure_sdk):
    env, root = store_azure
    azure_sdk.upload_blob(f"{BUNDLES}/001.pcb", bundle_bytes([("m1", b"one"), ("m2", b"two!")]))
    azure_sdk.upload_blob("D/plain", b"plain object")
    with Client(env=env) as client:
        assert [(e.name, e.size, e.is_dir) for e in client.list(f"{root}/D")] == [
            ("m1", 3, False), ("m2", 4, False), ("plain", 12, False)]
        assert [(e.url, e.is_dir) for e in client.list(root)] == [(f"{root}/D", True)]
        assert client.info(f"{root}/D/m2").size == 4 and client.info(f"{root}/D").is_dir
        assert sorted(e.url for e in client.find(root)) == [f"{root}/D/m1", f"{root}/D/m2", f"{root}/D/plain"]
        with pytest.raises(NotFound, match=f"{root}/D/m9"):
            client.info(f"{root}/D/m9")
