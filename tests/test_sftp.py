"""The scp:// / sftp:// backend against a real OpenSSH sshd (keys generated per run).

Connections are counted at a byte relay in front of sshd: one accepted TCP connection is
one SSH handshake. The remote directories are on this machine, so tests look at them
directly to see what a remote user would see.
"""

import errno
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from transfer import Engine, Session, Settings, Transfer, parse_url
from transfer.backends._ssh import endpoint_for, translate
from transfer.errors import AuthError, ConfigError, InvalidInput, NotFound, RemoteError, TransientError

OURS = [sys.executable, "-m", "pegasus_cloudio.dropin"]


def dropin(spec, env, cwd, *args):
    done = subprocess.run(OURS + list(args), input=json.dumps(spec), env=dict(env, PATH=os.environ["PATH"]),
                          cwd=cwd, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr


def transfer(src, dst, lfn, src_label="local", dst_label="local"):
    return {"type": "transfer", "lfn": lfn, "id": 1, "src_urls": [{"site_label": src_label, "url": src}],
            "dest_urls": [{"site_label": dst_label, "url": dst}]}


def write_files(folder, count, size=300):
    os.makedirs(folder, exist_ok=True)
    names = [f"f{i:04d}.dat" for i in range(count)]
    for name in names:
        with open(os.path.join(folder, name), "wb") as fh:
            fh.write(os.urandom(size))
    return names


def same_files(a, b, names):
    return all(open(os.path.join(a, n), "rb").read() == open(os.path.join(b, n), "rb").read() for n in names)


# --------------------------------------------------------------------------- one connection per batch


def test_a_batch_of_hundreds_of_files_uses_one_ssh_connection_each_way(ssh_env, ssh_relay, ssh_relay_base,
                                                                        ssh_remote_dir, tmp_path):
    names = write_files(str(tmp_path / "src"), 300)
    out = [transfer(f"file://{tmp_path}/src/{n}", f"{ssh_relay_base}/run/{n}", n) for n in names]
    rc, err = dropin(out, ssh_env, tmp_path, "--threads", "4")
    assert rc == 0, err
    assert ssh_relay.connections == 1
    assert same_files(str(tmp_path / "src"), os.path.join(ssh_remote_dir, "run"), names)

    ssh_relay.reset_counters()
    back = [transfer(f"{ssh_relay_base}/run/{n}", f"file://{tmp_path}/back/{n}", n) for n in names]
    rc, err = dropin(back, ssh_env, tmp_path, "--threads", "4")
    assert rc == 0, err
    assert ssh_relay.connections == 1
    assert same_files(str(tmp_path / "src"), str(tmp_path / "back"), names)


def test_more_threads_than_the_server_allows_sessions_still_share_one_connection(ssh_env, ssh_relay,
                                                                                  ssh_relay_base, tmp_path):
    names = write_files(str(tmp_path / "src"), 60)
    with Session(Settings(threads=16), ssh_env) as session:  # sshd's MaxSessions is 10
        results = Engine(session).run([Transfer((parse_url(f"file://{tmp_path}/src/{n}"),),
                                                parse_url(f"{ssh_relay_base}/{n}")) for n in names])
    assert all(r.ok and r.attempts == 1 for r in results), [str(r.error) for r in results if not r.ok][:3]
    assert ssh_relay.connections == 1


# --------------------------------------------------------------------------- dropped connections


def test_an_interrupted_upload_never_appears_under_its_final_name(ssh_env, ssh_relay, ssh_relay_base,
                                                                  ssh_remote_dir, tmp_path):
    fifo = tmp_path / "slow-source"
    os.mkfifo(fifo)  # the upload reads what the test writes, so the drop lands mid-upload for sure
    url = parse_url(f"{ssh_relay_base}/big.dat")
    outcome = {}
    with Session(Settings(threads=2), ssh_env) as session:
        backend = session.backend(url)

        def upload():
            try:
                backend.put(str(fifo), url)
            except Exception as err:  # noqa: BLE001 - handed to the test thread
                outcome["error"] = err

        worker = threading.Thread(target=upload)
        worker.start()
        with open(fifo, "wb") as feed:
            feed.write(os.urandom(1 << 20))
            feed.flush()
            temp = _wait_for_partial(ssh_remote_dir, worker)
            assert ssh_relay.drop_connections() == 1
        worker.join(60)
        assert isinstance(outcome.get("error"), TransientError), outcome
        assert not os.path.exists(os.path.join(ssh_remote_dir, "big.dat"))
        assert temp.startswith(".big.dat.") and temp.endswith(".part")

        data = os.urandom(3 << 20)
        (tmp_path / "big.dat").write_bytes(data)
        backend.put(str(tmp_path / "big.dat"), url)  # same backend: reconnects
    with open(os.path.join(ssh_remote_dir, "big.dat"), "rb") as fh:
        assert fh.read() == data
    assert os.listdir(ssh_remote_dir) == ["big.dat"]  # the orphaned temp file was removed too
    assert ssh_relay.connections == 2


def _wait_for_partial(folder, worker):
    """The name of the upload's temp file once the server has some of its bytes."""
    while worker.is_alive():
        for name in os.listdir(folder):
            if os.path.getsize(os.path.join(folder, name)) > 0:
                return name
        threading.Event().wait(0.01)
    raise AssertionError("upload ended before any byte reached the server")


def test_the_call_after_a_dropped_connection_reconnects(ssh_env, ssh_relay, ssh_relay_base, ssh_remote_dir):
    with open(os.path.join(ssh_remote_dir, "x"), "wb") as fh:
        fh.write(b"12345")
    url = parse_url(f"{ssh_relay_base}/x")
    with Session(Settings(threads=2), ssh_env) as session:
        backend = session.backend(url)
        assert backend.stat(url).size == 5
        assert ssh_relay.drop_connections() == 1
        assert backend.stat(url).size == 5
        sink = io.BytesIO()
        backend.get(url, sink)
        assert sink.getvalue() == b"12345"
        assert backend.handshakes == 2
    assert ssh_relay.connections == 2


# --------------------------------------------------------------------------- host keys


def _stat_with(env, base):
    with Session(env=env) as session:
        url = parse_url(f"{base}/probe")
        session.backend(url).make_dirs(url)
        return session.backend(url).stat(url)


def test_host_keys_are_accepted_by_default_and_checked_when_known_hosts_is_set(ssh_server, ssh_env, ssh_base,
                                                                               tmp_path):
    assert _stat_with(ssh_env, ssh_base).size >= 0  # default: like scp -o StrictHostKeyChecking=no
    known = tmp_path / "known_hosts"
    known.write_text(ssh_server.known_hosts)
    strict = dict(ssh_env, PEGASUS_CLOUDIO_SSH_KNOWN_HOSTS=str(known))
    assert _stat_with(strict, ssh_base).size >= 0

    impostor = ssh_server.client_public_key.split()[:2]  # a valid ed25519 key, but not the host's
    known.write_text(f"[{ssh_server.host}]:{ssh_server.port} {' '.join(impostor)}\n")
    with pytest.raises(AuthError) as info:
        _stat_with(strict, ssh_base)
    assert "does not match" in str(info.value) and str(known) in str(info.value)

    known.write_text(f"[other.example.org]:{ssh_server.port} {' '.join(impostor)}\n")
    with pytest.raises(AuthError) as info:
        _stat_with(strict, ssh_base)
    assert "not in the known_hosts" in str(info.value)
    assert ssh_server.host_key_fingerprints[0] in str(info.value)


def test_known_hosts_with_ca_and_revoked_lines_and_several_keys_per_host(ssh_server, ssh_env, ssh_base, tmp_path):
    """A real-world known_hosts file: ``@cert-authority`` lines (host certificates are not
    supported: such lines are skipped), ``@revoked`` lines (a revoked key is refused whatever
    else lists it, as OpenSSH does), and several keys of one type for a host (any one matches)."""
    known = tmp_path / "known_hosts"
    strict = dict(ssh_env, PEGASUS_CLOUDIO_SSH_KNOWN_HOSTS=str(known))
    other = " ".join(ssh_server.client_public_key.split()[:2])  # a valid ed25519 key, not the host's
    name = f"[{ssh_server.host}]:{ssh_server.port}"
    known.write_text(f"@cert-authority *.example.org {other}\n{name} {other}\n{ssh_server.known_hosts}")
    assert _stat_with(strict, ssh_base).size >= 0

    known.write_text(f"{ssh_server.known_hosts}@revoked * {ssh_server.known_hosts.split(None, 1)[1]}")
    with pytest.raises(AuthError) as info:
        _stat_with(strict, ssh_base)
    assert "revoked" in str(info.value) and str(known) in str(info.value)


# --------------------------------------------------------------------------- keys


def _keygen(path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def test_a_group_readable_key_is_refused_with_the_fix(ssh_server, ssh_env, ssh_base, tmp_path):
    key = tmp_path / "key"
    key.write_bytes(ssh_server.client_key.read_bytes())
    key.chmod(0o640)
    with pytest.raises(ConfigError) as info:
        _stat_with(dict(ssh_env, SSH_PRIVATE_KEY=str(key)), ssh_base)
    assert f"chmod 600 {key}" in str(info.value)


def test_key_errors_are_clear_and_show_no_key_material(ssh_server, ssh_env, ssh_base, tmp_path):
    with pytest.raises(ConfigError) as info:
        _stat_with(dict(ssh_env, SSH_PRIVATE_KEY=str(tmp_path / "missing")), ssh_base)
    assert "not found" in str(info.value) and str(tmp_path / "missing") in str(info.value)

    garbage = tmp_path / "garbage"
    garbage.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nc2VjcmV0LXNlY3JldC1zZWNyZXQ=\n"
                       "-----END OPENSSH PRIVATE KEY-----\n")
    garbage.chmod(0o600)
    with pytest.raises(ConfigError) as info:
        _stat_with(dict(ssh_env, SSH_PRIVATE_KEY=str(garbage)), ssh_base)
    assert "cannot load SSH private key" in str(info.value) and "c2VjcmV0" not in str(info.value)

    stranger = _keygen(tmp_path / "stranger")
    with pytest.raises(AuthError) as info:
        _stat_with(dict(ssh_env, SSH_PRIVATE_KEY=str(stranger)), ssh_base)
    text = str(info.value)
    assert f"user {ssh_server.user}" in text and str(stranger) in text
    body = "".join(stranger.read_text().splitlines()[1:-1])
    assert body[:40] not in text


def test_the_site_key_wins_over_the_generic_one(ssh_server, ssh_env, ssh_base, tmp_path):
    env = dict(ssh_env, SSH_PRIVATE_KEY=str(_keygen(tmp_path / "stranger")),
               SSH_PRIVATE_KEY_submit_host=str(ssh_server.client_key))
    with Session(env=env) as session:
        url = parse_url(f"{ssh_base}/k", site_label="submit-host")
        session.backend(url).make_dirs(url)
        assert session.backend(url).stat(url).size >= 0


def test_without_a_configured_key_the_agent_and_default_keys_are_used(ssh_server, ssh_base, tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_bytes(ssh_server.client_key.read_bytes())
    (home / ".ssh" / "id_ed25519").chmod(0o600)
    assert _stat_with({"HOME": str(home), "PEGASUS_CLOUDIO_CONFIG": os.devnull}, ssh_base).size >= 0

    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        while not sock.exists():
            assert agent.poll() is None, "ssh-agent exited"
            threading.Event().wait(0.01)
        subprocess.run(["ssh-add", "-q", str(ssh_server.client_key)], check=True, capture_output=True,
                       env=dict(os.environ, SSH_AUTH_SOCK=str(sock)))
        empty_home = tmp_path / "empty"
        empty_home.mkdir()
        env = {"HOME": str(empty_home), "SSH_AUTH_SOCK": str(sock), "PEGASUS_CLOUDIO_CONFIG": os.devnull}
        assert _stat_with(env, ssh_base).size >= 0
    finally:
        agent.terminate()
        agent.wait()


# --------------------------------------------------------------------------- directories


def test_mkdir_p_and_recursive_removes_share_the_connection(ssh_env, ssh_relay, ssh_relay_base, ssh_remote_dir,
                                                            tmp_path):
    src = tmp_path / "one"
    src.write_bytes(b"1")
    with Session(Settings(threads=2), ssh_env) as session:
        deep = parse_url(f"{ssh_relay_base}/a/b/c")
        backend = session.backend(deep)
        backend.make_dirs(deep)
        backend.make_dirs(deep)
        assert os.path.isdir(os.path.join(ssh_remote_dir, "a", "b", "c"))
        for key in ("a/f", "a/b/f", "a/b/c/f", "keep/x/f", "keep/g"):
            backend.put(str(src), parse_url(f"{ssh_relay_base}/{key}"))  # parents made as needed
        [refused] = backend.delete([parse_url(f"{ssh_relay_base}/a/b")])
        assert isinstance(refused, InvalidInput) and "recursive" in str(refused)
        assert backend.delete_tree(parse_url(f"{ssh_relay_base}/a")) is None
        assert backend.delete_tree(parse_url(f"{ssh_relay_base}/keep/*")) is None
        assert backend.delete_tree(parse_url(f"{ssh_relay_base}/never")) is None
    assert sorted(os.listdir(ssh_remote_dir)) == ["keep"]
    assert os.listdir(os.path.join(ssh_remote_dir, "keep")) == []
    assert ssh_relay.connections == 1


# --------------------------------------------------------------------------- data paths


def test_large_files_and_ranges_round_trip(ssh_env, ssh_base, tmp_path):
    data = os.urandom((9 << 20) + 12345)  # more than one read window
    (tmp_path / "big").write_bytes(data)
    url = parse_url(f"{ssh_base}/sub/big")
    with Session(Settings(threads=2), ssh_env) as session:
        backend = session.backend(url)
        assert backend.put(str(tmp_path / "big"), url).size == len(data)
        sink = io.BytesIO()
        assert backend.get(url, sink).size == len(data)
        assert sink.getvalue() == data
        part = io.BytesIO()
        backend.get(url, part, byte_range=(100, len(data) - 100))
        assert part.getvalue() == data[100:-100]


def test_an_upload_keeps_the_permission_bits_of_its_source(ssh_env, ssh_base, ssh_remote_dir, tmp_path):
    """As OpenSSH's scp and sftp do (the mode is sent with the open; the server's umask
    applies): an executable stays executable and a private file stays private."""
    modes = {"tool.sh": 0o755, "secret.dat": 0o600, "plain.dat": 0o644}
    with Session(Settings(threads=2), ssh_env) as session:
        for name, mode in modes.items():
            path = tmp_path / name
            path.write_bytes(b"#!/bin/sh\n")
            os.chmod(path, mode)
            url = parse_url(f"{ssh_base}/{name}")
            session.backend(url).put(str(path), url)
    umask = os.umask(0o022)  # sshd inherited this process's umask
    os.umask(umask)
    found = {name: os.stat(os.path.join(ssh_remote_dir, name)).st_mode & 0o777 for name in modes}
    assert found == {name: mode & ~umask for name, mode in modes.items()}


def test_scp_and_sftp_urls_of_one_host_share_a_backend(ssh_server, ssh_env, ssh_remote_dir):
    authority = f"{ssh_server.user}@{ssh_server.host}:{ssh_server.port}"
    with Session(env=ssh_env) as session:
        a = session.backend(parse_url(f"scp://{authority}{ssh_remote_dir}/a"))
        b = session.backend(parse_url(f"sftp://{authority}{ssh_remote_dir}/b"))
    assert a is b


def test_authorities_are_read_as_pegasus_writes_them():
    env = {"USER": "someone"}
    plain = endpoint_for(parse_url("scp://joe@submit.example.org/home/joe/wf"), env)
    colon = endpoint_for(parse_url("scp://joe@submit.example.org:/home/joe/wf"), env)
    port = endpoint_for(parse_url("scp://joe@submit.example.org:2222/home/joe/wf"), env)
    bare = endpoint_for(parse_url("sftp://submit.example.org/x"), env)
    assert (plain.user, plain.host, plain.port) == ("joe", "submit.example.org", 22)
    assert (colon.user, colon.host, colon.port) == ("joe", "submit.example.org", 22)
    assert port.port == 2222
    assert bare.user == "someone"


@pytest.mark.parametrize("error, alive, expected", [
    (IOError(errno.ENOENT, "No such file"), True, NotFound),
    (IOError(errno.EACCES, "Permission denied"), True, AuthError),
    (IOError("Failure"), True, RemoteError),          # SFTP v3: ENOSPC, EEXIST... all look like this
    (IOError("Socket is closed"), False, TransientError),
    (EOFError(), True, TransientError),
    (socket.timeout("timed out"), True, TransientError),
])
def test_sftp_errors_are_classified_by_type_errno_and_connection_state(error, alive, expected):
    found = translate(error, "scp://u@h/p", "get", alive)
    assert type(found) is expected and found.url == "scp://u@h/p" and found.operation == "get"


# --------------------------------------------------------------------------- the drop-in


def test_dropin_failed_scp_download_exits_nonzero_and_leaves_no_file(ssh_env, ssh_base, tmp_path):
    spec = [transfer(f"{ssh_base}/absent.dat", f"file://{tmp_path}/out/absent.dat", "absent.dat")]
    rc, err = dropin(spec, ssh_env, tmp_path, "-m", "1")
    assert rc == 1 and "absent.dat" in err
    assert not os.path.exists(tmp_path / "out" / "absent.dat")


def test_dropin_mkdir_and_removes_on_scp(ssh_env, ssh_base, ssh_remote_dir, tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    spec = [{"type": "mkdir", "target": {"site_label": "local", "url": f"{ssh_base}/made/deep"}}]
    spec += [transfer(f"file://{tmp_path}/f", f"{ssh_base}/tree/{n}", n) for n in ("a", "sub/b")]
    assert dropin(spec, ssh_env, tmp_path)[0] == 0
    assert os.path.isdir(os.path.join(ssh_remote_dir, "made", "deep"))
    remove = [{"type": "remove", "target": {"site_label": "local", "url": f"{ssh_base}/tree"}, "recursive": True},
              {"type": "remove", "target": {"site_label": "local", "url": f"{ssh_base}/never"}}]
    rc, err = dropin(remove, ssh_env, tmp_path)
    assert rc == 0, err
    leftovers = [f for _, _, files in os.walk(os.path.join(ssh_remote_dir, "tree")) for f in files]
    assert leftovers == []


def test_dropin_two_hops_between_scp_and_s3(ssh_env, ssh_base, ssh_remote_dir, s3_env, bucket, tmp_path):
    env = dict(s3_env, **ssh_env)
    data = os.urandom(70000)
    with open(os.path.join(ssh_remote_dir, "in.dat"), "wb") as fh:
        fh.write(data)
    to_s3 = [transfer(f"{ssh_base}/in.dat", f"s3://test@minio/{bucket}/run/in.dat", "in.dat", "local", "minio")]
    rc, err = dropin(to_s3, env, tmp_path)
    assert rc == 0, err
    to_scp = [transfer(f"s3://test@minio/{bucket}/run/in.dat", f"{ssh_base}/back/in.dat", "in.dat", "minio", "local")]
    rc, err = dropin(to_scp, env, tmp_path)
    assert rc == 0, err
    with open(os.path.join(ssh_remote_dir, "back", "in.dat"), "rb") as fh:
        assert fh.read() == data
    # the second hop's local copy is the node cache's entry (0444): the remote file is the
    # owner's to change, 0644 as pegasus-transfer's two-hop temp file makes it (less the umask)
    umask = os.umask(0o022)
    os.umask(umask)
    assert os.stat(os.path.join(ssh_remote_dir, "back", "in.dat")).st_mode & 0o777 == 0o644 & ~umask


def test_paramiko_is_imported_only_when_an_ssh_url_is_used():
    code = ("import sys, transfer; from transfer.engine import Engine; "
            "print('paramiko' in sys.modules, end=' '); "
            "from transfer.backends import backend_module; backend_module('scp'); print('paramiko' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True"]


def test_sigterm_during_an_upload_leaves_no_part_file_on_the_server(ssh_env, ssh_base, ssh_remote_dir, tmp_path):
    """HTCondor evicts with SIGTERM: the drop-in's handler removes the remote temp file of an
    upload in flight, as it removes its local ones."""
    fifo = tmp_path / "slow-source"
    os.mkfifo(fifo)  # the upload reads what the test writes: the signal lands mid-upload for sure
    spec = [transfer(f"file://{fifo}", f"{ssh_base}/big.dat", "big.dat")]
    proc = subprocess.Popen(OURS, stdin=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                            env=dict(ssh_env, PATH=os.environ["PATH"]))
    proc.stdin.write(json.dumps(spec).encode())
    proc.stdin.close()
    with open(fifo, "wb") as feed:
        feed.write(os.urandom(1 << 20))
        feed.flush()
        while not any(os.path.getsize(os.path.join(ssh_remote_dir, n)) for n in os.listdir(ssh_remote_dir)):
            assert proc.poll() is None, proc.stderr.read().decode()
            threading.Event().wait(0.01)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    err = proc.stderr.read().decode()
    assert rc == 1 and "Exiting due to signal 15" in err, err
    assert os.listdir(ssh_remote_dir) == [], err
