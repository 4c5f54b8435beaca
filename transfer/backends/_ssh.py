"""SSH plumbing of the sftp backend: endpoints, keys, host-key policy, one connection.

Imported only by :mod:`transfer.backends.sftp`, so ``import transfer`` never imports
paramiko. One :class:`Connection` is one TCP connection, one SSH handshake and one
authentication; files move on up to ``limit`` SFTP channels of it, opened lazily.

* **Endpoint** (as pegasus-transfer reads ``scp://`` URLs): ``USER@HOST[:PORT]`` with an
  optional trailing ``:`` (``scp://user@host:/path``); port 22 by default.
* **Key**: ``SSH_PRIVATE_KEY_<site>`` (site label with ``-`` as ``_``), then
  ``SSH_PRIVATE_KEY``, read from the session's environment. A key file with any group or
  other permission bit is refused with the ``chmod 600`` fix. Without one, the keys of an
  ssh-agent (``SSH_AUTH_SOCK``) and then ``~/.ssh/id_{ed25519,ecdsa,rsa}`` are tried, and
  default key files that are not private are skipped, as OpenSSH does.
* **Host keys**: any key is accepted (the stock tool runs scp with
  ``UserKnownHostsFile=/dev/null StrictHostKeyChecking=no``) unless a known_hosts file is
  configured (``ssh_known_hosts``); then an unknown, different or ``@revoked`` key is an
  AuthError (``@cert-authority`` lines are skipped: host certificates are not supported).
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
import re
import select
import socket
import threading
from typing import List, Mapping, Optional, Set, Tuple

import paramiko
import paramiko.agent
import paramiko.hostkeys
from paramiko.pkey import UnknownKeyType

from transfer.credentials import check_private, site_env_suffix
from transfer.errors import AuthError, ConfigError, InvalidInput, NotFound, RemoteError, TransferError, TransientError
from transfer.lean import record
from transfer.urls import Url

DEFAULT_KEY_NAMES = ("id_ed25519", "id_ecdsa", "id_rsa")
# paramiko logs refused channels and dropped sockets itself; the backend reports them as
# TransferErrors, so without a handler of the application's those lines stay silent.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
_PORT = re.compile(r":(\d+)")
_KEEPALIVE_S = 30


@record(frozen=True)
class SshEndpoint:
    """Who to log in as where, and with which key file (None: agent and default keys)."""

    user: str
    host: str
    port: int
    key_file: Optional[str]

    @property
    def known_hosts_name(self) -> str:
        """The name OpenSSH writes in known_hosts for this host and port."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def __str__(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def endpoint_for(url: Url, env: Mapping[str, str]) -> SshEndpoint:
    """Parse the authority of an scp:// or sftp:// URL and pick its key file."""
    userinfo, _, hostport = url.host.rpartition("@")
    host = hostport.split(":", 1)[0]
    if not host:
        raise InvalidInput("SSH URL has no host", url=str(url), operation="parse")
    found = _PORT.search(hostport)
    port = int(found.group(1)) if found else 22
    user = userinfo.split(":", 1)[0] or env.get("USER") or env.get("LOGNAME") or _login_name()
    return SshEndpoint(user, host.lower(), port, key_file_for(url.site_label, env))


def key_file_for(site_label: Optional[str], env: Mapping[str, str]) -> Optional[str]:
    """``SSH_PRIVATE_KEY_<site>`` (``-`` as ``_``, then as written), then ``SSH_PRIVATE_KEY``."""
    names = []
    if site_label:
        names += [f"SSH_PRIVATE_KEY_{site_env_suffix(site_label)}", f"SSH_PRIVATE_KEY_{site_label}"]
    names.append("SSH_PRIVATE_KEY")
    for name in names:
        if env.get(name):
            return os.path.abspath(os.path.expanduser(env[name]))
    return None


def _login_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


# --------------------------------------------------------------------------- keys


def load_key(path: str) -> paramiko.PKey:
    """The private key in ``path``; ConfigError (never showing key material) otherwise."""
    check_private(path)
    try:
        return paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        raise ConfigError("SSH private key is encrypted; use an unencrypted key or ssh-agent", url=path,
                          operation="credentials") from None
    except (paramiko.SSHException, UnknownKeyType, ValueError, TypeError) as err:
        raise ConfigError(f"cannot load SSH private key ({type(err).__name__}: unsupported or malformed)",
                          url=path, operation="credentials") from None
    except OSError as err:
        raise ConfigError(f"cannot read SSH private key: {err.strerror}", url=path,
                          operation="credentials") from None


class _EnvAgent(paramiko.agent.AgentSSH):
    """An ssh-agent reached through the ``SSH_AUTH_SOCK`` of the session's environment."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(path)
        self._connect(sock)  # type: ignore[attr-defined]  # paramiko's own Agent does this with os.environ

    def close(self) -> None:
        self._close()  # type: ignore[attr-defined]


def client_keys(endpoint: SshEndpoint, env: Mapping[str, str],
                timeout: float) -> Tuple[List[paramiko.PKey], Optional[_EnvAgent], List[str]]:
    """Keys to offer, the agent they may need for signing, and notes for an auth failure."""
    if endpoint.key_file is not None:
        return [load_key(endpoint.key_file)], None, [endpoint.key_file]
    keys: List[paramiko.PKey] = []
    notes: List[str] = []
    agent: Optional[_EnvAgent] = None
    if env.get("SSH_AUTH_SOCK"):
        try:
            agent = _EnvAgent(env["SSH_AUTH_SOCK"], timeout)
            keys.extend(agent.get_keys())
            notes.append(f"{len(keys)} ssh-agent key(s)")
        except (OSError, paramiko.SSHException):
            notes.append("ssh-agent unreachable")
    home = env.get("HOME") or os.path.expanduser("~")
    for name in DEFAULT_KEY_NAMES:
        path = os.path.join(home, ".ssh", name)
        if os.path.exists(path):
            try:
                keys.append(load_key(path))
                notes.append(path)
            except ConfigError as err:
                notes.append(f"skipped {path}: {err.message}")
    return keys, agent, notes


# --------------------------------------------------------------------------- host keys


@record(frozen=True)
class KnownKeys:
    """What a known_hosts file says about one endpoint: the keys listed for it (maybe none)
    and the keys the file revokes (``@revoked``, for every host)."""

    listed: Tuple[paramiko.PKey, ...]
    revoked: Tuple[paramiko.PKey, ...]

    @property
    def types(self) -> Set[str]:
        return {key.get_name() for key in self.listed}


def known_host_keys(path: Optional[str], endpoint: SshEndpoint) -> Optional[KnownKeys]:
    """None when any host key is accepted; else what the known_hosts file at ``path`` lists.

    Read line by line as OpenSSH reads it (paramiko's ``HostKeys`` raises on a marker line and
    keeps one key per type): ``@revoked`` keys are collected, ``@cert-authority`` lines are
    skipped (host certificates are not supported), a malformed line is skipped, and every
    key listed for the host counts."""
    if not path:
        return None
    if not os.path.isfile(path):
        raise ConfigError("known_hosts file not found (PEGASUS_CLOUDIO_SSH_KNOWN_HOSTS)", url=path,
                          operation="connect")
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError as err:
        raise ConfigError(f"cannot read known_hosts file ({err.strerror})", url=path, operation="connect") from None
    name = endpoint.known_hosts_name
    listed: List[paramiko.PKey] = []
    revoked: List[paramiko.PKey] = []
    for line in lines:
        line = line.strip()
        marker = line.split(None, 1)[0] if line.startswith("@") else ""
        entry = _known_hosts_entry(line[len(marker):].strip() if marker else line)
        if entry is None or marker not in ("", "@revoked"):
            continue
        if marker:
            revoked.append(entry.key)
        elif any(_host_matches(name, pattern) for pattern in entry.hostnames):
            listed.append(entry.key)
    return KnownKeys(tuple(listed), tuple(revoked))


def _known_hosts_entry(line: str) -> Optional[paramiko.hostkeys.HostKeyEntry]:
    """One known_hosts line as paramiko parses it; None for a comment or a line it cannot read."""
    if not line or line.startswith("#"):
        return None
    try:
        return paramiko.hostkeys.HostKeyEntry.from_line(line)
    except (paramiko.SSHException, paramiko.hostkeys.InvalidHostKey, ValueError):
        return None


def _host_matches(name: str, pattern: str) -> bool:
    """``name`` as written, or hashed (``|1|salt|hash``, what ``HashKnownHosts`` writes)."""
    if pattern.startswith("|1|"):
        return hmac.compare_digest(paramiko.HostKeys.hash_host(name, pattern), pattern)
    return pattern == name


def check_host_key(key: paramiko.PKey, known: Optional[KnownKeys], path: Optional[str],
                   endpoint: SshEndpoint) -> None:
    """AuthError unless ``key`` is acceptable under the policy (see module docstring)."""
    if known is None:
        return
    name = endpoint.known_hosts_name
    shown = f"host key of {name} ({key.get_name()} {key.fingerprint})"
    if any(revoked.asbytes() == key.asbytes() for revoked in known.revoked):
        raise AuthError(f"{shown} is marked @revoked in the known_hosts file {path}; refusing to connect",
                        url=str(endpoint), operation="connect")
    if not known.listed:
        raise AuthError(f"{shown} is not in the known_hosts file {path}; refusing to connect (strict host key "
                        "checking)", url=str(endpoint), operation="connect")
    if not any(listed.asbytes() == key.asbytes() for listed in known.listed):
        raise AuthError(f"{shown} does not match the known_hosts file {path}; refusing to connect (possible "
                        "man-in-the-middle)", url=str(endpoint), operation="connect")


def _prefer_known_types(transport: paramiko.Transport, known: Optional[KnownKeys]) -> None:
    """Ask for a host key of a type known_hosts lists (as OpenSSH does)."""
    if known is None or not known.listed:
        return
    options = transport.get_security_options()
    wanted = known.types
    if "ssh-rsa" in wanted:
        wanted |= {"rsa-sha2-256", "rsa-sha2-512"}
    preferred = [t for t in options.key_types if t in wanted]
    if preferred:
        options.key_types = preferred


def _prefer_aead(transport: paramiko.Transport) -> None:
    """Offer AES-GCM first (used when the server supports it): one AEAD call per packet instead
    of a cipher and an HMAC, about 10% less client CPU per small file."""
    options = transport.get_security_options()
    ciphers = list(options.ciphers)
    aead = [c for c in ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com") if c in ciphers]
    options.ciphers = aead + [c for c in ciphers if c not in aead]


# --------------------------------------------------------------------------- connection


class Connection:
    """One authenticated SSH transport and a pool of up to ``limit`` SFTP channels on it.

    ``take``/``give`` are thread-safe; a caller that finds every channel busy waits. If
    the server refuses another channel (its ``MaxSessions``), the pool shrinks to what it has.
    """

    def __init__(self, transport: paramiko.Transport, limit: int, read_timeout: float) -> None:
        self.transport = transport
        self._limit = max(1, limit)
        self._timeout = read_timeout
        self._idle: List[paramiko.SFTPClient] = []
        self._opened = 0
        self._closed = False
        self._cond = threading.Condition()

    @property
    def alive(self) -> bool:
        """Usable: not closed, transport running, and the socket shows no EOF or reset yet.

        The socket check (urllib3 does the same before reusing a connection) sees a drop
        that paramiko's reader thread has not processed yet, so the next call reconnects
        instead of failing on a dead connection.
        """
        return not self._closed and self.transport.is_active() and not _dropped(self.transport.sock)

    def take(self) -> paramiko.SFTPClient:
        """An idle channel, a new one, or the next one given back."""
        with self._cond:
            while not self._idle and self._opened >= self._limit and not self._closed:
                self._cond.wait()
            if self._closed:
                raise TransientError("SSH connection closed", operation="connect")
            if self._idle:
                return self._idle.pop()
            self._opened += 1
        try:
            return self._open_channel()
        except (paramiko.SSHException, OSError, EOFError):
            with self._cond:
                self._opened -= 1
                others = self._opened
                if others:  # the server's MaxSessions: work with the channels it gave us
                    self._limit = others
                self._cond.notify()
            if not others or not self.alive:
                raise
            return self.take()
        except BaseException:
            self._release_slot()
            raise

    def give(self, client: paramiko.SFTPClient, healthy: bool) -> None:
        """Return a channel; an unhealthy one (timed out, broken) is closed instead."""
        if healthy and self.alive:
            with self._cond:
                if not self._closed:
                    self._idle.append(client)
                    self._cond.notify()
                    return
        _quietly_close(client)
        self._release_slot()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for client in idle:
            _quietly_close(client)
        self.transport.close()

    def _open_channel(self) -> paramiko.SFTPClient:
        client = paramiko.SFTPClient.from_transport(self.transport)
        if client is None:
            raise TransientError("SSH server did not open an SFTP channel", operation="connect")
        channel = client.get_channel()
        if channel is not None:
            channel.settimeout(self._timeout)
        return client

    def _release_slot(self) -> None:
        with self._cond:
            self._opened -= 1
            self._cond.notify()


def connect(endpoint: SshEndpoint, env: Mapping[str, str], *, connect_timeout: float, read_timeout: float,
            known_hosts: Optional[str], channels: int) -> Connection:
    """Open, verify and authenticate one SSH connection (one handshake)."""
    known = known_host_keys(known_hosts, endpoint)
    keys, agent, notes = client_keys(endpoint, env, connect_timeout)
    try:
        if not keys:
            raise ConfigError("no SSH key: set SSH_PRIVATE_KEY (or SSH_PRIVATE_KEY_<site>), run an ssh-agent "
                              f"or create ~/.ssh/id_ed25519 ({'; '.join(notes) or 'none found'})",
                              url=str(endpoint), operation="connect")
        transport, host_key = _handshake(endpoint, connect_timeout, known)
        try:
            check_host_key(host_key, known, known_hosts, endpoint)
            _authenticate(transport, endpoint, keys, notes)
        except BaseException:
            transport.close()
            raise
    finally:
        if agent is not None:
            agent.close()
    transport.set_keepalive(_KEEPALIVE_S)
    return Connection(transport, channels, read_timeout)


def _handshake(endpoint: SshEndpoint, timeout: float,
               known: Optional[KnownKeys]) -> Tuple[paramiko.Transport, paramiko.PKey]:
    """TCP connect, key exchange; returns the transport and the server's host key."""
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except OSError as err:
        raise TransientError(f"cannot connect: {err.strerror or type(err).__name__}", url=str(endpoint),
                             operation="connect") from err
    # Small SFTP requests wait on each other's answers: Nagle + delayed ACK would add 40 ms stalls.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport = paramiko.Transport(sock)
    transport.banner_timeout = transport.handshake_timeout = transport.auth_timeout = timeout
    _prefer_known_types(transport, known)
    _prefer_aead(transport)
    try:
        transport.start_client(timeout=timeout)
        # start_client returns silently on timeout; then there is no host key yet and this raises
        host_key = transport.get_remote_server_key()
    except (paramiko.SSHException, OSError, EOFError) as err:
        transport.close()
        raise TransientError(f"SSH handshake failed or timed out ({type(err).__name__})", url=str(endpoint),
                             operation="connect") from err
    return transport, host_key


def _authenticate(transport: paramiko.Transport, endpoint: SshEndpoint, keys: List[paramiko.PKey],
                  notes: List[str]) -> None:
    for key in keys:
        try:
            transport.auth_publickey(endpoint.user, key)
        except paramiko.AuthenticationException:
            continue
        except (paramiko.SSHException, OSError, EOFError) as err:
            raise TransientError(f"SSH authentication interrupted ({type(err).__name__})", url=str(endpoint),
                                 operation="connect") from err
        if transport.is_authenticated():
            return
    raise AuthError(f"SSH public-key authentication failed for user {endpoint.user} "
                    f"(offered: {'; '.join(notes)})", url=str(endpoint), operation="connect")


# --------------------------------------------------------------------------- errors


def translate(err: BaseException, url: str, operation: str, connection_alive: bool) -> TransferError:
    """A paramiko/socket error of one SFTP call as a :mod:`transfer.errors` exception.

    Classified by type and errno only: a broken or timed-out connection is transient (the
    backend reconnects on its next call); SFTP status replies map ENOENT -> NotFound,
    EACCES -> AuthError, anything else (SFTP v3 reports ENOSPC, EEXIST... as a generic
    "Failure") -> RemoteError carrying the server's text.
    """
    if isinstance(err, TransferError):
        return err
    name = type(err).__name__
    if isinstance(err, socket.timeout):
        return TransientError("SSH server did not answer in time", url=url, operation=operation)
    if isinstance(err, paramiko.AuthenticationException):
        return AuthError(f"SSH authentication failed ({name})", url=url, operation=operation)
    if not connection_alive or isinstance(err, (EOFError, paramiko.SSHException, paramiko.SFTPError)):
        return TransientError(f"SSH connection lost ({name})", url=url, operation=operation)
    if isinstance(err, OSError) and err.errno == errno.ENOENT:
        return NotFound("no such file or directory", url=url, operation=operation)
    if isinstance(err, OSError) and err.errno == errno.EACCES:
        return AuthError("permission denied by the SSH server", url=url, operation=operation)
    text = str(err.args[-1] if err.args else name)
    return RemoteError(f"SFTP server refused: {text}", url=url, operation=operation)


def _dropped(sock: object) -> bool:
    """True if the peer closed or reset ``sock`` (pending EOF/RST); never blocks, never reads."""
    if not isinstance(sock, socket.socket):
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError, socket.timeout):  # the reader thread took the bytes first
        return False
    except (OSError, ValueError):
        return True


def channel_alive(client: paramiko.SFTPClient) -> bool:
    channel = client.get_channel()
    return channel is not None and not channel.closed and channel.get_transport().is_active()


def _quietly_close(client: paramiko.SFTPClient) -> None:
    try:
        client.close()
    except (OSError, EOFError, paramiko.SSHException):
        pass
