"""A real OpenSSH ``sshd`` on loopback, with host and client keys generated per run.

`SshServer` runs ``/usr/sbin/sshd -D -e -f <config>`` (Debian's openssh-server, installed
by ``scripts/system-deps.sh``) on a free 127.0.0.1 port. Everything it needs lives in a
private temp dir that `stop` deletes: an ed25519 host key, a client key pair whose public
half is the only entry of the ``AuthorizedKeysFile``, the generated ``sshd_config`` and the
server log. Only the current user may log in, by key only; SFTP is ``internal-sftp``.

Readiness means the port accepts a connection and sends an ``SSH-2.0`` banner.
`drop_connections` kills the per-connection sshd processes (not the listener), which is
what a server-side crash or a broken link looks like to a client.
"""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import time
from pathlib import Path
from pegasus_cloudio_testbed.process import ServerProcess
from typing import Dict, List, Optional

from .ports import free_port

__all__ = ["SshServer", "SSHD", "SSH_KEYGEN"]

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "/usr/bin/ssh-keygen"
PRIVSEP_DIR = "/run/sshd"
_PORT_ATTEMPTS = 3
_POLL_S = 0.05
_STOP_GRACE_S = 5.0
_INSTALL_WAIT_S = 600.0

_CONFIG = """\
ListenAddress 127.0.0.1:{port}
HostKey {host_key}
PidFile none
AuthorizedKeysFile {authorized_keys}
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowUsers {user}
UsePAM no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
AllowTcpForwarding no
LogLevel VERBOSE
Subsystem sftp internal-sftp
"""


class SshServer(ServerProcess):
    """OpenSSH sshd for one test session or benchmark run.

    Attributes (meaningful once started):
        host: ``127.0.0.1``.
        port: the SSH port.
        user: the account that may log in (the current user).
        client_key: private key file (mode 0600) accepted for ``user``.
        client_public_key: its ``.pub`` line.
        known_hosts: known_hosts file content naming this server's host key as
            ``[127.0.0.1]:PORT ssh-ed25519 ...``.
        host_key_fingerprints: ``SHA256:...`` fingerprints of the host keys.
        root: a directory (owned by ``user``) the tests use as remote base path.
    """

    LOG_NAME = "sshd.log"
    STOP_GRACE = _STOP_GRACE_S

    def __init__(self, *, start_timeout: float = 30.0, base_dir: Optional[str] = None) -> None:
        self.host = "127.0.0.1"
        self.port = 0
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.start_timeout = start_timeout
        self.client_key = Path()
        self.client_public_key = ""
        self.known_hosts = ""
        self.host_key_fingerprints: List[str] = []
        self.root = Path()
        self._host_public: List[str] = []
        self._base_dir = base_dir
        super().__init__()

    def start(self) -> "SshServer":
        """Generate keys and config, start sshd, wait for its banner.

        Raises RuntimeError (with the log tail) if sshd is missing, exits, or does not
        answer within ``start_timeout`` seconds; the server is stopped in that case.
        """
        _wait_for_install()
        tmp = self._make_tmp("pegasus-cloudio-sshd-", self._base_dir)
        try:
            self._make_keys()
            self.root = tmp / "root"
            self.root.mkdir()
            if os.geteuid() == 0:
                os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)
            self._launch()
        except BaseException:
            self.stop()
            raise
        return self

    def _before_stop(self, proc: "subprocess.Popen[bytes]") -> None:
        self._kill_children(proc.pid)  # per-connection sshd processes outlive the listener

    def drop_connections(self) -> int:
        """SIGKILL every per-connection sshd process; the listener keeps serving.

        Clients see their connection close mid-stream. Returns how many processes died.
        """
        if self._proc is None:
            return 0
        return self._kill_children(self._proc.pid)

    # -- internals

    def _make_keys(self) -> None:
        assert self._tmp is not None
        host_key = self._tmp / "ssh_host_ed25519_key"
        _keygen(host_key, "pegasus-cloudio test host")
        self.client_key = self._tmp / "client_ed25519"
        _keygen(self.client_key, "pegasus-cloudio test client")
        self.client_key.chmod(0o600)
        self.client_public_key = self.client_key.with_suffix(".pub").read_text().strip()
        (self._tmp / "authorized_keys").write_text(self.client_public_key + "\n")
        self._host_public = host_key.with_suffix(".pub").read_text().split()[:2]
        printed = subprocess.run([SSH_KEYGEN, "-l", "-E", "sha256", "-f", str(host_key)],
                                 capture_output=True, text=True, check=True).stdout
        self.host_key_fingerprints = [line.split()[1] for line in printed.splitlines() if line.strip()]

    def _launch(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        for _ in range(_PORT_ATTEMPTS):
            self._spawn()
            if self._wait_ready(deadline):
                self.known_hosts = f"[{self.host}]:{self.port} {' '.join(self._host_public)}\n"
                return
            if "Address already in use" not in self.log_tail():
                break
            self._discard_process()
        tail = self.log_tail()
        raise RuntimeError(f"sshd did not answer on {self.host}:{self.port} within "
                           f"{self.start_timeout:.0f} s; log tail:\n{tail}")

    def _spawn(self) -> None:
        assert self._tmp is not None
        self.port = free_port()
        config = self._tmp / "sshd_config"
        config.write_text(_CONFIG.format(
            port=self.port, host_key=self._tmp / "ssh_host_ed25519_key",
            authorized_keys=self._tmp / "authorized_keys", user=self.user))
        self._spawn_logged([SSHD, "-D", "-e", "-f", str(config)], _clean_env())

    def _wait_ready(self, deadline: float) -> bool:
        return self._wait_until(deadline, lambda: _reads_banner(self.host, self.port), _POLL_S)

    def _kill_children(self, pid: int) -> int:
        victims = _descendants(pid)
        for child in victims:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(victims)


def _wait_for_install() -> None:
    """sshd may be being installed by scripts/system-deps.sh right now: wait, then fail loudly."""
    deadline = time.monotonic() + _INSTALL_WAIT_S
    while not (os.access(SSHD, os.X_OK) and os.access(SSH_KEYGEN, os.X_OK)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{SSHD} or {SSH_KEYGEN} not found: run scripts/system-deps.sh "
                               "(Debian packages openssh-server, openssh-client)")
        time.sleep(1.0)


def _keygen(path: Path, comment: str) -> None:
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL, capture_output=True)


def _clean_env() -> Dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C"}


def _reads_banner(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2.0) as sock:
            return sock.recv(64).startswith(b"SSH-2.0-")
    except OSError:
        return False


def _descendants(pid: int) -> List[int]:
    """Every live descendant of ``pid`` (from /proc), children before grandchildren."""
    parents: Dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
    found: List[int] = []
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        children = [child for child, parent in parents.items() if parent == current]
        found.extend(children)
        frontier.extend(children)
    return found

