"""The worker nodes of ``pegasus-cloudio bench throttle --nodes K`` (issue 37, one rate per pool).

K network namespaces on a bridge (:class:`pegasus_cloudio_testbed.netns.NetnsPool`; needs
root), one redis-server on the bridge address as the peer index's Redis, and the throttling
front listening there too, where the namespaces reach it. Job j runs on node j mod K, inside
its namespace, with that node's own rate file (its ``XDG_RUNTIME_DIR``) and the pool limiter
on (``PEGASUS_CLOUDIO_POOL_RATE_FRACTION``: ``share`` of the front's rate R, as a fraction of
the store's documented rate, so the pool bucket is capped at ``share`` x R). Every run has
its own Redis namespace and rate files: each starts knowing nothing, as the front does.

The wheel's venv has no dependencies (the core has none); the pool limiter needs the ``redis``
package (the ``p2p`` extra), so the jobs get this interpreter's on their ``PYTHONPATH``, alone.
"""

from __future__ import annotations

import os
import uuid
from typing import Dict, List, Sequence, Tuple

from pegasus_cloudio_testbed.netns import NetnsPool
from pegasus_cloudio_testbed.redis import RedisServer

__all__ = ["Nodes"]


class Nodes:
    """The pool of a ``--nodes`` run; use as a context manager."""

    def __init__(self, root: str, count: int, rate: float, share: float) -> None:
        from transfer.pacing_pool import DOCUMENTED_RATE
        self._root, self._count = root, count
        self.fraction = min(1.0, share * rate / DOCUMENTED_RATE["s3"])
        self._pool = NetnsPool(count)
        self._redis = RedisServer()
        self._run = self._extras = ""

    def __enter__(self) -> "Nodes":
        self._pool.start()
        try:
            self._redis = RedisServer(self._pool.gateway).start()
            self._extras = _redis_only(self._root)
        except BaseException:
            self._pool.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._redis.stop()
        finally:
            self._pool.close()

    @property
    def host(self) -> str:
        """Where the front listens: the bridge address, reached from every namespace."""
        return self._pool.gateway

    def new_run(self) -> None:
        """A Redis namespace and node rate directories of their own for the next wave."""
        self._run = uuid.uuid4().hex[:8]
        for node in self._pool.nodes:
            os.makedirs(self._runtime(node.name), mode=0o700)

    def _runtime(self, name: str) -> str:
        return os.path.join(self._root, "nodes", self._run, name)

    def job(self, j: int, argv: Sequence[str]) -> Tuple[List[str], Dict[str, str]]:
        """Job ``j``'s command, run inside its node, and the environment that joins it to the pool."""
        node = self._pool.nodes[j % self._count]
        return node.argv(argv), {"XDG_RUNTIME_DIR": self._runtime(node.name),
                                 "PEGASUS_CLOUDIO_P2P_REDIS": self._redis.url, "PYTHONPATH": self._extras,
                                 "PEGASUS_CLOUDIO_P2P_NAMESPACE": f"bench{self._run}",
                                 "PEGASUS_CLOUDIO_POOL_RATE_FRACTION": repr(self.fraction)}

    def figures(self) -> Dict[str, int]:
        """What shows the wiring after a wave: the prefixes the pool limiter holds on Redis, and
        the nodes whose own rate file learned a prefix."""
        import redis
        client = redis.Redis.from_url(self._redis.url)
        try:
            pool_keys = sum(1 for _ in client.scan_iter(f"bench{self._run}:rate:*"))
        finally:
            client.close()
        files = sum(1 for node in self._pool.nodes
                    if os.path.exists(os.path.join(self._runtime(node.name), "pegasus-cloudio", "rates")))
        return {"nodes": self._count, "pool_keys": pool_keys, "node_rate_files": files}


def _redis_only(root: str) -> str:
    """A directory holding only this interpreter's ``redis`` package (a link), for PYTHONPATH."""
    import redis
    extras = os.path.join(root, "extras")
    os.makedirs(extras, exist_ok=True)
    os.symlink(os.path.dirname(redis.__file__), os.path.join(extras, "redis"))
    return extras
