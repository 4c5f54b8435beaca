"""A bad value of a documented knob, from either documented source, as the installed drop-in
meets it: one line naming the knob and where it came from, exit 1, no request sent, no file
written. (``tests/test_knobs.py`` checks that good values take effect; this file checks the
values no setting can mean: negative, zero where zero means nothing, NaN, infinity.)

The drop-in runs from the wheel in a fresh venv, outside the checkout. Its one input is an
``http://`` URL of a socket listening on loopback: any connection to it is a request sent.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from installed import build_sdist_and_wheel, clean_env, make_venv, run

P = "PEGASUS_CLOUDIO_"
ENVIRONMENT, CONFIG_FILE = "environment", "config file"

# knob -> values that no setting can mean (each was accepted before, or failed mid-transfer)
BAD: Dict[str, Tuple[str, ...]] = {
    "RETRY_BASE_DELAY": ("-1", "nan", "inf"),
    "RETRY_MAX_DELAY": ("-1", "nan"),
    "THROTTLE_TIMEOUT": ("-1", "nan"),
    "POOL_RATE_FRACTION": ("-0.5", "1.5", "nan"),
    "CONNECT_TIMEOUT": ("-1", "0", "nan"),
    "READ_TIMEOUT": ("-1", "0", "nan", "inf"),
    "MULTIPART_THRESHOLD": ("0",),
    "MULTIPART_ORPHAN_AGE": ("-1", "nan"),
    "BUNDLE_MIN_FILES": ("-3", "0"),
    "BUNDLE_MAX_MEMBER_SIZE": ("0",),
    "BUNDLE_MAX_SIZE": ("0",),
    "THREADS": ("x",),           # refused before: the message now says where it came from
    "MAX_ATTEMPTS": ("0",),
}
CASES = [(name, value, source) for name, values in BAD.items() for value in values
         for source in (ENVIRONMENT, CONFIG_FILE)]


@pytest.fixture(scope="module")
def dropin_bin(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Dict[str, str]]:
    root = tmp_path_factory.mktemp("knob-values")
    _, wheel = build_sdist_and_wheel(root / "dist")
    bin_dir = make_venv(root / "venv")
    env = clean_env(str(bin_dir), {"AWS_EC2_METADATA_DISABLED": "true"})
    done = run([str(bin_dir / "pip"), "install", "--quiet", "--no-index", "--no-deps", str(wheel)], env, root)
    assert done.returncode == 0, done.stderr[-3000:]
    return bin_dir, env


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        srv.setblocking(False)
        yield srv


def connections(srv: socket.socket) -> int:
    count = 0
    while True:
        try:
            conn, _ = srv.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def error_lines(stderr: str) -> List[str]:
    return [line for line in stderr.splitlines() if "CRITICAL" in line or "ERROR" in line]


@pytest.mark.parametrize("name,value,source", CASES, ids=[f"{n}={v}-{s.replace(' ', '_')}" for n, v, s in CASES])
def test_a_bad_value_is_one_line_naming_knob_and_source_before_any_request(
        dropin_bin: Tuple[Path, Dict[str, str]], listener: socket.socket, tmp_path: Path,
        name: str, value: str, source: str) -> None:
    bin_dir, base = dropin_bin
    (tmp_path / ".pegasus").mkdir()
    config = tmp_path / ".pegasus" / "cloudio.conf"
    env = {**base, "HOME": str(tmp_path), P + "CACHE_DIR": "off", P + "MAX_ATTEMPTS": "1",
           P + "CONNECT_TIMEOUT": "2", P + "READ_TIMEOUT": "2"}
    env.pop(P + name, None)
    if source == ENVIRONMENT:
        env[P + name] = value
    else:
        config.write_text(f"# site settings\n{P}{name} = {value}\n")
    out = tmp_path / "out"
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/x"
    spec = [{"type": "transfer", "src_urls": [{"site_label": "web", "url": url}],
             "dest_urls": [{"site_label": "local", "url": f"file://{out}"}]}]
    done = run([str(bin_dir / "pegasus-cloudio-transfer")], env, tmp_path, stdin=json.dumps(spec), timeout=120)
    errors = error_lines(done.stderr)
    assert done.returncode == 1, done.stderr
    assert len(errors) == 1 and P + name in errors[0], done.stderr
    where = "environment" if source == ENVIRONMENT else f"{config} line 2"
    assert where in errors[0], errors[0]
    assert connections(listener) == 0, f"{P}{name}={value}: a request was sent"
    assert not out.exists() and list(tmp_path.glob("out*")) == []


@pytest.mark.parametrize("changes", [{"read_timeout": float("nan")}, {"connect_timeout": 0.0},
                                     {"retry_base_delay": -1.0}, {"bundle_max_size": 0}, {"threads": 0}])
def test_the_library_refuses_the_same_values_given_as_arguments(listener: socket.socket,
                                                                changes: Dict[str, object]) -> None:
    """A ``Settings`` value is an explicit argument (it wins over the environment): the Client and
    a Session check it as the commands do, before anything is sent."""
    from transfer import Session, Settings
    from transfer.client import Client
    from transfer.errors import InvalidInput
    [field] = changes
    settings = Settings().replace(**changes)
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    with pytest.raises(InvalidInput, match=P + field.upper()):
        with Client(endpoint=endpoint, access_key="a", secret_key="b", settings=settings, env={}) as client:
            client.read_bytes("s3://bucket/key")
    with pytest.raises(InvalidInput, match=P + field.upper()):
        Session(settings, env={}).close()
    assert connections(listener) == 0


# The node cache and peer sharing never fail a job (docs/cache.md, docs/p2p.md): the commands
# turn these errors into one warning and go uncached / to the store. Their readers must still
# refuse what no setting can mean, or the warning never comes and the nonsense is used.
CACHE_BAD = [("PIN_SECONDS", "nan"), ("PIN_SECONDS", "inf"), ("HIGH_WATERMARK", "nan")]
PEER_BAD = [("CONNECT_TIMEOUT", "nan"), ("CONNECT_TIMEOUT", "0"), ("FIRST_BYTE_TIMEOUT", "0"),
            ("READ_TIMEOUT", "0"), ("READ_TIMEOUT", "inf"), ("CLAIM_SECONDS", "nan"),
            ("MAX_PEERS", "nan"), ("MAX_PEERS", "2.5"), ("MAX_PEERS", "-1")]
PEERS_ON = {P + "P2P_REDIS": "redis://127.0.0.1:1/0", P + "P2P_TOKEN": "t0", P + "P2P_PLAIN_HTTP": "1"}


@pytest.mark.parametrize("name,value", CACHE_BAD, ids=[f"{n}={v}" for n, v in CACHE_BAD])
def test_cache_settings_refuse_nan_and_infinity(tmp_path: Path, name: str, value: str) -> None:
    from transfer.cache import config_from_env
    from transfer.errors import InvalidInput
    with pytest.raises(InvalidInput, match=f"{P}CACHE_{name}|watermarks"):
        config_from_env({P + "CACHE_DIR": str(tmp_path / "c"), P + "CACHE_" + name: value})


@pytest.mark.parametrize("name,value", PEER_BAD, ids=[f"{n}={v}" for n, v in PEER_BAD])
def test_peer_settings_refuse_what_no_setting_can_mean(name: str, value: str) -> None:
    from transfer.errors import InvalidInput
    from transfer.p2p import peer_config_from_env
    with pytest.raises(InvalidInput, match=f"{P}P2P_{name}"):
        peer_config_from_env({**PEERS_ON, P + "P2P_" + name: value})


@pytest.mark.parametrize("name", ["CLUSTER", "PLAIN_HTTP"])
def test_the_daemon_refuses_a_flag_that_is_neither_on_nor_off(tmp_path: Path, name: str) -> None:
    """The jobs' reader refused ``P2P_CLUSTER=maybe``; the daemon's read it (and PLAIN_HTTP) as off."""
    from pegasus_cloudio.p2p.serve import load_settings
    from transfer.errors import InvalidInput
    for pem in ("n.crt", "n.key"):
        (tmp_path / pem).write_text("")
    env = {P + "P2P_BIND": "127.0.0.1:8470", P + "P2P_PLAIN_HTTP": "1", P + "P2P_TOKEN": "t0",
           P + "P2P_CERT": str(tmp_path / "n.crt"), P + "P2P_KEY": str(tmp_path / "n.key"),
           P + "P2P_USERS": f"root={tmp_path}", "HOME": str(tmp_path), P + "P2P_" + name: "maybe"}
    with pytest.raises(InvalidInput, match=f"{P}P2P_{name}"):
        load_settings(env)


@pytest.mark.parametrize("layer", ["node file", "job variable", "plugin environment"])
def test_the_plugin_names_the_layer_a_bad_value_came_from(tmp_path: Path, layer: str) -> None:
    """docs/condor.md: node file < plugin environment < the job's ``CLOUDIO_*`` variables."""
    from pegasus_cloudio.condor.environment import build_environment
    from pegasus_cloudio.condor.plugin import settings_for
    from transfer.errors import InvalidInput
    node = tmp_path / "node.conf"
    node.write_text(f"{P}READ_TIMEOUT = {'0' if layer == 'node file' else '5'}\n")
    env = {"HOME": str(tmp_path), P + "CONDOR_CONFIG": str(node)}
    if layer == "job variable":
        env["CLOUDIO_" + P + "READ_TIMEOUT"] = "0"
    elif layer == "plugin environment":
        env[P + "READ_TIMEOUT"] = "0"
    penv = build_environment(env, "/usr/libexec/condor/cloudio_plugin", str(tmp_path))
    where = {"node file": f"node configuration {node}", "job variable": f"CLOUDIO_{P}READ_TIMEOUT in the job",
             "plugin environment": "the plugin's environment"}[layer]
    with pytest.raises(InvalidInput, match=re.escape(f"{P}READ_TIMEOUT (from {where}")):
        settings_for(penv)


@pytest.mark.parametrize("value,anonymous", [("on", True), ("TRUE", True), ("off", False), ("maybe", None)])
def test_gcs_anonymous_is_a_flag_like_every_other(tmp_path: Path, value: str, anonymous: object) -> None:
    """``1/true/yes/on`` and ``0/false/no/off``, as every flag; another word names the knob (it
    read ``on`` as off, and ``maybe`` as off with no word, so a key file was used instead)."""
    from transfer.backends import _gcs_auth
    from transfer.config import Settings
    from transfer.errors import ConfigError, InvalidInput
    env = {"HOME": str(tmp_path), P + "GCS_ANONYMOUS": value}
    if anonymous is None:
        with pytest.raises(InvalidInput, match=f"{P}GCS_ANONYMOUS.*'maybe'"):
            _gcs_auth.resolve(None, env, Settings())
    elif anonymous:
        assert _gcs_auth.resolve(None, env, Settings()).anonymous
    else:
        with pytest.raises(ConfigError, match="no GCS credentials"):
            _gcs_auth.resolve(None, env, Settings())


SUMMARY_CASES = [("x", ENVIRONMENT, "environment"), ("-5", CONFIG_FILE, "cloudio.conf line 1"),
                 ("0", "--max", "command line")]


@pytest.mark.parametrize("value,source,where", SUMMARY_CASES, ids=[f"{v}-{s}" for v, s, _ in SUMMARY_CASES])
def test_cache_summary_max_names_the_knob_and_refuses_zero_or_less(
        dropin_bin: Tuple[Path, Dict[str, str]], tmp_path: Path, value: str, source: str, where: str) -> None:
    """``x`` said only "invalid literal for int()"; ``-5`` was used; ``--max 0`` was dropped
    for the environment's value."""
    bin_dir, base = dropin_bin
    (tmp_path / ".pegasus").mkdir()
    env = {**base, "HOME": str(tmp_path), P + "P2P_USERS": f"root={tmp_path}", P + "P2P_NODE": "n1"}
    argv = [str(bin_dir / "pegasus-cloudio"), "cache-summary"]
    if source == ENVIRONMENT:
        env[P + "P2P_SUMMARY_MAX"] = value
    elif source == CONFIG_FILE:
        (tmp_path / ".pegasus" / "cloudio.conf").write_text(f"{P}P2P_SUMMARY_MAX = {value}\n")
    else:
        env[P + "P2P_SUMMARY_MAX"] = "7"
        argv += ["--max", value]
    done = run(argv, env, tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert len(lines) == 1 and f"{P}P2P_SUMMARY_MAX" in lines[0] and where in lines[0], done.stderr


FAMILY_CASES = [("CACHE_PIN_SECONDS", "x"), ("CACHE_UPLOADS", "maybe"), ("CACHE_HARDLINK", "maybe"),
                ("P2P_MAX_PEERS", "x"), ("P2P_CLUSTER", "maybe"), ("P2P_NETWORKS", "nowhere"),
                ("P2P_MAX_SERVES", "0"), ("P2P_HEARTBEAT_TTL", "x")]


@pytest.mark.parametrize("name,value", FAMILY_CASES, ids=[f"{n}={v}" for n, v in FAMILY_CASES])
def test_cache_and_peer_readers_name_the_config_file_line_of_a_bad_value(tmp_path: Path, name: str,
                                                                         value: str) -> None:
    """What the commands read (the drop-in's and plugin's cache and peers, the daemon), from
    ``~/.pegasus/cloudio.conf``: the message says which file and line, as Settings' do."""
    from pegasus_cloudio.p2p.serve import load_settings
    from transfer.cache import config_from_env
    from transfer.errors import TransferError
    from transfer.knobs import layered
    from transfer.p2p import peer_config_from_env
    (tmp_path / ".pegasus").mkdir()
    config = tmp_path / ".pegasus" / "cloudio.conf"
    config.write_text(f"{P}{name} = {value}\n")
    env = {"HOME": str(tmp_path), P + "CACHE_DIR": str(tmp_path / "c"), **PEERS_ON,
           P + "P2P_BIND": "127.0.0.1:8470", P + "P2P_USERS": f"root={tmp_path}"}
    read = {"CACHE": config_from_env, "P2P_MAX_SERVES": load_settings, "P2P_HEARTBEAT_TTL": load_settings}
    reader = read.get(name, read.get(name.split("_")[0], peer_config_from_env))
    with pytest.raises(TransferError) as refused:
        reader(layered(env, config_file=True))
    assert f"{P}{name}" in str(refused.value) and f"{config} line 1" in str(refused.value), str(refused.value)


# ----------------------------------------------------------------------------- unknown names
# A name no reader knows is a typo (PEGASUS_CLOUDIO_THREDS): in a file we read, it is refused
# naming the file and line, not left to be silently ignored. (The environment holds anyone's
# variables: there only the documented names are read.)


def test_the_known_knobs_are_the_documented_ones() -> None:
    from test_knobs import documented_knobs
    from transfer.knobs import KNOWN
    assert set(KNOWN) == documented_knobs()


def test_a_misspelt_knob_in_the_config_file_is_refused_naming_file_and_line(
        dropin_bin: Tuple[Path, Dict[str, str]], listener: socket.socket, tmp_path: Path) -> None:
    bin_dir, base = dropin_bin
    (tmp_path / ".pegasus").mkdir()
    config = tmp_path / ".pegasus" / "cloudio.conf"
    config.write_text(f"{P}MAX_ATTEMPTS = 1\n{P}THREDS = 4\n")
    out = tmp_path / "out"
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/x"
    spec = [{"type": "transfer", "src_urls": [{"site_label": "web", "url": url}],
             "dest_urls": [{"site_label": "local", "url": f"file://{out}"}]}]
    done = run([str(bin_dir / "pegasus-cloudio-transfer")], {**base, "HOME": str(tmp_path), P + "CACHE_DIR": "off", P + "READ_TIMEOUT": "2"},
               tmp_path, stdin=json.dumps(spec), timeout=120)
    errors = error_lines(done.stderr)
    assert done.returncode == 1 and len(errors) == 1, done.stderr
    assert f"{config} line 2" in errors[0] and f"{P}THREDS" in errors[0], errors[0]
    assert connections(listener) == 0 and not out.exists()


def test_a_misspelt_knob_in_the_environment_is_one_warning_naming_the_closest_setting(
        dropin_bin: Tuple[Path, Dict[str, str]], tmp_path: Path) -> None:
    """Pegasus env profiles are the main way knobs arrive: a typo there was silently ignored.
    The run goes on (the name may be meant for another version) with one warning line each,
    in the drop-in and in pegasus-cloudio-s3; the test bed's own variables are no typo."""
    bin_dir, base = dropin_bin
    (tmp_path / "in").write_text("x")
    env = {**base, "HOME": str(tmp_path), P + "CACHE_DIR": "off", P + "THREDS": "4", P + "ZZZ_NOTHING": "1",
           P + "TOOLS_DIR": str(tmp_path)}
    spec = [{"type": "transfer", "src_urls": [{"site_label": "local", "url": f"file://{tmp_path}/in"}],
             "dest_urls": [{"site_label": "local", "url": f"file://{tmp_path}/out"}]}]
    done = run([str(bin_dir / "pegasus-cloudio-transfer")], env, tmp_path, stdin=json.dumps(spec), timeout=120)
    assert done.returncode == 0 and (tmp_path / "out").read_text() == "x", done.stderr
    warned = [line for line in done.stderr.splitlines() if "is no setting" in line]
    assert warned == [f"{P}THREDS in the environment is no setting and is ignored; did you mean {P}THREADS?",
                      f"{P}ZZZ_NOTHING in the environment is no setting and is ignored (the settings are listed "
                      "in docs/knobs.md)"], done.stderr
    creds = tmp_path / "creds.conf"
    creds.write_text("[nowhere]\nendpoint = http://127.0.0.1:1\n[u@nowhere]\naccess_key = a\nsecret_key = b\n")
    creds.chmod(0o600)
    s3 = run([str(bin_dir / "pegasus-cloudio-s3"), "-C", str(creds), "ls", "s3://u@nowhere/b"],
             {**env, P + "MAX_ATTEMPTS": "1"}, tmp_path, timeout=120)
    assert f"{P}THREDS in the environment is no setting" in s3.stderr and s3.stderr.count("is no setting") == 2, s3.stderr


def test_a_misspelt_knob_in_the_plugin_node_file_is_refused_naming_the_line(tmp_path: Path) -> None:
    from pegasus_cloudio.condor.environment import NodeConfigError, build_environment
    node = tmp_path / "node.conf"
    node.write_text(f"# node\n{P}THREADS = 16\n{P}CONDOR_METHOD = s3\n")
    with pytest.raises(NodeConfigError, match=f"{re.escape(str(node))} line 3.*{P}CONDOR_METHOD"):
        build_environment({P + "CONDOR_CONFIG": str(node)}, "/usr/libexec/condor/cloudio_plugin", str(tmp_path))


def test_a_hash_inside_a_value_is_the_values_in_both_config_files(tmp_path: Path) -> None:
    """``#`` starts a comment at a line's start or after a blank; inside a value it is kept
    (a cache directory ``/data/run#1/cache`` was cut to ``/data/run``: another directory)."""
    from pegasus_cloudio.condor.environment import read_node_config
    from transfer.knobs import layered

    wanted = str(tmp_path / "run#1" / "cache")
    text = f"# the node's settings\n{P}CACHE_DIR = {wanted}  # private to each user\n{P}THREADS=3\t# three\n"
    config = tmp_path / "cloudio.conf"
    config.write_text(text)
    knobs = layered({"PEGASUS_CLOUDIO_CONFIG": str(config)}, config_file=True)
    assert knobs[P + "CACHE_DIR"] == wanted and knobs[P + "THREADS"] == "3"
    node = tmp_path / "node.conf"
    node.write_text(text)
    assert dict(read_node_config(str(node))) == {P + "CACHE_DIR": wanted, P + "THREADS": "3"}
