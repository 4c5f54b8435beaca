"""The drop-in reads both pegasus-transfer input formats with the stock tool's rules."""

import json

import pytest

from pegasus_cloudio.dropin.spec import SpecError, parse_spec
from transfer.ops import LinkMode, Mkdir, Remove, Transfer

ENV = {"PWD": "/job"}


def transfer(src_urls, dest_url="file://$PWD/f.a", **extra):
    return {"type": "transfer", "lfn": "f.a", "src_urls": src_urls,
            "dest_urls": [{"site_label": "condorpool", "url": dest_url}], **extra}


def test_json_transfer_with_planner_keys_ignored():
    text = json.dumps([transfer([{"site_label": "local", "url": "file:///a/f.a", "priority": 50,
                                  "checkpoint": "false"}], id=1, linkage="input",
                                attributes={"checksum.type": "sha256"}, generate_checksum=True)])
    [entry] = parse_spec(text, env=ENV)
    assert isinstance(entry.op, Transfer)
    assert entry.op.sources[0].path == "/a/f.a"
    assert entry.op.dest.path == "/job/f.a"
    assert (entry.lfn, entry.linkage, entry.generate_checksum) == ("f.a", "input", True)


def test_sources_ordered_by_priority_then_input_order():
    text = json.dumps([transfer([
        {"site_label": "a", "url": "file:///a"},
        {"site_label": "b", "url": "file:///b", "priority": 10},
        {"site_label": "c", "url": "file:///c", "priority": "90"},
        {"site_label": "d", "url": "file:///d"}])])
    [entry] = parse_spec(text, env=ENV)
    assert [u.path for u in entry.op.sources] == ["/c", "/b", "/a", "/d"]


def test_mixed_list_and_several_mkdirs_are_accepted():
    text = json.dumps([
        {"type": "mkdir", "target": {"site_label": "s3", "url": "s3://joe@amazon/bucket/run1"}},
        {"type": "mkdir", "target": {"site_label": "s3", "url": "s3://joe@amazon/bucket/run2"}},
        transfer([{"site_label": "local", "url": "file:///a"}]),
        {"type": "remove", "target": {"site_label": "local", "url": "file:///x", "recursive": "True"}}])
    ops = [e.op for e in parse_spec(text, env=ENV)]
    assert [type(op) for op in ops] == [Mkdir, Mkdir, Transfer, Remove]
    assert ops[3].recursive is True


@pytest.mark.parametrize("value,expected", [("False", False), ("yes", True), ("T", True), ("0", False), (True, True)])
def test_recursive_accepts_bools_and_strings(value, expected):
    text = json.dumps([{"type": "remove", "target": {"site_label": "l", "url": "file:///x", "recursive": value}}])
    assert parse_spec(text)[0].op.recursive is expected


def test_symlink_flag_only_affects_local_to_local():
    text = json.dumps([transfer([{"site_label": "l", "url": "file:///a"}]),
                       transfer([{"site_label": "s", "url": "s3://joe@x/b/k"}])])
    local, remote = parse_spec(text, symlink=True, env=ENV)
    assert local.op.link is LinkMode.SYMLINK
    assert remote.op.link is LinkMode.COPY


def test_v1_format_with_label_reuse_and_normalisation():
    text = ("# src 1 my-site\nfile:///a/f1\n# dst 1 other\nfile:///b/f1\n"
            "file:///a/f2\n# dst 2 other\nfile:///b/f2\n")
    entries = parse_spec(text)
    assert [e.op.sources[0].path for e in entries] == ["/a/f1", "/a/f2"]
    assert entries[0].op.sources[0].site_label == "my_site"
    assert entries[1].op.sources[0].site_label == "other"  # the previous label is reused
    assert entries[0].raw["dest_urls"][0]["url"] == "file:///b/f1"


def test_v1_without_any_label_is_an_error():
    with pytest.raises(SpecError):
        parse_spec("# src\nfile:///a/f1\nfile:///b/f1\n")


def test_v1_comment_without_a_site_label_is_an_error_not_the_previous_label():
    """Stock: 'Unable to parse comment'; taking the previous site's label instead would pick
    that site's credentials for the next URL."""
    with pytest.raises(SpecError, match="line 3"):
        parse_spec("# src 1 local\nfile:///a/f1\n# dst 1\ns3://joe@amazon/b/f1\n")


@pytest.mark.parametrize("text,needle", [
    ("[{", "Error parsing the transfer specification JSON"),
    ('{"type": "transfer"}', "top level is not a list"),
    ('[{"type": "copy"}]', "Unknown JSON entry"),
    ('[{"type": "transfer", "src_urls": []}]', "missing 'dest_urls'"),
    ('[{"type": "mkdir", "target": {"url": "file:///x"}}]', "site_label"),
])
def test_malformed_input_gives_a_clear_error(text, needle):
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    assert needle in str(info.value)


def test_unknown_scheme_is_not_native_but_parses():
    text = json.dumps([transfer([{"site_label": "g", "url": "gsiftp://host/path/f"}])])
    [entry] = parse_spec(text, env=ENV)
    assert entry.native is False


def stock_priority(value):
    """pegasus-transfer 5.1.2 ``json_object_decoder``: ``priority = int(surl["priority"])``."""
    return int(value)


@pytest.mark.parametrize("value", [1.5, 2.99, -0.5, True, False, " 7 ", "+3", 1e20])
def test_priorities_the_stock_tool_accepts_are_read_as_its_int(value):
    text = json.dumps([transfer([{"site_label": "a", "url": "file:///a", "priority": 2},
                                 {"site_label": "b", "url": "file:///b", "priority": value}])])
    [entry] = parse_spec(text, env=ENV)
    expected = ["/b", "/a"] if stock_priority(value) > 2 else ["/a", "/b"]
    assert [u.path for u in entry.op.sources] == expected


def test_a_float_priority_truncates_like_int_so_equal_ranks_keep_input_order():
    text = json.dumps([transfer([{"site_label": "a", "url": "file:///a", "priority": 1.2},
                                 {"site_label": "b", "url": "file:///b", "priority": 1.9},
                                 {"site_label": "c", "url": "file:///c", "priority": 2.0}])])
    [entry] = parse_spec(text, env=ENV)
    assert [u.path for u in entry.op.sources] == ["/c", "/a", "/b"]


@pytest.mark.parametrize("value", ["1.5", None, "NaN", "Infinity", [1], {"a": 1}, "x"])
def test_priorities_the_stock_tool_refuses_name_the_entry(value):
    raw = json.dumps(value) if value not in ("NaN", "Infinity") else value  # JSON's non-standard constants
    text = ('[{"type": "transfer", "src_urls": [{"site_label": "a", "url": "file:///a"}], "dest_urls": '
            '[{"site_label": "b", "url": "file:///b", "priority": %s}]}]' % raw)
    with pytest.raises(SpecError) as info:
        parse_spec(text, env=ENV)
    message = str(info.value)
    assert "entry 0" in message and "dest_urls[0] priority" in message and "\n" not in message


def test_the_destination_with_the_highest_priority_is_used_as_by_stock():
    text = json.dumps([{"type": "transfer", "src_urls": [{"site_label": "a", "url": "file:///a"}],
                        "dest_urls": [{"site_label": "low", "url": "file:///low", "priority": 1},
                                      {"site_label": "high", "url": "file:///high", "priority": 9.5}]}])
    [entry] = parse_spec(text, env=ENV)
    assert (entry.op.dest.path, entry.op.dest.site_label) == ("/high", "high")
