"""URL parsing follows pegasus-transfer 5.x rules (spec section 1.5)."""

import pytest

from transfer.errors import InvalidInput
from transfer.urls import expand_vars, parse_url

ENV = {"PWD": "/work/job", "pegasus_lite_work_dir": "/scratch/w"}


@pytest.mark.parametrize("text,path", [
    ("file:///abs/f.a", "/abs/f.a"),
    ("file://localhost/abs/f.a", "/abs/f.a"),
    ("file:rel/f.a", "rel/f.a"),
    ("file://host/abs", "host/abs"),  # the stock tool's quirk, kept
    ("/plain/path", "/plain/path"),
    ("file://$PWD/f.a", "/work/job/f.a"),
    ("file://${pegasus_lite_work_dir}/x", "/scratch/w/x"),
    ("file://$UNDEFINED_VAR/f", "/f"),
])
def test_file_urls_strip_scheme_and_expand_variables(text, path):
    url = parse_url(text, env=ENV)
    assert url.scheme == "file"
    assert url.path == path


@pytest.mark.parametrize("text,scheme,path", [
    ("symlink://$PWD/f.a", "symlink", "/work/job/f.a"),
    ("symlink:///abs", "symlink", "/abs"),
    ("moveto://$PWD/out", "moveto", "/work/job/out"),
])
def test_symlink_and_moveto(text, scheme, path):
    url = parse_url(text, env=ENV)
    assert (url.scheme, url.path, url.is_local) == (scheme, path, True)


def test_remote_urls_keep_authority_and_collapse_slashes():
    url = parse_url("gs://joe@my-site:9000/bucket//run//f.a", site_label="minio")
    assert (url.scheme, url.host, url.path, url.site_label) == ("gs", "joe@my-site:9000", "/bucket/run/f.a", "minio")
    assert str(url) == "gs://joe@my-site:9000/bucket/run/f.a"


@pytest.mark.parametrize("scheme", ["s3", "s3s"])
def test_s3_keys_keep_repeated_slashes_as_pegasus_s3_does(scheme):
    url = parse_url(f"{scheme}://joe@my-minio:9000/bucket/run//f.a//", site_label="minio")
    assert (url.host, url.path) == ("joe@my-minio:9000", "/bucket/run//f.a//")


def test_scp_style_authority_with_trailing_colon():
    url = parse_url("scp://user@host:/home/user/f")
    assert (url.host, url.path) == ("user@host:", "/home/user/f")


def test_password_in_authority_is_hidden_when_printed():
    url = parse_url("https://joe:s3cret@example.org/data/f")
    assert "s3cret" not in str(url)
    assert str(url) == "https://joe:***@example.org/data/f"


@pytest.mark.parametrize("text", ["s3:/missing-slash", "not a url: x", "http://bad host/x\t"])
def test_unparseable_url_names_itself(text):
    with pytest.raises(InvalidInput) as info:
        parse_url(text)
    assert "unable to parse URL" in str(info.value)


def test_variable_names_need_two_characters_like_the_stock_tool():
    assert expand_vars("$a/$ab", {"a": "X", "ab": "Y"}) == "$a/Y"


def test_query_strings_keep_their_slashes_and_are_hidden_in_messages():
    url = parse_url("https://bucket.example.org/a//b?X-Amz-Signature=abc//def&x=1")
    assert url.path == "/a/b?X-Amz-Signature=abc//def&x=1"
    assert "abc" not in str(url) and str(url) == "https://bucket.example.org/a/b?<query hidden>"
    assert url.full == "https://bucket.example.org/a/b?X-Amz-Signature=abc//def&x=1"


def test_remote_split_matches_the_grammar_regex_on_random_text():
    """``_split_remote`` (hand-written, with an ASCII fast path) against the regular expression
    in the module's comment, on random ASCII and non-ASCII text."""
    import random
    import re

    from transfer.urls import _split_remote
    grammar = re.compile(r"(\w+)://([\w.\-:@#]*)(/[\S ]*)?")
    rng = random.Random(24)
    alphabet = "aZ09_.-:@#/ \t\n\u00e9\u0660\u00b2\u2028$?~%+"
    for _ in range(100_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 8))) \
            + rng.choice(["://", ":/", "", "://"]) + "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 16)))
        found = grammar.fullmatch(text)
        assert _split_remote(text) == (None if found is None else (found[1], found[2], found[3] or "")), repr(text)


def test_unquote_plus_matches_the_stdlib_on_random_text():
    import random
    from urllib.parse import unquote_plus as stdlib

    from transfer.urls import unquote_plus
    rng = random.Random(24)
    alphabet = "%+ aZ09fFgG/._-~é\u20ac\x00\x7f"
    cases = ["", "%", "%2", "%2F", "a%2Fb+c", "%e2%82%ac", "%E2%82", "%zz%41", "%%41", "caf%C3%A9", "é%41", "%ff"]
    for _ in range(50_000):
        cases.append("".join(rng.choice(alphabet + "0123456789abcdef") for _ in range(rng.randint(0, 12))))
    for text in cases:
        assert unquote_plus(text) == stdlib(text), text


STOCK_VARIABLE = r"\${?([a-zA-Z][a-zA-Z0-9_]+)}?"  # pegasus-transfer 5.1.2, expand_env_vars()


def stock_expand(text, env):
    import re
    return re.sub(STOCK_VARIABLE, lambda m: env.get(m.group(1), ""), text)


@pytest.mark.parametrize("text,expanded", [
    ("file://${PWD/f.a", "/work/job/f.a"),  # unclosed: the name ends where its characters do
    ("file://$PWD}/f.a", "/work/job/f.a"),  # a brace after a name is consumed
    ("file://${PWD}}/f.a", "/work/job}/f.a"),
    ("file://${/f.a", "${/f.a"),
    ("file://${P}/f.a", "${P}/f.a"),
    ("file://$$PWD/f.a", "$/work/job/f.a"),
    ("file://${1X}/f.a", "${1X}/f.a"),
])
def test_braces_are_each_optional_as_in_the_stock_expansion(text, expanded):
    assert stock_expand(text[7:], ENV) == expanded
    assert parse_url(text, env=ENV).path == expanded


def test_expansion_matches_the_stock_regex_on_random_text():
    import random
    rng = random.Random(5)
    env = {"AB": "<ab>", "A_1": "<a1>", "Ab": ""}
    alphabet = "$${}}ABb_1/ -"
    for _ in range(20000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert expand_vars(text, env) == stock_expand(text, env), text


def test_the_repr_hides_a_password_and_a_query_too():
    url = parse_url("https://joe:s3cret@example.org/data/f?X-Amz-Signature=abc", site_label="web")
    assert repr(url) == ("Url(scheme='https', host='joe:***@example.org', path='/data/f?<query hidden>', "
                         "site_label='web')")
    assert repr(parse_url("s3://joe@site/b/k?x")) == "Url(scheme='s3', host='joe@site', path='/b/k?x', site_label=None)"


@pytest.mark.parametrize("text", ["https://example.org/$PWD/f", "s3://joe@site/b/${PWD}/k", "gs://b/${PWD/k"])
def test_remote_urls_are_not_expanded_as_in_stock(text):
    """Stock expands variables only in file:, symlink: and moveto: paths."""
    assert parse_url(text, env=ENV).full == text


def test_the_bare_path_leaves_the_query_out_and_path_arithmetic_keeps_it_a_query() -> None:
    """A SAS on an az:// URL is a query: bundles and listings compute names and directories from
    the bare path, and the URLs they derive carry the query after their path, never inside it."""
    url = parse_url("az://acct/box/dir/f.txt?sv=1&sig=abc")
    assert url.bare_path == "/box/dir/f.txt"
    assert url.with_bare_path("/box/dir/.cloudio-bundles").full == "az://acct/box/dir/.cloudio-bundles?sv=1&sig=abc"
    assert parse_url("az://acct/box/dir/f.txt").with_bare_path("/box/g").full == "az://acct/box/g"
    s3 = parse_url("s3://bucket/key?with=mark")  # an S3 key holds "?" literally
    assert s3.bare_path == "/key?with=mark" and s3.with_bare_path("/other").path == "/other"
    local = parse_url("/data/what?.txt")  # and so does a local file name
    assert local.bare_path == "/data/what?.txt"
