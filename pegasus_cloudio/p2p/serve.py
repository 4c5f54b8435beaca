"""``pegasus-cloudio serve``: the cache daemon of one worker node.

Serves the configured users' node caches to the pool (``pegasus_cloudio.p2p.server``), one
server per user on its own port (``P2P_BIND``'s port for the first user in name order,
the next port for the next, ...), and keeps one entry per user alive in the replica index
(heartbeat every third of the TTL; a clean stop removes them at once, a crash lets them
expire). Settings: ``PEGASUS_CLOUDIO_P2P_*`` (:mod:`pegasus_cloudio.p2p.settings`); runs
until SIGTERM/SIGINT. See ``docs/p2p.md`` for a systemd unit and the HTCondor configuration.

No process reads every user's files: started as root, the daemon binds each user's port
and loads the node's key, then forks one process per user that drops to that user (uid,
gid, no supplementary groups) before serving: a user's cache is read only with that user's
rights, so a link planted in it reaches nothing she could not read herself. The root
process keeps only the heartbeat, and starts a user's serving process again when it exits
(she may kill it; the other users serve on). It forks only while it is its one thread (the
heartbeat goes out from its loop, not from a thread of its own), and a child looks nothing
up (users' ids and the C library are resolved at start): a child forked while another thread
held a lock (an NSS module's, the C library's, the heartbeat's) would wait on it for ever, as
root. Started as a user, it serves that user's cache alone (heartbeat in a thread: it never forks).
"""

from __future__ import annotations

import argparse
import logging
import os
import pwd
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple
from urllib.parse import urlsplit

from transfer.errors import TransferError
from transfer.knobs import layered
from transfer.lean import replace
from transfer.p2p.config import ENV, node_id
from transfer.p2p.index import NodeInfo, PeerIndex

from .server import CacheServer, ServeConfig
from .settings import DaemonSettings, daemon_settings

__all__ = ["Daemon", "add_arguments", "drop_privileges", "main"]

_log = logging.getLogger("pegasus_cloudio.p2p")


class Daemon:
    """The per-user servers plus the heartbeat. ``index`` None: serve without announcing.

    :meth:`start` serves every user in this process (threads; what a user's own daemon and
    the tests do); :meth:`start_forked` serves each user in a child process running as that
    user (what ``main`` does as root)."""

    def __init__(self, settings: DaemonSettings, index: Optional[PeerIndex] = None) -> None:
        self.settings = settings
        self._index = index
        self._users = sorted(settings.serve.caches)
        base = settings.serve.bind
        self._servers = [CacheServer(replace(
            settings.serve, caches={user: settings.serve.caches[user]},
            bind=(base[0], base[1] + i if base[1] else 0))) for i, user in enumerate(self._users)]
        self._children: Dict[int, str] = {}
        self._ids: Dict[str, Tuple[int, int]] = {}  # user -> (uid, gid), resolved before any fork
        self._libc: Any = None
        self._forked = False  # serving processes are children: the heartbeat is wait()'s
        self._stop = threading.Event()
        self._beat: Optional[threading.Thread] = None
        self._warned = False
        self._down: Set[str] = set()  # users whose serving process could not be started again
        self.failed = False  # a serving process exited and could not be started again

    def url(self, user: str) -> str:
        """The URL peers use for ``user``'s cache (once bound): ``P2P_URL``'s scheme and host
        (default: the bound address) with that user's port (``P2P_URL``'s port, when it has
        one, counts as the first user's: a port forward for each)."""
        i = self._users.index(user)
        host, port = self._servers[i].address
        scheme = "http" if self.settings.serve.plain_http else "https"
        if self.settings.url:
            parts = urlsplit(self.settings.url)
            scheme, host = parts.scheme or scheme, parts.hostname or host
            port = parts.port + i if parts.port else port
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}/v1/{user}"

    @property
    def nodes(self) -> List[NodeInfo]:
        """One index node per served user: ``<node>/<user>`` at its own port."""
        s = self.settings
        return [NodeInfo(node_id(s.node, user), self.url(user), s.node, s.rack) for user in self._users
                if user not in self._down]

    def request_stop(self) -> None:
        """Make :meth:`wait` return (signal handlers)."""
        self._stop.set()

    def start(self) -> "Daemon":
        self._bind()
        for server in self._servers:
            server.run()
        self._start_heartbeat()
        return self

    def _bind(self) -> None:
        """Bind every user's port and tell each server where peers dial it (its URL)."""
        for user, server in zip(self._users, self._servers):
            server.bind()
            parts = urlsplit(self.url(user))
            server.announce(parts.hostname or "", parts.port or 0)

    def start_forked(self) -> "Daemon":
        """Bind every user's port here, then serve each in a child dropped to that user. The
        heartbeat is then :meth:`wait`'s: this process stays single-threaded, so that it can
        fork again (KeyError/OSError: a user or the C library cannot be found)."""
        self._libc = _libc()
        self._ids = {user: _ids_of(user) for user in self._users}
        self._forked = True
        self._bind()
        for user, server in zip(self._users, self._servers):
            self._fork(user, server)
        if self._index is not None:
            self._heartbeat()
        return self

    def _fork(self, user: str, server: CacheServer) -> None:
        """Serve ``user`` from a child dropped to her (``server`` bound); the listener is the
        child's alone (its address stays known here)."""
        pid = os.fork()
        if pid == 0:
            os._exit(self._child(user, server))
        self._children[pid] = user
        server.close_listener()

    def restart(self, user: str) -> None:
        """Serve ``user`` again from a new child on her port: her serving process runs as her,
        so she may kill it, and that must not stop the other users' sharing. Raises OSError
        when the port cannot be bound again (her node then leaves the index)."""
        i = self._users.index(user)
        old = self._servers[i]
        server = CacheServer(replace(old.config, bind=old.address))
        server.bind()
        parts = urlsplit(self.url(user))
        server.announce(parts.hostname or "", parts.port or 0)
        self._servers[i] = server
        self._fork(user, server)

    def _child(self, user: str, server: CacheServer) -> int:
        code = 1
        try:
            for other in self._servers:
                if other is not server:
                    other.close_listener()
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            parent = os.getppid()
            _become(user, *self._ids[user], self._libc)
            _die_with(parent, self._libc)  # after the drop: changing credentials clears the setting
            server.run()
            stop.wait()
            server.stop()
            code = 0
        except BaseException as err:  # noqa: BLE001 - reported; the parent stops the daemon
            _log.error("serving %s failed: %s", user, err)
        return code

    def _start_heartbeat(self) -> None:
        if self._index is not None:
            self._heartbeat()
            self._beat = threading.Thread(target=self._beat_loop, name="p2p-heartbeat", daemon=True)
            self._beat.start()

    def child_exited(self) -> Optional[str]:
        """The user whose serving process has exited (reaped here), if any."""
        for pid, user in list(self._children.items()):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                del self._children[pid]
                return user
        return None

    def stop(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if self._index is not None:
            try:
                self._index.retire([n.node for n in self.nodes])
            except Exception as err:  # noqa: BLE001 - the entries expire anyway
                _log.warning("could not retire from the peer index: %s", err)
        for pid in self._children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for pid in list(self._children):
            os.waitpid(pid, 0)
        self._children.clear()
        for server in self._servers:
            server.stop()

    def wait(self) -> None:
        """Until asked to stop. A serving process that exits (its user may kill it: it runs as
        her) is started again, at most once a second; one that cannot be (its port taken)
        takes that user out of the index, and the others serve on. Serving forked, it also
        sends the heartbeats (every third of the TTL)."""
        period = self.settings.heartbeat_ttl / 3
        due = time.monotonic() + period if self._index is not None and self._forked else None
        while not self._stop.wait(self._pause(due)):
            if due is not None and time.monotonic() >= due:
                self._heartbeat()
                due = time.monotonic() + period
            self._restart_exited()

    def _pause(self, due: Optional[float]) -> Optional[float]:
        """How long :meth:`wait` may sleep: a second while children may exit, until ``due``."""
        bounds = [1.0] if self._children else []
        if due is not None:
            bounds.append(max(0.0, due - time.monotonic()))
        return min(bounds) if bounds else None

    def _restart_exited(self) -> None:
        user = self.child_exited()
        if user is None:
            return
        try:
            self.restart(user)
        except OSError as err:
            _log.error("the process serving %s exited and cannot be started again: %s; serving the "
                       "other users", user, err)
            self._retire(user)
        else:
            _log.error("the process serving %s exited; started it again", user)

    def _retire(self, user: str) -> None:
        self.failed = True
        self._down.add(user)
        if self._index is not None:
            try:
                self._index.retire([node_id(self.settings.node, user)])
            except Exception as err:  # noqa: BLE001 - the entry expires anyway
                _log.warning("could not retire %s from the peer index: %s", user, err)

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_ttl / 3):
            self._heartbeat()

    def _heartbeat(self) -> None:
        assert self._index is not None
        try:
            self._index.heartbeat(self.nodes, self.settings.heartbeat_ttl)
            self._warned = False
        except Exception as err:  # noqa: BLE001 - keep serving; peers fall back to the store
            if not self._warned:
                _log.warning("peer index unavailable, heartbeat not sent: %s", err)
                self._warned = True


PR_SET_PDEATHSIG = 1


def _libc() -> Any:
    import ctypes
    import ctypes.util
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _die_with(parent: int, libc: Any) -> None:
    """Be killed when the main process dies, however it dies (a serving process must not
    outlive the daemon that announces it)."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the setting took effect
        os._exit(1)


PR_SET_DUMPABLE = 4


def drop_privileges(user: str) -> None:
    """Become ``user`` (uid, gid, no supplementary groups) for good, and stay non-dumpable
    whatever ``fs.suid_dumpable`` says: the user may not attach to, or dump, a process holding
    the node's TLS key. A no-op when this process already runs as that user. Raises
    OSError/KeyError when it cannot. Looks ``user`` up: not for a child forked from a
    threaded process (:func:`_become` with ids resolved before the fork)."""
    _become(user, *_ids_of(user), _libc())


def _ids_of(user: str) -> Tuple[int, int]:
    """``user``'s uid and gid (KeyError when there is no such user)."""
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


def _become(user: str, uid: int, gid: int, libc: Any) -> None:
    """:func:`drop_privileges` with ``user``'s ids and the C library already at hand (the
    user may not be able to read the interpreter's library once dropped): system calls only."""
    if os.geteuid() == uid and os.getuid() == uid:
        return
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.geteuid() != uid or os.getegid() != gid:
        raise OSError(f"could not drop privileges to {user}")
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(f"could not make the process serving {user} non-dumpable")


def index_for(settings: DaemonSettings) -> Optional[PeerIndex]:
    """The index the settings name (None without ``P2P_REDIS``)."""
    if not settings.redis_url:
        return None
    from transfer.p2p import connect_redis
    client: Any = connect_redis(settings.redis_url, cluster=settings.cluster)
    return PeerIndex(client, settings.namespace)


def load_settings(env: Mapping[str, str]) -> DaemonSettings:
    """The daemon's settings: environment over the config file (:mod:`transfer.knobs`)."""
    return daemon_settings(layered(env, config_file=True))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", action="store_true", help="log every request")


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="pegasus-cloudio serve: %(message)s")
    try:
        settings = load_settings(os.environ)
        daemon = Daemon(settings, index_for(settings))
        if os.geteuid() == 0:
            _all_exist(settings.serve)
            daemon.start_forked()
        else:
            _only_self(settings.serve)
            daemon.start()
    except (TransferError, OSError, ImportError) as err:
        print(f"pegasus-cloudio serve: {err}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: daemon.request_stop())
    _log.info("serving %s (node %s)", ", ".join(n.url for n in daemon.nodes), settings.node)
    daemon.wait()
    daemon.stop()
    return 1 if daemon.failed else 0


def _all_exist(serve: ServeConfig) -> None:
    """Each served user must exist here: her cache is served by a process running as her."""
    missing = sorted(set(serve.caches) - set(serve.owners))
    if missing:
        raise TransferError(f"{ENV}USERS names {', '.join(missing)}: no such user on this node (each cache "
                            "is served by a process running as its user)", operation="config")


def _only_self(serve: ServeConfig) -> None:
    """A daemon not started as root serves its own user's cache only."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    others = sorted(set(serve.caches) - {me})
    if others:
        raise TransferError(f"{ENV}USERS names {', '.join(others)}: serving other users' caches needs "
                            "root (the daemon then serves each user as that user)", operation="config")
