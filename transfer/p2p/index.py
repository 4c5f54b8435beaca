"""PeerIndex: the replica index on Redis (one server or a Redis Cluster).

Layout (``ns`` is the pool's namespace, default ``pcio``; ``d`` the scope's name for a cache
key, :meth:`transfer.peers.Scope.index_name`: an HMAC only holders of the reading identity's
store secret can compute)::

    ns:{n}:nodes        hash  node id -> "<expires> " + JSON {"url", "host", "rack"}
    ns:{b}:r:<d>        hash  node id -> Scope.seal: "<size> <sha256> <mac>", size and
                              sha256 enciphered under the scope   (b = d[0]: 16 hash tags)
    ns:{b}:c:<d>        string  node id of the one node fetching <d> from the store now

``mac`` is :meth:`~transfer.peers.Scope.entry_mac` of (node, key, size, sha256) (so the
index tells those without the scope neither a file's checksum nor its size): a value
written by anyone without the scope (another user of the pool, anyone who can reach Redis)
fails the check and is ignored, with a line in :attr:`Lookup.problems`. Two identities never
share an entry: each has its own names.

A node is alive while its ``expires`` is in the future; entries of other nodes are ignored,
so a dead node is never asked. ``expires`` is the Redis server's clock plus the TTL, set by a
script at each heartbeat, and lookups read the same server's clock with the table, so the
pool's own clocks do not matter. A lookup is one pipeline (the node table plus one script
per hash tag) and a registration another; on a cluster the 16 hash tags spread a batch over
every master and the client sends it as one pipelined round per master.

Nothing here verifies bytes: the values are what producers of the same scope registered,
and consumers check what peers send against them (``transfer.p2p.client``). Malformed and
unauthenticated values are reported in :attr:`Lookup.problems` and otherwise ignored.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from transfer.peers import Replica, Scope

__all__ = ["Claim", "Holder", "Lookup", "NodeInfo", "PeerIndex"]

DEFAULT_NAMESPACE = "pcio"
ENTRY_TTL_S = 7 * 86400  # an entry nobody re-registers goes after a week
_SEALED = re.compile(r"[0-9a-f]{16} [0-9a-f]{64} [0-9a-f]{32}")
# KEYS[1]: the node table; ARGV: ttl, then node, JSON pairs. Stamps "<server time + ttl> JSON".
_HEARTBEAT_LUA = """
local t = redis.call('TIME')
local expires = string.format('%.3f', tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[1]))
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], expires .. ' ' .. ARGV[i + 1])
end
return expires
"""
# Anyone who can reach Redis can write junk into it, so the scripts return at most a bounded
# number of fields of bounded length (and how many they left out): a job never reads it whole.
MAX_NODES = 16384
MAX_HOLDERS = 64
_NAME_BYTES, _NODE_BYTES, _ENTRY_BYTES = 256, 1024, 128
# bounded(key, fields, value bytes) -> {field, value, ...} (HGETALL order), fields left out
_BOUNDED_LUA = """
local function bounded(key, most, longest)
  local raw = redis.call('HGETALL', key)
  local out, skipped = {}, 0
  for j = 1, #raw, 2 do
    if #out < 2 * most and #raw[j] <= %d and #raw[j + 1] <= longest then
      out[#out + 1] = raw[j]
      out[#out + 1] = raw[j + 1]
    else
      skipped = skipped + 1
    end
  end
  return out, skipped
end
""" % _NAME_BYTES
# KEYS[1]: the node table. The server's clock with the table, so expiry needs no other clock.
_NODES_LUA = _BOUNDED_LUA + """
local t = redis.call('TIME')
local out, skipped = bounded(KEYS[1], %d, %d)
return {t[1], t[2], out, skipped}
""" % (MAX_NODES, _NODE_BYTES)
# KEYS: the n entry keys of one hash tag, then (with claims) their n claim keys; ARGV: node,
# claim ms, a "0"/"1" mask of length n saying which keys to claim. Per key: {entry fields
# (bounded), claim holder or false, fields left out}. A key is only claimed when it has no
# entry at all; an oversized claim holder is no holder.
_LOOKUP_LUA = _BOUNDED_LUA + """
local n = string.len(ARGV[3])
local out = {}
for i = 1, n do
  local entry, skipped = bounded(KEYS[i], %d, %d)
  local holder = false
  if string.sub(ARGV[3], i, i) == '1' and #entry == 0 and skipped == 0 then
    if redis.call('SET', KEYS[n + i], ARGV[1], 'NX', 'PX', ARGV[2]) then
      holder = ARGV[1]
    else
      holder = redis.call('GET', KEYS[n + i])
      if holder and #holder > %d then
        holder = false
        skipped = skipped + 1
      end
    end
  end
  out[i] = {entry, holder, skipped}
end
return out
""" % (MAX_HOLDERS, _ENTRY_BYTES, _NAME_BYTES)


@dataclass(frozen=True)
class NodeInfo:
    """A node's daemon as the index knows it: id, base URL, host and rack names."""

    node: str
    url: str
    host: str = ""
    rack: str = ""


class Holder(NamedTuple):
    """One live node holding a key, with the size and SHA-256 it registered (authenticated
    with the reader's scope). (A named tuple: a lookup makes one per key, and tuples are
    cheaper to build than frozen dataclasses.)"""

    info: NodeInfo
    size: int
    sha256: str


@dataclass
class Lookup:
    """Result of one batch lookup: holders per key (only keys some live node holds), the
    claims made (``won``: this node reads the store; ``in_flight``: key -> the other node
    reading it now), and one line per malformed or conflicting index value."""

    holders: Dict[str, List[Holder]] = field(default_factory=dict)
    won: List[str] = field(default_factory=list)
    in_flight: Dict[str, str] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class Claim:
    """Claim the store read of ``keys`` for ``node`` for ``seconds`` (in a lookup)."""

    node: str
    seconds: float
    keys: Sequence[str]


class PeerIndex:
    """The index for one pool. ``client`` is a ``redis.Redis`` or ``redis.RedisCluster``
    (anything with ``pipeline``); Redis errors propagate (``redis.RedisError``): callers
    that must not fail (the engine's peer source) catch them."""

    def __init__(self, client: Any, namespace: str = DEFAULT_NAMESPACE) -> None:
        self._redis = client
        self._ns = namespace

    # -- key names ----------------------------------------------------------------------

    @property
    def nodes_key(self) -> str:
        return f"{self._ns}:{{n}}:nodes"

    def entry_key(self, key: str, scope: Scope) -> str:
        d = scope.index_name(key)
        return f"{self._ns}:{{{d[0]}}}:r:{d}"

    def claim_key(self, key: str, scope: Scope) -> str:
        d = scope.index_name(key)
        return f"{self._ns}:{{{d[0]}}}:c:{d}"

    # -- nodes --------------------------------------------------------------------------

    def heartbeat(self, infos: Sequence[NodeInfo], ttl: float) -> None:
        """Mark ``infos`` alive for ``ttl`` seconds more, by the server's clock (one round trip)."""
        args: List[Any] = []
        for i in infos:
            args += [i.node, json.dumps({"url": i.url, "host": i.host, "rack": i.rack})]
        if args:
            self._redis.execute_command("EVAL", _HEARTBEAT_LUA, 1, self.nodes_key, ttl, *args)

    def retire(self, nodes: Sequence[str]) -> None:
        """Drop ``nodes`` from the node table at once (a daemon's clean shutdown)."""
        if nodes:
            self._redis.hdel(self.nodes_key, *nodes)

    def live_nodes(self) -> Dict[str, NodeInfo]:
        """Every node whose heartbeat has not expired."""
        return _live(self._redis.execute_command("EVAL", _NODES_LUA, 1, self.nodes_key), [])

    # -- replicas -----------------------------------------------------------------------

    def lookup(self, keys: Mapping[str, Scope], claim: Optional[Claim] = None) -> Lookup:
        """Live holders of each of ``keys`` (key -> the reader's scope) whose entries that
        scope authenticates, in one round trip; with ``claim``, the keys it
        names that have no index entry at all are claimed in the same round trip (first come
        wins; a claim ends on :meth:`register`, :meth:`release` or after its seconds).

        The batch is sent as one small server-side script per hash tag (at most 16), so the
        client packs and parses 16 commands instead of one per key."""
        groups = _tag_groups(keys)
        pipe = self._redis.pipeline(transaction=False)
        pipe.execute_command("EVAL", _NODES_LUA, 1, self.nodes_key)
        node, millis = (claim.node, max(1, int(claim.seconds * 1000))) if claim is not None else ("", 1)
        claimed = set(claim.keys) if claim is not None else set()
        ns = self._ns
        for tag, members in groups.items():
            names = [f"{ns}:{{{tag}}}:r:{d}" for _, d in members]
            if claim is not None:
                names += [f"{ns}:{{{tag}}}:c:{d}" for _, d in members]
            mask = "".join("1" if key in claimed else "0" for key, _ in members) if claimed else "0" * len(members)
            pipe.execute_command("EVAL", _LOOKUP_LUA, len(names), *names, node, millis, mask)
        replies = pipe.execute()
        found = Lookup()
        live = _live(replies[0], found.problems)
        _Replies(keys, live, found, node).add(groups.values(), replies[1:])
        return found

    def register(self, node: str, replicas: Sequence[Replica]) -> None:
        """Record that ``node`` holds ``replicas`` (each in its scope; those without one are
        skipped) and end its claims on them (one round trip)."""
        scoped = [r for r in replicas if r.scope is not None]
        if not scoped:
            return
        pipe = self._redis.pipeline(transaction=False)
        for r in scoped:
            assert r.scope is not None
            entry = self.entry_key(r.key, r.scope)
            pipe.hset(entry, node, r.scope.seal(node, r.key, r.size, r.sha256))
            pipe.expire(entry, ENTRY_TTL_S)
            pipe.delete(self.claim_key(r.key, r.scope))
        pipe.execute()

    def unregister(self, node: str, keys: Mapping[str, Scope]) -> None:
        """Forget ``node``'s replicas of ``keys`` (evicted, or found missing by a reader)."""
        if not keys:
            return
        pipe = self._redis.pipeline(transaction=False)
        for key, scope in keys.items():
            pipe.hdel(self.entry_key(key, scope), node)
        pipe.execute()

    # -- in-flight claims ---------------------------------------------------------------

    def release(self, key: str, scope: Scope, node: str) -> None:
        """Give up ``node``'s claim on ``key`` (its store read failed)."""
        name = self.claim_key(key, scope)
        if _text(self._redis.get(name)) == node:
            self._redis.delete(name)


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _tag_groups(keys: Mapping[str, Scope]) -> Dict[str, List[Tuple[str, str]]]:
    """(key, index name) of each of ``keys`` by hash tag (the name's first hex digit); the
    names of each scope's keys made in one batch."""
    by_scope: Dict[int, Tuple[Scope, List[str]]] = {}
    for key, scope in keys.items():
        by_scope.setdefault(id(scope), (scope, []))[1].append(key)
    groups: Dict[str, List[Tuple[str, str]]] = {}
    for scope, members in by_scope.values():
        for key, d in zip(members, scope.index_names(members)):
            groups.setdefault(d[0], []).append((key, d))
    return groups


class _Replies:
    """Turns one lookup's script replies into ``found``. A key with one entry of a live node
    (most keys) waits to be opened with the other such entries of its scope and node in one
    :meth:`Scope.open_batch`; any other key, and one whose entry that batch refuses, takes
    :func:`_holders`' long path (which writes the problem lines). Each node name is decoded
    once per lookup (a batch names the same few nodes a thousand times)."""

    def __init__(self, keys: Mapping[str, Scope], live: Mapping[str, NodeInfo], found: Lookup,
                 node: str) -> None:
        self._keys, self._live, self._found, self._node = keys, live, found, node
        self._names: Dict[Any, str] = {}
        # (id(scope), node) -> [(key, value, claim holder)]
        self._waiting: Dict[Tuple[int, str], List[Tuple[str, str, Any]]] = {}

    def add(self, groups: Any, replies: Sequence[Any]) -> None:
        """Every key's reply (``groups``: each script's (key, index name) list, as sent)."""
        problems, live, keys, names, waiting = self._found.problems, self._live, self._keys, self._names, self._waiting
        for members, reply in zip(groups, replies):
            for (key, _), (entry, holder, skipped) in zip(members, reply):
                if skipped:
                    problems.append(f"{skipped} oversized or surplus replica entries for {key!r} "
                                    "ignored in the replica index")
                if type(entry) is list and len(entry) == 2:  # one holder, as for most keys
                    raw, value = entry
                    name = names.get(raw) or self._name(raw)
                    if name in live:
                        text = value.decode("utf-8", "replace") if type(value) is bytes else str(value)
                        waiting.setdefault((id(keys[key]), name), []).append((key, text, holder))
                        continue
                self._settle(key, self.pairs(entry) if entry else {}, holder)
        self._open_waiting()

    def _open_waiting(self) -> None:
        found = self._found
        for (_, node), waiting in self._waiting.items():
            info = self._live[node]
            scope = self._keys[waiting[0][0]]
            opened = scope.open_batch(node, [(key, value) for key, value, _ in waiting])
            for (key, value, holder), one in zip(waiting, opened):
                if one is None:
                    self._settle(key, {node: value}, holder)
                    continue
                found.holders[key] = [Holder(info, one[0], one[1])]
                if holder is not None:
                    self._claim(key, _text(holder), True)

    def _settle(self, key: str, entry: Mapping[str, str], holder: Any) -> None:
        found = self._found
        holders = _holders(key, self._keys[key], entry, self._live, found.problems) if entry else []
        if holders:
            found.holders[key] = holders
        if holder is not None:
            self._claim(key, _text(holder), bool(holders))

    def _claim(self, key: str, holder: Optional[str], held: bool) -> None:
        if holder == self._node:
            self._found.won.append(key)
        elif holder is not None and not held:
            self._found.in_flight[key] = holder

    def _name(self, raw: Any) -> str:
        name = self._names.get(raw)
        if name is None:
            name = self._names[raw] = _text(raw) or ""
        return name

    def pairs(self, flat: Any) -> Dict[str, str]:
        """A flat [field, value, ...] reply (or a dict) as {node: value} strings."""
        if isinstance(flat, dict):
            flat = [x for kv in flat.items() for x in kv]
        return {self._name(raw): _decoded(value) for raw, value in zip(flat[0::2], flat[1::2])}


def _decoded(value: Any) -> str:
    return value.decode("utf-8", "replace") if type(value) is bytes else str(value)


def _live(reply: Any, problems: List[str]) -> Dict[str, NodeInfo]:
    """From the node-table script's reply (server seconds, microseconds, flat table): the
    nodes whose heartbeat has not expired; malformed entries reported."""
    seconds, micros, flat, skipped = reply
    if skipped:
        problems.append(f"{skipped} oversized or surplus node entries ignored in the replica index")
    now = int(seconds) + int(micros) / 1e6
    live: Dict[str, NodeInfo] = {}
    items = list(flat or [])
    for raw_node, raw in zip(items[0::2], items[1::2]):
        node = _text(raw_node) or ""
        try:
            expires, _, text = (_text(raw) or "").partition(" ")
            fields = json.loads(text)
            info = NodeInfo(node, str(fields["url"]), str(fields.get("host", "")),
                            str(fields.get("rack", "")))
            alive = float(expires) > now
        except (ValueError, KeyError, TypeError, AttributeError):
            problems.append(f"malformed node entry {node!r} in the replica index")
            continue
        if alive:
            live[node] = info
    return live


def _holders(key: str, scope: Scope, entry: Mapping[str, str], live: Mapping[str, NodeInfo],
             problems: List[str]) -> List[Holder]:
    """Live holders of one key whose entries ``scope`` authenticates, agreeing on (size,
    sha256) with the most others. (Called once per key of a batch: the usual cases, one
    holder, or several that agree, take short paths; anything else, problems included, the
    long one.)"""
    if len(entry) == 1:  # the usual case: one holder, well formed, alive and authenticated
        ((node, raw),) = entry.items()
        opened = scope.open_sealed(node, key, raw) if node in live else None
        if opened is not None:
            return [Holder(live[node], opened[0], opened[1])]
    values: Dict[str, Tuple[int, str]] = {}
    for node, raw in entry.items():
        if _SEALED.fullmatch(raw) is None:
            problems.append(f"malformed replica entry {node!r} for {key!r} in the replica index")
        elif node in live:  # a dead node's entry is never used: no need to check it
            opened = scope.unseal(node, key, raw)
            if opened is not None:
                values[node] = opened
            else:
                problems.append(f"unauthenticated replica entry {node!r} for {key!r} in the replica index "
                                "(not registered under this identity)")
    if not values:
        return []
    if len(values) == 1:
        ((node, (size, sha)),) = values.items()
        return [Holder(live[node], size, sha)]
    counts = Counter(values.values())
    best, agreeing = counts.most_common(1)[0]
    if len(counts) > 1:
        problems.append(f"replica entries for {key!r} disagree on size/checksum; "
                        f"using the {agreeing} that agree")
    return [Holder(live[n], best[0], best[1]) for n, v in sorted(values.items()) if v == best]
