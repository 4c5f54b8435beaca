"""The node stager's trust boundaries (``docs/security.md``): its socket is never reached
through another user's symbolic link, and a job that sees another file system (another
mount namespace: a container, HTCondor's MOUNT_UNDER_SCRATCH) is refused with one line and
runs in its own process, where its paths mean what it thinks; and a job's process works in
the directory whose descriptor its client sent, never one found by path or by pid."""

import json
import os
import pwd
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from unix_users import new_users

from pegasus_cloudio.stager.server import StagerError, listen
from pegasus_cloudio_testbed.stager import StagerProcess
from test_stager import _parts, _stalled_get, entry, job_env, served, wait_for

NOBODY = 65534


def test_a_socket_path_through_another_users_symlink_is_refused(tmp_path):
    """Mallory owns ``link -> dir``: she can point it elsewhere at any time, so the stager
    refuses the path, as the node cache refuses the same layout."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(StagerError, match="symbolic link owned by another user"):
        listen(str(link / "s.sock"))
    assert not (real / "s.sock").exists()
    own = tmp_path / "own"
    own.symlink_to(real)  # a link of one's own is fine
    listen(str(own / "s.sock")).close()


def test_a_job_from_another_mount_namespace_runs_in_its_own_process(native_dropin, tmp_path):
    """The job's cwd and paths are resolved in its mount namespace; the stager would resolve
    them in its own and could write outside the job's sandbox. It refuses, the job says why
    in one line and transfers in-process, and the stager serves no job."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "in.dat").write_bytes(b"input")
    spec = json.dumps([entry(f"file://{job}/in.dat", f"file://{job}/out.dat")])
    with StagerProcess() as stager:
        argv = ["unshare", "--mount", "--propagation", "private", *native_dropin]
        done = subprocess.run(argv, input=spec.encode(), capture_output=True, env=job_env(stager.socket_path),
                              cwd=job, timeout=120)
        err = done.stderr.decode()
        assert done.returncode == 0, err
        assert (job / "out.dat").read_bytes() == b"input"
        refusals = [line for line in err.splitlines() if "refused the job" in line]
        assert len(refusals) == 1 and "another mount namespace" in refusals[0], err
        assert "transferring in this process" in refusals[0]
        assert not served(stager)
        # the same job from this namespace is served by the stager
        done = subprocess.run(native_dropin, input=spec.encode(), capture_output=True, env=job_env(stager.socket_path),
                              cwd=job, timeout=120)
        assert done.returncode == 0 and b"refused" not in done.stderr
        wait_for(lambda: served(stager), "the stager's log line")


def _child_of(pid):
    """The one child process of ``pid`` (as this namespace numbers it), once it exists."""
    found = []

    def one():
        try:
            found[:] = open(f"/proc/{pid}/task/{pid}/children").read().split()
        except OSError:
            return False
        return len(found) == 1
    wait_for(one, f"the child of {pid}")
    return int(found[0])


def test_sigterm_reaches_the_job_of_a_client_in_another_pid_namespace(native_dropin, proxied, minio, bucket,
                                                                       tmp_path):
    """A client in another pid namespace (same file system) numbers processes differently:
    the pid the stager sends names no process there, or another one, so HTCondor's SIGTERM
    to the client would never reach the job. The stager refuses such a job (one line), which
    runs in the client's own process, where SIGTERM ends it as without the stager."""
    proxy, env = proxied
    job, spec = _stalled_get(proxy, minio, bucket, tmp_path)
    with StagerProcess() as stager:
        argv = ["unshare", "--pid", "--fork", "--kill-child", *native_dropin]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, cwd=job,
                                env=job_env(stager.socket_path, **env))
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
        wait_for(lambda: _parts(job) and os.path.getsize(_parts(job)[0]) > 0, "a partial download")
        os.kill(_child_of(proc.pid), signal.SIGTERM)  # the client, pid 1 of its namespace
        try:
            rc = proc.wait(timeout=20)  # the stall lasts 60 s
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail("SIGTERM to the client did not reach its job")
        err = proc.stderr.read().decode()
        assert rc == 1 and "Exiting due to signal 15" in err, err
        refusals = [line for line in err.splitlines() if "refused the job" in line]
        assert len(refusals) == 1 and "another pid namespace" in refusals[0], err
        assert _parts(job) == [] and not (job / "big.dat").exists()
        assert not served(stager)


# A client that pauses between taking its working directory's path and sending it, so the
# test can do in that window what another user may do at any time.
_PAUSING_CLIENT = r"""
import os, socket, sys
from pegasus_cloudio.stager import wire
ready, go = int(sys.argv[2]), int(sys.argv[3])
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
request = wire.encode_request(os.getcwd(), 0o022, ["-f", "spec.json"], dict(os.environ))
socket.send_fds(sock, [wire.length(len(request))], [0, 1, 2, os.open(".", os.O_PATH | os.O_DIRECTORY)])
os.write(ready, b"1")
os.read(go, 1)
sock.sendall(request)
started = wire.read_reply(sock)
assert started is not None and started[0] == wire.PID, started
done = wire.read_reply(sock)
sys.exit(done[1] if done is not None else 99)
"""


@pytest.fixture
def other_user():
    """A new Unix user's uid, removed after the test."""
    with new_users(1) as (user,):
        yield user.pw_uid


def as_user(uid, action):
    """``action()`` in a child process running as ``uid`` (its primary group, no other); it
    must succeed."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(pwd.getpwuid(uid).pw_gid)
            os.setuid(uid)
            action()
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0


def test_the_job_runs_in_the_clients_directory_even_if_its_path_changes_hands(other_user, tmp_path):
    """A job's directory inside a shared directory without the sticky bit (a group-writable
    project area): another member can rename it and put a directory of hers in its place.
    The client's process stays in its own directory (it holds it, not its name); so must the
    stager's, or the job reads her spec.json and copies the job's files where she says."""
    shared = Path(tempfile.mkdtemp(prefix="pcio-shared-"))
    try:
        shared.chmod(0o777)  # no sticky bit
        secret = tmp_path / "secret.dat"
        secret.write_bytes(b"the job's private bytes")
        mine, theirs = tmp_path / "copy-for-the-job.dat", shared / "copy-for-mallory.dat"
        job = shared / "job"
        job.mkdir()
        (job / "spec.json").write_text(json.dumps([entry(f"file://{secret}", f"file://{mine}")]))

        def swap():
            os.rename(job, shared / "moved")
            job.mkdir()
            (job / "spec.json").write_text(json.dumps([entry(f"file://{secret}", f"file://{theirs}")]))

        with StagerProcess() as stager:
            ready_r, ready_w = os.pipe()
            go_r, go_w = os.pipe()
            client = subprocess.Popen([sys.executable, "-c", _PAUSING_CLIENT, stager.socket_path, str(ready_w),
                                       str(go_r)], cwd=job, env=job_env(stager.socket_path), pass_fds=(ready_w, go_r),
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            os.close(ready_w)
            os.close(go_r)
            assert os.read(ready_r, 1) == b"1"
            as_user(other_user, swap)
            os.write(go_w, b"1")
            out, err = client.communicate(timeout=120)
            os.close(ready_r)
            os.close(go_w)
        assert not theirs.exists(), "the job ran in the other user's directory"
        assert client.returncode == 0, err.decode()
        assert mine.read_bytes() == b"the job's private bytes"
    finally:
        subprocess.run(["rm", "-rf", str(shared)], check=False)


# A client sending a request of its own making: argv[2] is the path it opens as the job's
# directory (none: only the three streams go), argv[3] the working directory it names in the
# request; it writes what the stager answered ("refused: <reason>" or "exit <code>") to argv[4].
_HAND_MADE_CLIENT = r"""
import os, socket, sys
from pegasus_cloudio.stager import wire
path, sent, named, result = sys.argv[1:5]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(path)
request = wire.encode_request(named, 0o022, ["-f", "spec.json"], dict(os.environ))
fds = [0, 1, 2] + ([os.open(sent, os.O_RDONLY)] if sent else [])
socket.send_fds(sock, [wire.length(len(request))], fds)
sock.sendall(request)
started = wire.read_reply(sock)
if started is not None and started[0] == wire.REFUSED:
    answer = "refused: " + wire.read_reason(sock, started[1])
else:
    assert started is not None and started[0] == wire.PID, started
    done = wire.read_reply(sock)
    answer = "exit %s" % (done[1] if done is not None else None)
with open(result, "w") as out:
    out.write(answer)
"""


def hand_made_job(stager, cwd, sent, named, tmp_path):
    """What the stager answered :data:`_HAND_MADE_CLIENT`, run in ``cwd``, sending ``sent``
    (None: three descriptors) and naming ``named`` as its directory."""
    result = tmp_path / "answer"
    done = subprocess.run([sys.executable, "-c", _HAND_MADE_CLIENT, stager.socket_path, str(sent or ""), str(named),
                           str(result)], cwd=cwd, env=job_env(stager.socket_path), stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return result.read_text()


def _three_jobs(tmp_path):
    """Directories ``sent``, ``here`` and ``named``, each with a spec.json copying one secret to
    a file of its own name in ``out``: (the directories, ``out``, the secret's bytes)."""
    secret, out = tmp_path / "secret.dat", tmp_path / "out"
    secret.write_bytes(b"the job's bytes")
    out.mkdir()
    dirs = {}
    for name in ("sent", "here", "named"):
        dirs[name] = tmp_path / name
        dirs[name].mkdir()
        (dirs[name] / "spec.json").write_text(json.dumps([entry(f"file://{secret}", f"file://{out}/{name}")]))
    return dirs, out, secret.read_bytes()


def test_the_job_runs_in_the_directory_whose_descriptor_the_client_sent(tmp_path):
    """Not in the client's current directory (``/proc/<pid>/cwd``: if the client dies, another
    process of the user may get its pid), nor in the one its path names: the descriptor holds
    the directory itself."""
    dirs, out, secret = _three_jobs(tmp_path)
    with StagerProcess() as stager:
        answer = hand_made_job(stager, dirs["here"], dirs["sent"], dirs["named"], tmp_path)
        assert answer == "exit 0"
        assert sorted(p.name for p in out.iterdir()) == ["sent"] and (out / "sent").read_bytes() == secret
        wait_for(lambda: served(stager), "the stager's log line")


def test_a_request_without_a_directory_descriptor_or_with_a_file_is_refused(native_dropin, tmp_path):
    """An older client (three descriptors: the stager would have to find the directory by pid)
    and a descriptor that is not a directory: the stager runs neither job, says why in one line,
    and serves the next job."""
    dirs, out, secret = _three_jobs(tmp_path)
    with StagerProcess() as stager:
        older = hand_made_job(stager, dirs["here"], None, dirs["named"], tmp_path)
        assert older.startswith("refused: ") and "\n" not in older
        assert "3 descriptors" in older and "working directory" in older, older
        a_file = hand_made_job(stager, dirs["here"], dirs["sent"] / "spec.json", dirs["named"], tmp_path)
        assert a_file.startswith("refused: ") and "\n" not in a_file
        assert "not a directory" in a_file, a_file
        assert list(out.iterdir()) == []
        done = subprocess.run([*native_dropin, "-f", "spec.json"], cwd=dirs["sent"], env=job_env(stager.socket_path),
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        assert done.returncode == 0 and b"node stager" not in done.stderr, done.stderr.decode()
        assert (out / "sent").read_bytes() == secret
        wait_for(lambda: len(served(stager)) == 3, "the stager's log lines")  # the refusing copies' too
        assert " exited 0 " in served(stager)[-1]


# A client in another mount namespace (refused) that announces a request and then sends it
# one byte every half second: each read waits less than a second, the whole never ends.
_DRIPPING_CLIENT = r"""
import socket, sys, time
from pegasus_cloudio.stager import wire
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
socket.send_fds(sock, [wire.length(4096)], [0, 1, 2])
print("sent", flush=True)
try:
    for _ in range(4096):
        time.sleep(0.5)
        sock.send(b"x")
except OSError:  # the stager hung up
    print("hung up", flush=True)
"""


def test_a_refused_client_sending_slowly_does_not_hold_up_the_next_job(native_dropin, tmp_path):
    """The stager refuses a client in another mount or pid namespace (a container of the same
    user, which may not be able to signal the stager) on its own loop. A client dripping its
    request just inside each read's timeout must not keep that loop from the next job: the
    whole refusal has one short deadline."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "in.dat").write_bytes(b"input")
    spec = json.dumps([entry(f"file://{job}/in.dat", f"file://{job}/out.dat")])
    with StagerProcess() as stager:
        dripper = subprocess.Popen(["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
                                    _DRIPPING_CLIENT, stager.socket_path], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert dripper.stdout.readline() == "sent\n", dripper.stderr.read()
            try:  # the drip lasts 34 minutes
                done = subprocess.run(native_dropin, input=spec.encode(), capture_output=True, cwd=job,
                                      env=job_env(stager.socket_path), timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail("the stager took no job while it refused a slow client")
            assert done.returncode == 0 and b"refused" not in done.stderr, done.stderr.decode()
            assert (job / "out.dat").read_bytes() == b"input"
            wait_for(lambda: served(stager), "the stager's log line")
            assert "refused a job" in stager.log_tail(1000)
            assert dripper.stdout.readline() == "hung up\n"
        finally:
            dripper.kill()
            dripper.wait()
