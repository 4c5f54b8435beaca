"""az:// through every face, none of them changed for it: the drop-in (Pegasus JSON), the library
(``Client``), the ``cloudio`` fsspec filesystem and the HTCondor plugin, on a real Azurite.
Secrets (the account key, a SAS signature) appear in no output, debug logs included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import fsspec
import pytest
from azure.storage.blob import ContainerSasPermissions, generate_container_sas
from fixtures_condor import file_ad

from pegasus_cloudio.condor.plugin import query_fields
from transfer.client import Client
from transfer.errors import NotFound

DROPIN = [sys.executable, "-m", "pegasus_cloudio.dropin"]


def _dropin(entries: list, env: dict, cwd, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([*DROPIN, *flags], input=json.dumps(entries), cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=dict(env, PATH=os.environ["PATH"]))


def _transfer(src: str, dst: str, lfn: str, src_label: str = "local", dst_label: str = "azure") -> dict:
    return {"type": "transfer", "lfn": lfn, "id": 1, "src_urls": [{"site_label": src_label, "url": src}],
            "dest_urls": [{"site_label": dst_label, "url": dst}]}


def test_dropin_uploads_downloads_and_removes_with_az_urls_logging_no_key(azurite, azure_env, azure_container,
                                                                          azure_sdk, tmp_path) -> None:
    base = f"az://{azurite.account}/{azure_container}/run"
    names = [f"f{n}.dat" for n in range(12)]
    for name in names:
        (tmp_path / name).write_bytes(os.urandom(700))
    done = _dropin([_transfer(f"file://{tmp_path}/{n}", f"{base}/{n}", n) for n in names], azure_env, tmp_path, "-d")
    assert done.returncode == 0, done.stderr
    assert azurite.key not in done.stderr and azurite.key not in done.stdout
    assert sorted(b.name for b in azure_sdk.list_blobs("run/")) == sorted(f"run/{n}" for n in names)
    back = tmp_path / "back"
    done = _dropin([_transfer(f"{base}/{n}", f"file://{back}/{n}", n, "azure", "local") for n in names],
                   azure_env, tmp_path, "-d")
    assert done.returncode == 0, done.stderr
    assert all((back / n).read_bytes() == (tmp_path / n).read_bytes() for n in names)
    assert azurite.key not in done.stderr
    done = _dropin([{"type": "remove", "target": {"site_label": "azure", "url": base, "recursive": True}}],
                   azure_env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert list(azure_sdk.list_blobs("run/")) == []


def test_dropin_failure_is_non_zero_names_the_url_and_hides_the_sas(azurite, azure_container, tmp_path) -> None:
    sas = generate_container_sas(azurite.account, azure_container, account_key=azurite.key,
                                 permission=ContainerSasPermissions(read=True),
                                 expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    signature = dict(part.split("=", 1) for part in sas.split("&"))["sig"]
    env = {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
           "AZURE_STORAGE_CONNECTION_STRING": f"BlobEndpoint={azurite.endpoint}"}
    (tmp_path / "out").mkdir()
    url = f"az://{azurite.account}/{azure_container}/absent.dat?{sas}"
    done = _dropin([_transfer(url, f"file://{tmp_path}/out/absent.dat", "absent.dat", "azure", "local")],
                   env, tmp_path, "-d")
    assert done.returncode != 0
    assert f"az://{azurite.account}/{azure_container}/absent.dat" in done.stderr
    assert signature not in done.stderr and signature not in done.stdout
    assert os.listdir(tmp_path / "out") == []


def test_library_client_lists_finds_reads_and_removes(azurite, azure_env, azure_container, tmp_path) -> None:
    root = f"az://{azurite.account}/{azure_container}"
    with Client(env=azure_env) as client:
        client.write_bytes(f"{root}/lib/a.txt", b"alpha")
        client.write_bytes(f"{root}/lib/sub/b.txt", b"beta")
        assert client.read_bytes(f"{root}/lib/sub/b.txt") == b"beta"
        assert [(e.url, e.is_dir) for e in client.list(f"{root}/lib")] == [
            (f"{root}/lib/a.txt", False), (f"{root}/lib/sub", True)]
        assert sorted(e.url for e in client.find(f"{root}/lib")) == [f"{root}/lib/a.txt", f"{root}/lib/sub/b.txt"]
        assert client.info(f"{root}/lib/a.txt").size == 5
        client.remove(f"{root}/lib", recursive=True)
        assert not client.exists(f"{root}/lib/a.txt")


def test_a_container_is_the_bucket_an_empty_one_a_directory_a_missing_one_not_found(azurite, azure_env,
                                                                                   azure_container) -> None:
    """Found by Snakemake's TestStorageBase on Azure: info of az://ACCOUNT/CONTAINER looked for
    bundle members in az://ACCOUNT/, which is no container (InvalidInput instead of an answer)."""
    root = f"az://{azurite.account}/{azure_container}"
    with Client(env=azure_env) as client:
        assert client.info(root).is_dir and client.exists(root)
        missing = f"az://{azurite.account}/absent-{azure_container}"
        with pytest.raises(NotFound, match=missing):
            client.info(missing)
        assert not client.exists(missing)


def test_fsspec_cloudio_filesystem_on_azure(azurite, azure_env, azure_container, tmp_path) -> None:
    fs = fsspec.filesystem("cloudio", scheme="az", env=azure_env, skip_instance_cache=True)
    top = f"{azurite.account}/{azure_container}"
    (tmp_path / "local.txt").write_bytes(b"through fsspec")
    fs.put(str(tmp_path / "local.txt"), f"{top}/fs/local.txt")
    with fs.open(f"{top}/fs/written.txt", "wb") as handle:
        handle.write(b"opened for writing")
    assert fs.cat_file(f"{top}/fs/local.txt") == b"through fsspec"
    assert sorted(fs.ls(f"{top}/fs", detail=False)) == [f"{top}/fs/local.txt", f"{top}/fs/written.txt"]
    assert fs.info(f"{top}/fs/written.txt")["size"] == 18
    fs.rm(f"{top}/fs", recursive=True)
    assert not fs.exists(f"{top}/fs/local.txt")


def test_condor_plugin_announces_az_and_moves_a_batch(starter, azurite, azure_env, azure_container) -> None:
    methods = str(query_fields({})["SupportedMethods"]).split(",")
    assert "az" in methods
    starter.env["AZURE_STORAGE_CONNECTION_STRING"] = azure_env["AZURE_STORAGE_CONNECTION_STRING"]
    files = {"z1.dat": os.urandom(5000), "z2.dat": b"second"}
    for name, data in files.items():
        (starter.sandbox / name).write_bytes(data)
    urls = {name: f"az://{azurite.account}/{azure_container}/job/{name}" for name in files}
    run = starter.run([file_ad(urls[n], str(starter.sandbox / n)) for n in files], upload=True)
    assert run.returncode == 0, run.output
    assert all(run.ad_for(u).eval("TransferProtocol") == "az" for u in urls.values())
    fetched = starter.sandbox / "fetched"
    missing = f"az://{azurite.account}/{azure_container}/job/absent.dat"
    run = starter.run([file_ad(urls[n], str(fetched / n)) for n in files] + [file_ad(missing, str(fetched / "x"))])
    assert run.returncode == 1 and len(run.ads) == 3
    for name, data in files.items():
        assert run.ad_for(urls[name]).eval("TransferSuccess") is True and (fetched / name).read_bytes() == data
    [entry] = run.ad_for(missing).eval("TransferErrorData")
    assert entry.eval("ErrorCode") == 404
    assert azurite.key not in run.output


def test_bundles_and_the_node_cache_serve_az(azurite, azure_env, azure_container, azure_sdk, tmp_path) -> None:
    base = f"az://{azurite.account}/{azure_container}/bundled"
    names = [f"s{n:02d}.txt" for n in range(20)]
    for name in names:
        (tmp_path / name).write_bytes(name.encode() * 10)
    env = dict(azure_env, PEGASUS_CLOUDIO_BUNDLE="1", PEGASUS_CLOUDIO_CACHE_DIR=str(tmp_path / "cache"))
    done = _dropin([_transfer(f"file://{tmp_path}/{n}", f"{base}/{n}", n) for n in names], env, tmp_path)
    assert done.returncode == 0, done.stderr
    stored = [b.name for b in azure_sdk.list_blobs("bundled/")]
    assert len(stored) < len(names) and any(".cloudio-bundles/" in name for name in stored)  # packed, not one each
    for round_ in ("first", "cached"):
        back = tmp_path / round_
        done = _dropin([_transfer(f"{base}/{n}", f"file://{back}/{n}", n, "azure", "local") for n in names],
                       env, tmp_path)
        assert done.returncode == 0, done.stderr
        assert all((back / n).read_bytes() == n.encode() * 10 for n in names)
    assert any((tmp_path / "cache").rglob("*"))


def test_bundles_with_a_sas_on_every_url_pack_and_read_back_by_name(azurite, azure_container, azure_sdk,
                                                                   tmp_path) -> None:
    """The SAS is no part of a name: the members are the blobs' names, the bundle directory and
    the bundles are reached with the URL's SAS (the environment holds no key)."""
    sas = generate_container_sas(azurite.account, azure_container, account_key=azurite.key,
                                 permission=ContainerSasPermissions(read=True, write=True, list=True, create=True,
                                                                    add=True, delete=True),
                                 expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    signature = dict(part.split("=", 1) for part in sas.split("&"))["sig"]
    env = {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull, "PEGASUS_CLOUDIO_BUNDLE": "1",
           "AZURE_STORAGE_CONNECTION_STRING": f"BlobEndpoint={azurite.endpoint}"}
    base = f"az://{azurite.account}/{azure_container}/sas"
    names = [f"s{n:02d}.txt" for n in range(20)]
    for name in names:
        (tmp_path / name).write_bytes(name.encode() * 10)
    done = _dropin([_transfer(f"file://{tmp_path}/{n}", f"{base}/{n}?{sas}", n) for n in names], env, tmp_path)
    assert done.returncode == 0, done.stderr
    stored = [b.name for b in azure_sdk.list_blobs("sas/")]
    assert len(stored) < len(names) and all(name.startswith("sas/.cloudio-bundles/") for name in stored), stored
    assert not any("sig" in name or "?" in name for name in stored), stored
    with Client(env=dict(env, AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string)) as client:
        assert sorted(e.name for e in client.list(base)) == names  # members named as their blobs
    back = tmp_path / "back"
    done = _dropin([_transfer(f"{base}/{n}?{sas}", f"file://{back}/{n}", n, "azure", "local") for n in names],
                   env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert all((back / n).read_bytes() == n.encode() * 10 for n in names)
    assert signature not in done.stderr + done.stdout


def test_a_listing_through_a_sas_names_files_dirs_and_members_without_it(azurite, azure_container, tmp_path) -> None:
    """Names never hold the SAS, the URLs a listing gives keep it: plain blobs, a sub-directory and
    bundle members (listing.py's _members), read back through those URLs with no key anywhere."""
    sas = generate_container_sas(azurite.account, azure_container, account_key=azurite.key,
                                 permission=ContainerSasPermissions(read=True, write=True, list=True, create=True,
                                                                    add=True),
                                 expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    env = {"HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull, "PEGASUS_CLOUDIO_BUNDLE": "1",
           "AZURE_STORAGE_CONNECTION_STRING": f"BlobEndpoint={azurite.endpoint}"}
    base = f"az://{azurite.account}/{azure_container}/lst"
    names = [f"m{n:02d}.txt" for n in range(10)]
    for name in names:
        (tmp_path / name).write_bytes(name.encode())
    done = _dropin([_transfer(f"file://{tmp_path}/{n}", f"{base}/{n}?{sas}", n) for n in names], env, tmp_path)
    assert done.returncode == 0, done.stderr
    with Client(env=env) as client:
        client.write_bytes(f"{base}/plain.txt?{sas}", b"plain")
        client.write_bytes(f"{base}/sub/deep.txt?{sas}", b"deep")
        listed = client.list(f"{base}?{sas}")
        assert [(e.name, e.is_dir) for e in listed] == [(n, False) for n in names] + [("plain.txt", False),
                                                                                       ("sub", True)]
        assert all(e.url.endswith(f"?{sas}") and e.url.count("?") == 1 for e in listed)
        member = next(e for e in listed if e.name == "m03.txt")
        assert member.url == f"{base}/m03.txt?{sas}"
        assert client.read_bytes(member.url) == b"m03.txt"
        assert client.info(f"{base}/m04.txt?{sas}").size == 7  # a member found through the directory's bundles
        found = sorted(e.url for e in client.find(f"{base}?{sas}"))
        assert found == sorted(f"{base}/{n}?{sas}" for n in [*names, "plain.txt", "sub/deep.txt"])
