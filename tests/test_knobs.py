"""Every knob the docs name works from every source the docs name, with one precedence.

The knob list is read from the docs themselves (README.md and docs/*.md: full
``PEGASUS_CLOUDIO_*`` names, the README's ``_NAME`` shorthand, docs/p2p.md's ``P2P_NAME``), so a
knob documented without a probe here fails, and so does a probe that sees no effect. Each probe
reads the knob the way the command that uses it does (the drop-in's own settings function,
its cache and peer readers, the stager hand-off, the daemon's and the plugin's), from a fresh
process environment: once with the knob in the environment, once in ``~/.pegasus/cloudio.conf``.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pegasus_cloudio.condor.environment import build_environment, configured_methods
from pegasus_cloudio.condor.plugin import settings_for
from pegasus_cloudio.dropin import launch
from pegasus_cloudio.dropin.main import build_parser, run_settings
from pegasus_cloudio.dropin.stock import find_stock_transfer
from pegasus_cloudio.p2p.serve import load_settings
from pegasus_cloudio.p2p.summary import summary_settings
from pegasus_cloudio.s3cli import main as s3cli
from pegasus_cloudio_testbed.stager import StagerProcess
from transfer.backends import _azure_auth, _gcs_auth
from transfer.cache import config_from_env
from transfer.errors import ConfigError, TransferError
from transfer.node import open_pacer
from transfer.p2p import peer_config_from_env
from transfer.urls import parse_url
from waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
P = "PEGASUS_CLOUDIO_"
ENVIRONMENT, CONFIG_FILE, NODE_FILE = "environment", "config file", "plugin node file"


def documented_knobs():
    names = set()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        names |= {m.group(1) for m in re.finditer(r"\b(PEGASUS_CLOUDIO_[A-Z0-9_]*[A-Z0-9])(?![A-Z0-9_]*\*)", text)}
        if path.name == "README.md":
            names |= {P + m.group(1) for m in re.finditer(r"`_([A-Z][A-Z0-9_]*)`", text)}
        if path.name == "p2p.md":
            names |= {P + m.group(1) for m in re.finditer(r"`(P2P_[A-Z0-9_]+)", text)}
    return names


# ----------------------------------------------------------------------------- probes


def dropin(env, *argv):
    return run_settings(build_parser().parse_args(list(argv)), env)


def setting(field):
    return lambda env: getattr(dropin(env)[1], field)


def cache(field):
    return lambda env: getattr(config_from_env(dropin(env)[0]), field)


P2P_BASE = {P + "P2P_REDIS": "redis://127.0.0.1:1/0", P + "P2P_TOKEN": "t0", P + "P2P_CA_FILE": "/etc/ca0.pem"}


def peers(field):
    def probe(env):
        base = {k: v for k, v in P2P_BASE.items() if field != "ca_file" or not k.endswith("CA_FILE")}
        knobs = dropin({**base, **env})[0]
        try:
            return getattr(peer_config_from_env(knobs), field)
        except ConfigError:  # P2P_CA_FILE (required) from no source
            return None
    return probe


def daemon(get, name):
    """``get`` of the daemon's settings; the other required settings come from the environment."""
    def probe(env):
        base = {P + "P2P_BIND": "127.0.0.1:8470", P + "P2P_PLAIN_HTTP": "1", P + "P2P_USERS": "root=/tmp/c",
                P + "P2P_TOKEN": "t0"}
        base.pop(P + name, None)  # the knob itself comes only from the source under test
        try:
            return get(load_settings({**base, **env}))
        except TransferError:  # a required setting missing
            return None
    return probe


def summary(env):
    caches, limit, node = summary_settings(argparse.Namespace(max=None), {P + "P2P_USERS": "root", **env})
    return caches, limit, node


def pool_token(env):
    try:
        return peer_config_from_env(dropin({P + "P2P_REDIS": "redis://127.0.0.1:1/0",
                                            P + "P2P_CA_FILE": "/etc/ca0.pem", **env})[0]).token
    except ConfigError:  # no token from any source
        return None


def gcs_anonymous(env):
    knobs, settings = dropin(env)
    try:
        return _gcs_auth.resolve(None, knobs, settings).anonymous
    except ConfigError:
        return False


def azure_credential(env):
    knobs, _ = dropin(env)
    return _azure_auth.resolve("acct", knobs).identity


def plugin_threads(env):
    penv = build_environment(env, "/usr/libexec/condor/cloudio_plugin", str(env["HOME"]))
    return settings_for(penv).threads


def condor_methods(env):
    return configured_methods(env)


def pace_trace(env):
    """One request paced by the drop-in's pacer: with the knob, a line in ``DIR/PID.trace``."""
    open_pacer(dropin(env)[0]).pace(parse_url("s3://u@site/b/run/k")).acquire()
    traces = Path(env["HOME"]) / "trace"
    return traces.is_dir() and any(p.read_text().startswith("free ") for p in traces.iterdir())


def condor_config(env):
    return build_environment(env, "/usr/libexec/condor/cloudio_plugin", str(env["HOME"])).env.get(
        P + "READ_TIMEOUT")


# knob -> (value, probe, expected observable, sources). "{home}" in a value is the test's HOME.
BOTH = (ENVIRONMENT, CONFIG_FILE)
KNOBS = {
    "THREADS": ("3", setting("threads"), 3, BOTH),
    "MAX_ATTEMPTS": ("7", setting("max_attempts"), 7, BOTH),
    "RETRY_BASE_DELAY": ("0.25", setting("retry_base_delay"), 0.25, BOTH),
    "RETRY_MAX_DELAY": ("4", setting("retry_max_delay"), 4.0, BOTH),
    "THROTTLE_TIMEOUT": ("42", setting("throttle_timeout"), 42.0, BOTH),
    "POOL_RATE_FRACTION": ("0.8", setting("pool_rate_fraction"), 0.8, BOTH),
    "PACE_TRACE": ("{home}/trace", pace_trace, True, (ENVIRONMENT,)),
    "CONNECT_TIMEOUT": ("2.5", setting("connect_timeout"), 2.5, BOTH),
    "READ_TIMEOUT": ("9", setting("read_timeout"), 9.0, BOTH),
    "MULTIPART_THRESHOLD": ("32M", setting("multipart_threshold"), 32 << 20, BOTH),
    "MULTIPART_PART_SIZE": ("8M", setting("multipart_part_size"), 8 << 20, BOTH),
    "MULTIPART_ORPHAN_AGE": ("3600", setting("multipart_orphan_age"), 3600.0, BOTH),
    "DOWNLOAD_PART_SIZE": ("4M", setting("download_part_size"), 4 << 20, BOTH),
    "CA_BUNDLE": ("/etc/ca.pem", setting("ca_bundle"), "/etc/ca.pem", BOTH),
    "GCS_ENDPOINT": ("http://127.0.0.1:4443", setting("gcs_endpoint"), "http://127.0.0.1:4443", BOTH),
    "SSH_KNOWN_HOSTS": ("/etc/kh", setting("ssh_known_hosts"), "/etc/kh", BOTH),
    "BUNDLE": ("1", setting("bundle"), True, BOTH),
    "BUNDLE_SITES": ("a,b", setting("bundle_sites"), "a,b", BOTH),
    "BUNDLE_MIN_FILES": ("20", setting("bundle_min_files"), 20, BOTH),
    "BUNDLE_MAX_MEMBER_SIZE": ("64K", setting("bundle_max_member_size"), 64 << 10, BOTH),
    "BUNDLE_MAX_SIZE": ("1M", setting("bundle_max_size"), 1 << 20, BOTH),
    "GCS_ANONYMOUS": ("1", gcs_anonymous, True, BOTH),
    "AZURE_CREDENTIAL": ("managed-identity", azure_credential, "managed-identity", BOTH),
    "CACHE_DIR": ("{home}/c", cache("directory"), "{home}/c", BOTH),
    "CACHE_MAX_BYTES": ("2G", cache("max_bytes"), 2 << 30, BOTH),
    "CACHE_HIGH_WATERMARK": ("0.95", cache("high_watermark"), 0.95, BOTH),
    "CACHE_LOW_WATERMARK": ("0.5", cache("low_watermark"), 0.5, BOTH),
    "CACHE_MIN_FREE_BYTES": ("5M", cache("min_free_bytes"), 5 << 20, BOTH),
    "CACHE_PIN_SECONDS": ("60", cache("pin_seconds"), 60.0, BOTH),
    "CACHE_HARDLINK": ("0", cache("hardlink"), False, BOTH),
    "CACHE_FSYNC": ("0", cache("fsync"), False, BOTH),
    "CACHE_VERIFY_BYTES": ("2M", cache("verify_bytes"), 2 << 20, BOTH),
    "CACHE_UPLOADS": ("1", cache("uploads"), True, BOTH),
    "P2P_REDIS": ("redis://127.0.0.1:2/0", lambda env: (peer_config_from_env(dropin(
        {P + "P2P_TOKEN": "t0", P + "P2P_CA_FILE": "/etc/ca0.pem", **env})[0])
        or argparse.Namespace(redis_url=None)).redis_url,
        "redis://127.0.0.1:2/0", BOTH),
    "P2P_CLUSTER": ("1", peers("cluster"), True, BOTH),
    "P2P_NAMESPACE": ("ns1", peers("namespace"), "ns1", BOTH),
    "P2P_TOKEN": ("t1", pool_token, "t1", BOTH),
    "P2P_TOKEN_FILE": ("{home}/token", peers("token"), "file-token", BOTH),
    "P2P_CA_FILE": ("/etc/pool-ca.pem", peers("ca_file"), "/etc/pool-ca.pem", BOTH),
    "P2P_PLAIN_HTTP": ("1", peers("plain_http"), True, BOTH),
    "P2P_NETWORKS": ("10.1.0.0/16", lambda env: [str(n) for n in peers("networks")(env)], ["10.1.0.0/16"], BOTH),
    "P2P_NODE": ("node-7", peers("node"), "node-7", BOTH),
    "P2P_RACK": ("rack-3", peers("rack"), "rack-3", BOTH),
    "P2P_CONNECT_TIMEOUT": ("0.2", peers("connect_timeout"), 0.2, BOTH),
    "P2P_FIRST_BYTE_TIMEOUT": ("0.7", peers("first_byte_timeout"), 0.7, BOTH),
    "P2P_READ_TIMEOUT": ("3", peers("read_timeout"), 3.0, BOTH),
    "P2P_CLAIM_SECONDS": ("0", peers("claim_seconds"), 0.0, BOTH),
    "P2P_MAX_PEERS": ("5", peers("max_peers"), 5, BOTH),
    "P2P_BIND": ("127.0.0.2:9000", daemon(lambda s: s.serve.bind, "P2P_BIND"), ("127.0.0.2", 9000), BOTH),
    "P2P_CERT": ("/etc/n.crt", daemon(lambda s: s.serve.cert_file, "P2P_CERT"), "/etc/n.crt", BOTH),
    "P2P_KEY": ("/etc/n.key", daemon(lambda s: s.serve.key_file, "P2P_KEY"), "/etc/n.key", BOTH),
    "P2P_USERS": ("root=/tmp/other", daemon(lambda s: s.serve.caches, "P2P_USERS"), {"root": "/tmp/other"}, BOTH),
    "P2P_URL": ("https://n7:8470", daemon(lambda s: s.url, "P2P_URL"), "https://n7:8470", BOTH),
    "P2P_MAX_SERVES": ("4", daemon(lambda s: s.serve.max_serves, "P2P_MAX_SERVES"), 4, BOTH),
    "P2P_MAX_CONNECTIONS": ("40", daemon(lambda s: s.serve.limits.max_connections, "P2P_MAX_CONNECTIONS"), 40, BOTH),
    "P2P_HEARTBEAT_TTL": ("12", daemon(lambda s: s.heartbeat_ttl, "P2P_HEARTBEAT_TTL"), 12.0, BOTH),
    "P2P_SUMMARY_MAX": ("77", lambda env: summary(env)[1], 77, BOTH),
    "STAGER": ("{home}/stager.sock", launch.stager_socket, "{home}/stager.sock", BOTH),
    "STOCK_TRANSFER": ("{home}/pegasus-transfer", lambda env: find_stock_transfer(dropin(env)[0]),
                       "{home}/pegasus-transfer", BOTH),
    "CONFIG": ("{home}/other.conf", setting("threads"), 11, (ENVIRONMENT,)),
    "CONDOR_METHODS": ("s3", condor_methods, "s3", (ENVIRONMENT, NODE_FILE)),
    "CONDOR_CONFIG": ("{home}/node.conf", condor_config, "6", (ENVIRONMENT,)),
}


@pytest.fixture
def home(tmp_path):
    (tmp_path / ".pegasus").mkdir()
    token = tmp_path / "token"
    token.write_text("file-token\n")
    token.chmod(0o600)
    stock = tmp_path / "pegasus-transfer"
    stock.write_text("#!/bin/sh\nexit 0\n")
    stock.chmod(0o755)
    (tmp_path / "other.conf").write_text(f"{P}THREADS = 11\n")
    (tmp_path / "node.conf").write_text(f"{P}READ_TIMEOUT = 6\n")
    return tmp_path


def base_env(home):
    return {"HOME": str(home), "PATH": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true"}


def with_source(home, source, name, value):
    env = base_env(home)
    if source == ENVIRONMENT:
        env[name] = value
    elif source == CONFIG_FILE:
        (home / ".pegasus" / "cloudio.conf").write_text(f"# site settings\n{name} = {value}\n")
    else:
        node = home / "node-methods.conf"
        node.write_text(f"{name} = {value}\n")
        env[P + "CONDOR_CONFIG"] = str(node)
    return env


def test_every_documented_knob_has_a_probe():
    documented = documented_knobs()
    assert documented - {P + name for name in KNOBS} == set(), "documented knobs without a probe"
    assert {P + name for name in KNOBS} - documented == set(), "probes of knobs the docs do not name"


CASES = [(name, source) for name, (_, _, _, sources) in KNOBS.items() for source in sources]


@pytest.mark.parametrize("name,source", CASES, ids=[f"{n}-{s.replace(' ', '_')}" for n, s in CASES])
def test_a_documented_knob_takes_effect_from_each_documented_source(home, name, source):
    value, probe, expected, _ = KNOBS[name]
    value = value.format(home=home)
    expected = expected.format(home=home) if isinstance(expected, str) else expected
    default = probe(base_env(home))
    seen = probe(with_source(home, source, P + name, value))
    assert seen == expected, f"{P}{name}={value} in the {source}: the command saw {seen!r}"
    assert default != expected, f"{P}{name}: the probe cannot tell the knob from its default"


def test_precedence_is_command_line_then_environment_then_config_file(home):
    (home / ".pegasus" / "cloudio.conf").write_text(f"{P}MAX_ATTEMPTS = 5\n{P}READ_TIMEOUT = 7\n")
    env = base_env(home)
    assert dropin(env)[1].max_attempts == 5                                  # file over default
    assert dropin({**env, P + "MAX_ATTEMPTS": "6"})[1].max_attempts == 6      # environment over file
    assert dropin({**env, P + "MAX_ATTEMPTS": "6"}, "-m", "2")[1].max_attempts == 2  # -m over both
    assert dropin(env)[1].read_timeout == 7.0


def test_threads_a_cloudio_setting_beats_the_planners_flag_from_either_source(home):
    env = base_env(home)
    assert dropin(env, "--threads", "1")[1].threads == 1
    assert dropin({**env, "PEGASUS_TRANSFER_THREADS": "4"})[1].threads == 4
    (home / ".pegasus" / "cloudio.conf").write_text(f"{P}THREADS = 6\n")
    assert dropin(env, "--threads", "1")[1].threads == 6
    assert dropin({**env, P + "THREADS": "9"}, "--threads", "1")[1].threads == 9


def test_every_command_reads_the_config_file_and_the_environment(home):
    (home / ".pegasus" / "cloudio.conf").write_text(f"{P}THREADS = 6\n")
    env = base_env(home)
    parsed = s3cli.build_parser().parse_args(["ls", "s3://u@site/b"])
    assert s3cli._settings(s3cli._knobs(env, parsed)).threads == 6
    assert s3cli._settings(s3cli._knobs({**env, P + "THREADS": "2"}, parsed)).threads == 2
    legacy = s3cli.build_parser().parse_args(["get", "-p", "3", "s3://u@site/b/k", "f"])
    assert s3cli._settings(s3cli._knobs(env, legacy)).threads == 3                 # -p over the file
    assert plugin_threads(env) == 6 and plugin_threads({**env, P + "THREADS": "2"}) == 2
    assert dropin(env)[1].threads == 6


def test_cache_cli_options_win_over_environment_and_file(home):
    from pegasus_cloudio.cache.cli import _config
    (home / ".pegasus" / "cloudio.conf").write_text(f"{P}CACHE_DIR = {home}/from-file\n")
    env = base_env(home)
    unset = argparse.Namespace(dir=None, max_bytes=None)
    assert _config(unset, env).directory == f"{home}/from-file"
    env[P + "CACHE_DIR"] = f"{home}/from-env"
    assert _config(unset, env).directory == f"{home}/from-env"
    flagged = argparse.Namespace(dir=f"{home}/from-flag", max_bytes=3 << 30)
    assert _config(flagged, env).directory == f"{home}/from-flag" and _config(flagged, env).max_bytes == 3 << 30


# ----------------------------------------------------------------------------- the drop-in, end to end
# The defects as users met them (before: each of these failed), through the installed command's
# own entry point in a fresh process.

def run_dropin(home, spec, *args, **env):
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.dropin", *args], input=json.dumps(spec).encode(),
                          capture_output=True, cwd=home, timeout=120,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                               "HOME": str(home), P + "CACHE_DIR": "off", "AWS_EC2_METADATA_DISABLED": "true", **env})
    return done.returncode, done.stderr.decode()


def entry(src, dst):
    return {"type": "transfer", "src_urls": [{"site_label": "local", "url": src}],
            "dest_urls": [{"site_label": "local", "url": dst}]}


def test_dropin_max_attempts_from_the_environment_and_the_file_beat_the_flags_default(home):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/x"  # bound, never listening: refused
        spec = [entry(url, f"file://{home}/out")]
        fast = {P + "RETRY_BASE_DELAY": "0.01", P + "RETRY_MAX_DELAY": "0.02"}
        rc, err = run_dropin(home, spec, **fast, **{P + "MAX_ATTEMPTS": "1"})
        assert rc == 1 and "(after 1 attempt(s))" in err, err
        (home / ".pegasus" / "cloudio.conf").write_text(f"{P}MAX_ATTEMPTS = 2\n")
        rc, err = run_dropin(home, spec, **fast)
        assert rc == 1 and "(after 2 attempt(s))" in err, err
        rc, err = run_dropin(home, spec, "-m", "1", **fast)
        assert rc == 1 and "(after 1 attempt(s))" in err, err


def test_dropin_threads_stager_and_stock_tool_from_the_config_file(home):
    (home / "in").write_bytes(b"data")
    marker = home / "stock-ran"
    stock = home / "pegasus-transfer"
    stock.write_text(f"#!/bin/sh\ntouch {marker}\nexit 0\n")
    (home / ".pegasus" / "cloudio.conf").write_text(f"{P}THREADS = 6\n{P}STOCK_TRANSFER = {stock}\n")
    spec = [entry(f"file://{home}/in", f"file://{home}/out"), entry("gsiftp://grid.example/x", f"file://{home}/g")]
    rc, err = run_dropin(home, spec, "-d", "--threads", "1")
    assert rc == 0, err
    assert "settings: Settings(threads=6," in err and marker.exists()
    with StagerProcess() as stager:
        (home / ".pegasus" / "cloudio.conf").write_text(f"{P}STAGER = {stager.socket_path}\n")
        rc, err = run_dropin(home, spec[:1])
        assert rc == 0, err
        wait_for(lambda: " job pid " in stager.log_tail(1000), "the stager's log of the job it ran")


# ----------------------------------------------------------------------------- the knob table


def test_the_knob_table_in_the_docs_is_the_generated_one():
    """docs/knobs.md is ``python -m transfer.knobs``'s output: a knob added, renamed or given
    another default in transfer/knobs.py and not regenerated fails here."""
    done = subprocess.run([sys.executable, "-m", "transfer.knobs"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert (ROOT / "docs" / "knobs.md").read_text() == done.stdout, "regenerate: python -m transfer.knobs > docs/knobs.md"


def test_the_knob_table_defaults_are_the_readers_defaults():
    """Each default the table states is the one its reader applies (read with no knob set)."""
    from pegasus_cloudio.p2p.summary import DEFAULT_MAX
    from transfer.config import Settings, parse_size
    from transfer.knobs import TABLE
    from transfer.p2p.config import PeerConfig
    stated = {name: default for name, default, *_ in TABLE}
    settings, peers = Settings(), PeerConfig(redis_url="redis://x", token="t")
    cache = config_from_env({P + "CACHE_DIR": "/tmp/c", P + "CACHE_MAX_BYTES": "1"})
    readers = {**{f.upper(): getattr(settings, f) for f in ("threads", "max_attempts", "retry_base_delay",
                                                              "retry_max_delay", "connect_timeout", "read_timeout",
                                                              "multipart_threshold", "multipart_part_size",
                                                              "download_part_size", "bundle_min_files",
                                                              "bundle_max_member_size", "bundle_max_size")},
               **{"CACHE_" + f.upper(): getattr(cache, f) for f in ("high_watermark", "low_watermark",
                                                                     "min_free_bytes", "pin_seconds", "verify_bytes")},
               **{"P2P_" + f.upper(): getattr(peers, f) for f in ("connect_timeout", "first_byte_timeout",
                                                                   "read_timeout", "claim_seconds", "max_peers",
                                                                   "namespace")},
               "P2P_SUMMARY_MAX": DEFAULT_MAX, "BUNDLE": int(settings.bundle),
               "CACHE_HARDLINK": int(cache.hardlink), "CACHE_FSYNC": int(cache.fsync)}
    for name, value in readers.items():
        text = stated[name]
        if isinstance(value, str):
            assert text == value, name
        elif text[-1:] in "KMGT" and text[:-1].isdigit():
            assert parse_size(text) == value, name
        else:
            assert float(text) == float(value), name
