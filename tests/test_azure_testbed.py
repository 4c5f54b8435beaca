"""The Azure test bed: the pinned Azurite install and the server the fixtures start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from azure.core.exceptions import HttpResponseError
from azure.storage.blob import BlobServiceClient

from pegasus_cloudio_testbed import node_tools, tools
from pegasus_cloudio_testbed.tool_builds import checked
from pegasus_cloudio_testbed.azurite import Azurite


def test_pin_files_match_their_digests_and_name_the_version() -> None:
    pin = node_tools.NODE_PINS["azurite"]
    home = node_tools.PINS_DIR / pin.name
    checked(home / "package.json", pin.manifest_sha256)
    checked(home / "package-lock.json", pin.lock_sha256)
    manifest = json.loads((home / "package.json").read_text())
    lock = json.loads((home / "package-lock.json").read_text())
    assert manifest["dependencies"] == {pin.package: pin.version}
    assert lock["packages"][f"node_modules/{pin.package}"]["version"] == pin.version
    assert all("integrity" in entry for name, entry in lock["packages"].items() if name)


def test_a_changed_pin_file_is_refused_naming_it(tmp_path: Path) -> None:
    changed = tmp_path / "package-lock.json"
    changed.write_text("{}")
    with pytest.raises(RuntimeError, match=r"package-lock.json: sha256 .*not the pinned file"):
        checked(changed, node_tools.NODE_PINS["azurite"].lock_sha256)


def test_installed_tree_is_current_and_the_tools_command_knows_it(capsys: pytest.CaptureFixture[str]) -> None:
    program = node_tools.ensure_azurite()  # built by make tools; here only checked (or installed once)
    assert program.name == "azurite-blob" and program.is_file()
    stamp = program.parents[2].parent / "stamps" / "azurite.json"
    assert stamp.read_text() == node_tools.NODE_PINS["azurite"].stamp_text()
    assert tools.main(["azurite"]) == 0
    assert capsys.readouterr().out.strip() == f"azurite: {program}"


def test_server_serves_its_account_and_refuses_another_key(azurite: Azurite) -> None:
    service = BlobServiceClient.from_connection_string(azurite.connection_string)
    service.create_container("testbed-check")
    container = service.get_container_client("testbed-check")
    container.upload_blob("a/b.txt", b"hello")
    assert container.download_blob("a/b.txt").readall() == b"hello"
    wrong = azurite.connection_string.replace(azurite.key, "A" * 86 + "==")
    with pytest.raises(HttpResponseError) as refused:
        BlobServiceClient.from_connection_string(wrong).get_container_client("testbed-check") \
            .download_blob("a/b.txt").readall()
    assert refused.value.status_code == 403
