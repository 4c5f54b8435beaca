"""One rate per pool (optional): the pacing states (:mod:`transfer.pacing`) of a prefix on the
Redis the peer index uses, shared by every node of the pool, with the node's as fallback.

Off unless ``PEGASUS_CLOUDIO_POOL_RATE_FRACTION`` is above 0 and ``PEGASUS_CLOUDIO_P2P_REDIS``
names the index. A prefix's pool bucket is then capped at that fraction of the store's
documented request rate per prefix (:data:`DOCUMENTED_RATE`: reads, the usual load of a
stage-in) and adapts below it as every bucket does.

Trust, as far as the peer index's (``docs/p2p.md``): a state is stored under a name only the
holders of the reader's scope (:class:`transfer.peers.Scope`: its store identity and bucket)
can compute, and tagged with that scope; a value no holder wrote (another user's, or garbage)
is taken for no state, so another user can at worst erase a user's pool state (its jobs then
pace by their node's rate), never slow them down. Each state expires after CALM_SECONDS.

Redis unreachable or failing (now or mid-run): one warning, and from then on this process
paces by its fallback (the node's file). Updates are optimistic (``WATCH``/``MULTI``); one
that loses ``_TRIES`` races to other writers is decided on the pool's state as last read (their
writes carry the pace) and not recorded, not waited on: a hot prefix stays one pool state, never
a node file per loser.
"""

from __future__ import annotations

import math

from transfer.lean import logger
from transfer.pacing import CALM_SECONDS, RateState
from transfer.schemes import SCHEMES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional, Tuple

    from transfer.pacing import States
    from transfer.peers import Scope

    Change = Callable[[Optional[RateState]], Tuple[Optional[RateState], float]]

__all__ = ["DOCUMENTED_RATE", "PoolStates"]

# requests/s per prefix the stores document for reads, per scheme (its row's ``read_rate``)
DOCUMENTED_RATE = {name: row.read_rate for name, row in SCHEMES.items() if row.read_rate is not None}
_TRIES = 3
_log = logger(__name__)


class PoolStates:
    """:class:`~transfer.pacing.States` of the prefixes ``scope_of(key)`` scopes, on the
    ``client`` (a ``redis.Redis``) under ``namespace``; others, and all after a Redis error,
    in ``fallback``. ``ceiling_of(key)``: the most requests/s a prefix's state may record."""

    def __init__(self, client: Any, namespace: str, scope_of: Callable[[str], Optional[Scope]],
                 fallback: States, clock: Callable[[], float]) -> None:
        self._redis = client
        self._namespace = namespace
        self._scope_of = scope_of
        self._fallback = fallback
        self._clock = clock
        self._down = False
        self._scopes: Dict[str, Optional[Scope]] = {}

    def update(self, key: str, change: Change) -> float:
        scope = None if self._down else self._scope(key)
        if scope is None:
            return self._fallback.update(key, change)
        try:
            return self._update(key, scope, change)
        except Exception as err:  # noqa: BLE001 - redis.RedisError, OSError: Redis is down or refuses
            self._failed(err)
            return self._fallback.update(key, change)

    def peek(self, key: str) -> Optional[RateState]:
        """The key's state (one ``GET``: Redis answers a read between whole writes)."""
        scope = None if self._down else self._scope(key)
        if scope is None:
            return self._fallback.peek(key)
        try:
            name = f"{self._namespace}:rate:{scope.rate_name(key)}"
            return _decode(self._redis.get(name), name, scope, self._clock())
        except Exception as err:  # noqa: BLE001 - as in update: Redis is down or refuses
            self._failed(err)
            return self._fallback.peek(key)

    def _failed(self, err: Exception) -> None:
        """Redis failed: one warning, and the fallback from now on."""
        if not self._down:
            _log.warning("pacing: the pool's rate limiter on Redis failed (%s); pacing by this node's rate",
                         type(err).__name__)
        self._down = True

    def _scope(self, key: str) -> Optional[Scope]:
        if key not in self._scopes:
            try:
                self._scopes[key] = self._scope_of(key)
            except Exception:  # noqa: BLE001 - no scope (anonymous, a backend error): the node's rate
                self._scopes[key] = None
        return self._scopes[key]

    def _update(self, key: str, scope: Scope, change: Change) -> float:
        import redis
        name = f"{self._namespace}:rate:{scope.rate_name(key)}"
        state: Optional[RateState] = None
        for _ in range(_TRIES):
            with self._redis.pipeline() as pipe:
                try:
                    pipe.watch(name)
                    state = _decode(pipe.get(name), name, scope, self._clock())
                    new, result = change(state)
                    if new is state:  # read only: no write, no race to lose
                        return result
                    pipe.multi()
                    if new is None:
                        pipe.delete(name)
                    else:
                        value = _encode(new)
                        pipe.set(name, f"{value} {scope.rate_tag(name, value)}", px=int(CALM_SECONDS * 1000))
                    pipe.execute()
                    return result
                except redis.WatchError:
                    continue
        return change(state)[1]


def _encode(state: RateState) -> str:
    return f"{state.last_max!r} {state.cut_at!r} {state.tokens!r} {state.stamp!r} {state.epoch!r} {state.taken!r}"


def _decode(raw: Any, name: str, scope: Scope, now: float) -> Optional[RateState]:
    """The state a holder of ``scope`` stored under ``name``; None for anything else."""
    if not isinstance(raw, bytes) or len(raw) > 256:
        return None
    fields = raw.decode("ascii", "replace").split(" ")
    if len(fields) not in (6, 7):  # (6: an older release's, without ``taken``)
        return None
    import hmac
    value = " ".join(fields[:-1])
    if not hmac.compare_digest(fields[-1], scope.rate_tag(name, value)):
        return None
    try:
        numbers = [float(f) for f in fields[:-1]]
    except ValueError:
        return None
    last_max, cut_at, tokens, stamp, epoch = numbers[:5]
    taken = numbers[5] if len(numbers) == 6 else 0.0
    if not all(math.isfinite(n) for n in numbers) or last_max <= 0 \
            or cut_at > now + 1 or epoch > now + 61 or not 0 <= taken <= 2.0 ** 52:
        return None
    return RateState(last_max, cut_at, tokens, stamp, epoch, taken)
