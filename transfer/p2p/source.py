"""PeerIndexSource: the engine's :class:`~transfer.peers.PeerSource` on a PeerIndex and a PeerClient.

* ``lookup`` asks the index for a batch in one round trip and remembers the live holders
  whose entries the reader's scope authenticates (and each key's scope).
  With claims on (``claim_seconds`` > 0), the same round trip claims every key this node's
  cache lacks and no live node holds: the first node to claim a key reads it from the store,
  and ``holds`` is true for keys another node is reading now (in flight).
* ``fetch`` reads from the holders (verified by the client); for a key in flight it first
  waits, up to ``claim_seconds``, for the claiming node's replica. So a pool whose nodes
  start together reads each file from the store about once. A wait that ends without a
  replica ends waiting for this source (anyone who can write the index can plant claims
  that never end): it costs a job ``claim_seconds`` once, not once per file.
* Replicas of the keys this node claimed are registered as soon as the node cache holds them
  (a small publisher thread polls the cache and leaves each key's capability beside its entry,
  ``grant``, so this node's daemon serves it to readers of the same scope, and only to them),
  not only at the end of the batch, because other nodes are waiting for them. ``publish``
  registers the rest in one round trip; their grants were made by the caller (the engine's
  node-cache layer, :func:`transfer.layers.sharing.publish_batch`), so a batch's publish
  never calls into the cache.

No method raises for an index, network or peer failure: each kind of failure is logged once
per source (``transfer.p2p`` logger, or the ``warn`` callback), and the engine goes on to the
next source (bundles, then the store).
"""

from __future__ import annotations

import logging
import threading
import time
from transfer.lean import replace
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set

from transfer.p2p.client import PeerClient
from transfer.p2p.index import Claim, Holder, PeerIndex
from transfer.peers import PeerSink, Replica, Scope

__all__ = ["PeerIndexSource"]

_log = logging.getLogger("transfer.p2p")
_WAIT_POLL_S = 0.01      # a waiting node asks the index again (one small round trip)
_PUBLISH_POLL_S = 0.005  # the publisher checks the node cache (a stat per claimed key)
Describe = Callable[[str], Optional[Replica]]
Grant = Callable[[str, str], bool]  # (key, capability) -> kept beside the cache entry


class PeerIndexSource:
    """A PeerSource for one node id (``node``: this node and user, as the daemon announces it).

    ``describe(key)`` reports this node's cache entry for ``key`` (None when absent); it lets
    claims skip keys the node already holds and publishes claimed keys early. Without it
    claims are off. ``grant(key, capability)`` lets this node's daemon serve a claimed key's
    entry to that capability's holders before the early publish; without it claims are off.
    Call :meth:`close` when done (ends claims that were never published)."""

    def __init__(self, index: PeerIndex, client: PeerClient, node: str, *,
                 claim_seconds: float = 0.0, describe: Optional[Describe] = None,
                 grant: Optional[Grant] = None,
                 warn: Optional[Callable[[str], None]] = None) -> None:
        self._index = index
        self._client = client
        self._node = node
        self._claim_seconds = claim_seconds if describe is not None else 0.0
        self._describe = describe
        self._grant = grant
        self._warn_fn = warn or _log.warning
        self._lock = threading.Lock()
        self._scopes: Dict[str, Scope] = {}
        self._holders: Dict[str, List[Holder]] = {}
        self._in_flight: Dict[str, str] = {}
        self._claimed: Set[str] = set()
        self._warned: Set[str] = set()
        self._publisher: Optional[threading.Thread] = None
        self._closed = threading.Event()
        self._claims_fail = threading.Event()  # a wait timed out: wait no more
        self.counters: Dict[str, int] = {"lookups": 0, "peer_hits": 0, "peer_bytes": 0,
                                         "peer_failures": 0, "claims_won": 0, "claims_waited": 0}

    # -- PeerSource ---------------------------------------------------------------------

    def lookup(self, keys: Mapping[str, Scope]) -> None:
        with self._lock:
            self._scopes.update(keys)
        claim = None
        if self._claim_seconds > 0 and self._describe is not None and self._grant is not None:
            missing = [k for k in keys if self._describe(k) is None]
            claim = Claim(self._node, self._claim_seconds, missing) if missing else None
        try:
            found = self._index.lookup(keys, claim)
        except Exception as err:  # noqa: BLE001 - any index failure means "no peer has it"
            self._warn("index", f"peer index unavailable, reading from the store: {_brief(err)}")
            return
        if found.problems:  # one line per source: anyone can write junk into every entry
            more = len(found.problems) - 1
            self._warn("problems", f"peer index: ignored {found.problems[0]}"
                       + (f" (and {more} more such values)" if more else ""))
        with self._lock:
            self.counters["lookups"] += len(keys)
            self.counters["claims_won"] += len(found.won)
            self._holders.update(found.holders)
            self._in_flight.update(found.in_flight)
            self._claimed.update(found.won)
        if found.won:
            self._start_publisher()

    def holds(self, key: str) -> bool:
        with self._lock:
            return key in self._holders or key in self._in_flight

    def fetch(self, key: str, sink: PeerSink) -> Optional[int]:
        with self._lock:
            holders = self._holders.get(key, [])
            waiting = key in self._in_flight
            scope = self._scopes.get(key)
        if scope is None:
            return None
        if not holders and waiting and not self._claims_fail.is_set():
            holders = self._wait_for_replica(key, scope)
        if not holders:
            return None
        report = self._client.fetch(key, holders, sink, scope)
        if report.failures:
            self._count("peer_failures", len(report.failures))
            outcome = "reading from the store" if report.size is None else "another peer sent the rest"
            self._warn("peer", f"peer read failed, {outcome}: {report.failures[0]}")
        for node in report.missing:  # evicted there since it registered
            self._quietly(lambda: self._index.unregister(node, {key: scope}))
        if report.size is not None:
            self._count("peer_hits", 1)
            self._count("peer_bytes", report.size)
        return report.size

    def publish(self, replicas: Sequence[Replica]) -> None:
        """Register ``replicas``, which the caller has granted in the node cache (its daemon
        serves them); a replica without a scope takes the one its key was looked up with."""
        with self._lock:
            scopes = dict(self._scopes)
        scoped = [r if r.scope is not None else replace(r, scope=scopes.get(r.key)) for r in replicas]
        self._register([r for r in scoped if r.scope is not None])

    def _register(self, replicas: List[Replica]) -> None:
        if not replicas:
            return
        try:
            self._index.register(self._node, replicas)
        except Exception as err:  # noqa: BLE001
            self._warn("index", f"peer index unavailable, replicas not shared: {_brief(err)}")
            return
        with self._lock:
            self._claimed.difference_update(r.key for r in replicas)

    def _granted(self, key: str, scope: Scope) -> bool:
        """Let this node's daemon serve ``key`` to ``scope``'s readers (False: it cannot)."""
        if self._grant is None:
            return False
        try:
            return self._grant(key, scope.capability(key))
        except OSError as err:
            self._warn("grant", f"node cache: cannot share {key}: {err}")
            return False

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Stop the publisher, end claims never published (their store read failed or was
        not needed), drop kept-alive peer connections."""
        self._closed.set()
        if self._publisher is not None:
            self._publisher.join()
        with self._lock:
            claimed, self._claimed = self._claimed, set()
            scopes = dict(self._scopes)
        for key in claimed:
            self._quietly(lambda: self._index.release(key, scopes[key], self._node))
        self._client.close()

    # -- claims -------------------------------------------------------------------------

    def _wait_for_replica(self, key: str, scope: Scope) -> List[Holder]:
        """Holders that appeared while another node read ``key`` from the store; [] when the
        claim ended without a replica, the wait timed out or the index failed."""
        self._count("claims_waited", 1)
        deadline = time.monotonic() + self._claim_seconds
        while time.monotonic() < deadline:
            time.sleep(_WAIT_POLL_S)
            try:
                found = self._index.lookup({key: scope}, Claim(self._node, self._claim_seconds, [key]))
            except Exception as err:  # noqa: BLE001
                self._warn("index", f"peer index unavailable, reading from the store: {_brief(err)}")
                return []
            if key in found.holders or key in found.won:
                if key in found.won:  # the other node gave up: this one reads the store
                    with self._lock:
                        self._claimed.add(key)
                    self._start_publisher()
                return found.holders.get(key, [])
        self._claims_fail.set()
        self._warn("claim", f"peer index: no replica of {key} after {self._claim_seconds:g} s of "
                   "another node's claim; not waiting for claims again")
        return []

    def _start_publisher(self) -> None:
        with self._lock:
            if self._publisher is not None and self._publisher.is_alive():
                return
            self._publisher = threading.Thread(target=self._publish_claimed, name="p2p-publish",
                                               daemon=True)
            self._publisher.start()

    def _publish_claimed(self) -> None:
        """Register claimed keys as soon as the node cache holds them (others wait for them)."""
        assert self._describe is not None
        while not self._closed.wait(_PUBLISH_POLL_S):
            with self._lock:
                pending = list(self._claimed)
            if not pending:
                return
            with self._lock:
                scopes = dict(self._scopes)
            ready = [replace(r, scope=scopes[r.key]) for r in map(self._describe, pending)
                     if r is not None and r.key in scopes]
            self._register([r for r in ready if r.scope is not None and self._granted(r.key, r.scope)])

    # -- helpers ------------------------------------------------------------------------

    def _count(self, name: str, amount: int) -> None:
        with self._lock:
            self.counters[name] += amount

    def _warn(self, kind: str, message: str) -> None:
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        self._warn_fn(message)

    def _quietly(self, action: Callable[[], object]) -> None:
        try:
            action()
        except Exception as err:  # noqa: BLE001
            self._warn("index", f"peer index unavailable: {_brief(err)}")


def _brief(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
