"""``pegasus-cloudio serve``: the cache daemon of one worker node.

Serves the configured users' node caches to the pool (``pegasus_cloudio.p2p.server``) and
keeps one entry per user alive in the replica index (heartbeat every third of the TTL; a
clean stop removes them at once, a crash lets them expire). Settings: ``PEGASUS_CLOUDIO_P2P_*``
(:mod:`pegasus_cloudio.p2p.settings`); runs until SIGTERM/SIGINT. See ``docs/p2p.md`` for a
systemd unit and the HTCondor configuration.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any, List, Mapping, Optional

from transfer.errors import TransferError
from transfer.knobs import layered
from transfer.p2p.config import node_id
from transfer.p2p.index import NodeInfo, PeerIndex

from .server import CacheServer
from .settings import DaemonSettings, daemon_settings

__all__ = ["Daemon", "add_arguments", "main"]

_log = logging.getLogger("pegasus_cloudio.p2p")


class Daemon:
    """The server plus its heartbeat. ``index`` None: serve without announcing."""

    def __init__(self, settings: DaemonSettings, index: Optional[PeerIndex] = None) -> None:
        self.settings = settings
        self._index = index
        self._server = CacheServer(settings.serve)
        self._stop = threading.Event()
        self._beat: Optional[threading.Thread] = None
        self._warned = False

    @property
    def url(self) -> str:
        """The base URL peers use: the configured one, else the bound address (once started)."""
        if self.settings.url:
            return self.settings.url
        host, port = self._server.address
        scheme = "http" if self.settings.serve.plain_http else "https"
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"

    @property
    def nodes(self) -> List[NodeInfo]:
        """One index node per served user: ``<node>/<user>`` at ``<url>/v1/<user>``."""
        s = self.settings
        return [NodeInfo(node_id(s.node, user), f"{self.url.rstrip('/')}/v1/{user}", s.node, s.rack)
                for user in sorted(s.serve.caches)]

    def request_stop(self) -> None:
        """Make :meth:`wait` return (signal handlers)."""
        self._stop.set()

    def start(self) -> "Daemon":
        self._server.start()
        if self._index is not None:
            self._heartbeat()
            self._beat = threading.Thread(target=self._beat_loop, name="p2p-heartbeat", daemon=True)
            self._beat.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if self._index is not None:
            try:
                self._index.retire([n.node for n in self.nodes])
            except Exception as err:  # noqa: BLE001 - the entries expire anyway
                _log.warning("could not retire from the peer index: %s", err)
        self._server.stop()

    def wait(self) -> None:
        self._stop.wait()

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
        daemon = Daemon(settings, index_for(settings)).start()
    except (TransferError, OSError, ImportError) as err:
        print(f"pegasus-cloudio serve: {err}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: daemon.request_stop())
    _log.info("serving %s on %s (node %s)", ", ".join(sorted(settings.serve.caches)),
              daemon.url, settings.node)
    daemon.wait()
    daemon.stop()
    return 0
