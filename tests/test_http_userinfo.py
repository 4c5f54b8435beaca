"""``user:password@host`` in an http(s) URL: wget and curl (stock pegasus-transfer's HTTP tools)
send it as Basic credentials; the drop-in must too, to that origin only, and never log it."""

import base64
import json
import os
import subprocess
import sys

from pegasus_cloudio_testbed.scripted import Reply, ScriptedServer

OURS = [sys.executable, "-m", "pegasus_cloudio.dropin"]
GOOD = "Basic " + base64.b64encode(b"joe:s3cret").decode()


def run(spec, tmp_path, *args):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CACHE_DIR": "off",
           "PEGASUS_CLOUDIO_CONFIG": os.devnull, "PEGASUS_MULTIPART_DIR": str(tmp_path)}
    done = subprocess.run(OURS + list(args), input=spec, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    return done.returncode, done.stderr


def transfer(src, dst):
    return {"type": "transfer", "lfn": "f", "src_urls": [{"site_label": "web", "url": src}],
            "dest_urls": [{"site_label": "local", "url": dst}]}


def guarded(req):
    if req.header("Authorization") != GOOD:
        return Reply(401, {"WWW-Authenticate": 'Basic realm="x"'}, b"no")
    return Reply(200, {}, b"secret data")


def test_userinfo_is_sent_as_basic_credentials_and_never_logged(tmp_path):
    with ScriptedServer(guarded) as server:
        url = server.endpoint.replace("http://", "http://joe:s3cret@") + "/d/f"
        rc, err = run(json.dumps([transfer(url, f"file://{tmp_path}/out/f")]), tmp_path, "-d")
        assert [r.header("Authorization") for r in server.requests] == [GOOD]
    assert rc == 0, err
    assert (tmp_path / "out" / "f").read_bytes() == b"secret data"
    records = "".join(p.read_text() for p in tmp_path.iterdir() if p.name.endswith("-transfer"))
    assert "joe:***@" in records
    assert "s3cret" not in err + records and base64.b64encode(b"joe:s3cret").decode() not in err


def test_a_redirect_to_another_origin_carries_no_userinfo_credentials(tmp_path):
    with ScriptedServer(lambda req: Reply(200, {}, b"elsewhere")) as other:
        with ScriptedServer(lambda req: Reply(302, {"Location": other.endpoint + "/g"})) as first:
            url = first.endpoint.replace("http://", "http://joe:s3cret@") + "/f"
            rc, err = run(json.dumps([transfer(url, f"file://{tmp_path}/f")]), tmp_path)
            assert [r.header("Authorization") for r in first.requests] == [GOOD]
        assert [r.header("Authorization") for r in other.requests] == [None]
    assert rc == 0, err
    assert (tmp_path / "f").read_bytes() == b"elsewhere"


def test_wrong_userinfo_fails_without_logging_the_password(tmp_path):
    with ScriptedServer(guarded) as server:
        url = server.endpoint.replace("http://", "http://joe:wrong@") + "/f"
        rc, err = run(json.dumps([transfer(url, f"file://{tmp_path}/f")]), tmp_path, "-m", "1")
    assert rc == 1 and "401" in err and ":wrong" not in err, err
    assert not (tmp_path / "f").exists()


def test_a_url_refused_for_its_password_characters_is_named_without_the_password(tmp_path):
    """A password with characters the URL grammar refuses (percent-escapes, ``!``, ``~``): the
    URL is refused as stock's parser cannot take it either, and the one-line error names it
    as every message does, ``user:***@``."""
    with ScriptedServer(guarded) as server:
        for password in ("p%40ss", "pa!ss", "t~ilde"):
            url = server.endpoint.replace("http://", f"http://joe:{password}@") + "/f"
            rc, err = run(json.dumps([transfer(url, f"file://{tmp_path}/f")]), tmp_path, "-m", "1")
            assert rc == 1 and "unable to parse URL" in err and "joe:***@" in err, err
            assert password not in err, err
        assert server.requests == []
    assert not (tmp_path / "f").exists()
