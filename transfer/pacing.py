"""Request pacing per (endpoint, prefix): an adaptive token bucket, cut by throttle answers.

Why: a store limits requests per key prefix (S3 ~5,500 GET/s, GCS ~5,000 reads/s per bucket
at first) and answers ``503 SlowDown``/429 past it. Retrying harder only adds to the load;
what ends the storm is every client sending less. As in TCP's CUBIC and the AWS SDKs'
adaptive retry mode, a throttle answer cuts the rate to ``BETA`` times the rate in use, and
the rate then grows back as a cubic function of the time since that cut: quickly far from the
last rate that was throttled, slowly near it, then probing beyond::

    rate(t) = SCALE * (t - K)**3 + last_max        K = cbrt(last_max * (1 - BETA) / SCALE)

so rate(0) = BETA * last_max and rate(K) = last_max.

A prefix is *limited* from its first throttle answer until ``CALM_SECONDS`` pass without one.
While it is not, :meth:`Pace.acquire` reads one attribute and returns (no lock, no system
call; one look at the shared state every ``LEARN_EVERY`` requests, so that a job takes up
what another job of the node learned): the cost of pacing when nothing throttles. While it is, each request reserves a token
from the bucket (filled at ``rate(t)``, holding at most ``BURST_SECONDS`` of it) and sleeps
until its token is due (:func:`wait_for`: as the rate grows meanwhile), and on if the prefix
was cut while it slept (:func:`due_in`: each request holds the number of its token, so the queue
follows every cut at once, in order; that look, and the look every ``LEARN_EVERY`` requests, is a :meth:`States.peek`, which waits for no
lock: on a node of 200 jobs a lock held by a process the CPU has set aside holds up them all).

Where the state lives is a :class:`States` store: :class:`LocalStates` keeps it in this
process; :class:`transfer.pacing_node.NodeStates` in a small file every job of the user on
this node shares (``docs/throttling.md``), so 100 jobs on a node learn a prefix's rate once.
The arithmetic is pure functions of a :class:`RateState` and a time, for the tests.
"""

from __future__ import annotations

import time

from transfer import _threads
from transfer.lean import record
from transfer.schemes import SCHEMES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Optional, Protocol, Tuple

    from transfer._threads import Cancel
    from transfer.urls import Url

    Clock = Callable[[], float]
    Trace = Callable[..., None]  # (event, *values): :class:`transfer.pacing_trace.PaceTrace`

    class States(Protocol):
        """Where the state of each key lives: ``update(key, change)`` applies ``change`` to the
        key's state (None: no state yet) atomically with respect to every other user of the
        store, keeps what it returns (None: forget the key) and returns its second value. A
        change that returns the state it was given only reads: the store need not write."""

        def update(self, key: str, change: "Callable[[Optional[RateState]], Tuple[Optional[RateState], float]]"
                   ) -> float: ...

        def peek(self, key: str) -> "Optional[RateState]":
            """The key's state as some update left it, read without waiting for the one under way
            (None: no state): a look, e.g. for a cut as a paced request wakes, that must not
            queue behind the node's writers. Never a state no update wrote."""

__all__ = ["BETA", "CALM_SECONDS", "LocalStates", "Pace", "Pacer", "RateState", "cut", "join", "prefix_key",
           "due_in", "rate_at", "reserve", "wait_for"]

BETA = 0.7            # the cut: the rate in use times this (CUBIC's and the AWS SDKs' beta)
SCALE = 0.4           # requests/s per s^3 of cubic growth (the AWS SDKs' scale constant)
MIN_RATE = 0.5        # requests/s a throttled prefix is never cut below
BURST_SECONDS = 0.1   # the bucket holds this many seconds of its rate (at least one token)
CALM_SECONDS = 60.0   # without a throttle answer for this long, a prefix is no longer paced
_INF = float("inf")  # (no ``math`` import: a job step's start-up)
MIN_WINDOW = 0.1      # seconds: a rate measured over less is measured over this
CUT_SECONDS = 1.0     # throttle answers this soon after a cut belong to the same round (a loaded node's round trip)
MAX_WAIT = 60.0       # seconds a request waits for its token at most (tokens owed are capped)
LEARN_EVERY = 64      # requests of a pace not paced, between two looks at the shared state
PASS_LEARN_EVERY = 8  # the same, for the requests of a pipelined pass (:meth:`Pace.draw`)
RECHECK_SECONDS = 0.05  # a wait this long looks for a cut made meanwhile (a shorter one would move < 22 ms)
MAX_LOOKS = 16        # looks at most while a request waits for its token


@record(frozen=True)
class RateState:
    """What is known of one prefix: ``last_max`` requests/s when it was last cut, at
    ``cut_at`` (epoch seconds); ``tokens`` in the bucket at ``stamp`` (may be negative: tokens
    reserved by requests waiting for them); ``epoch``: where the cubic growth starts, the cut
    moved on by the time the bucket has had tokens to spare since (the rate grows only while
    it holds requests back: an idle or CPU-starved node does not come back to a rate of
    thousands per second, CUBIC's rule for an application-limited sender; an epoch before the
    cut means the cut); ``taken``: tokens reserved since the state began, so the number of the
    last one (a request's *ticket*, :func:`due_in`); the bucket has made ``taken + tokens`` by
    ``stamp``, and a cut changes how fast it makes the rest, never which number is next."""

    last_max: float
    cut_at: float
    tokens: float
    stamp: float
    epoch: float = 0.0
    taken: float = 0.0


def rate_at(state: RateState, now: float) -> float:
    """The bucket's fill rate (requests/s) at ``now``: the cubic growth since the cut."""
    k: float = (state.last_max * (1 - BETA) / SCALE) ** (1 / 3)
    since: float = max(0.0, now - max(state.cut_at, state.epoch)) - k
    return max(MIN_RATE, SCALE * since * since * since + state.last_max)


def _cbrt(value: float) -> float:
    root: float = abs(value) ** (1 / 3)
    return root if value >= 0 else -root


def wait_for(state: RateState, now: float, owed: float, ceiling: float = _INF) -> float:
    """Seconds from ``now`` until the bucket of ``state`` has made ``owed`` tokens, its rate
    growing meanwhile (the cubic of :func:`rate_at`, up to ``ceiling``): a queue booked while the
    rate is low drains as it grows, not at the low rate for up to MAX_WAIT. At most ``owed``
    over the rate at ``now`` (the rate never falls between cuts)."""
    rate = min(rate_at(state, now), ceiling)
    flat = max(0.0, owed) / rate
    if flat == 0.0 or rate >= ceiling:
        return flat
    x0 = max(0.0, now - max(state.cut_at, state.epoch)) - _cbrt(state.last_max * (1 - BETA) / SCALE)

    def made(t: float) -> float:  # tokens the cubic makes in t seconds (its integral)
        x = x0 + t
        return SCALE / 4 * (x * x * x * x - x0 * x0 * x0 * x0) + state.last_max * t

    t = flat  # Newton's method from above: ``made`` is convex and increasing, so it never overshoots
    for _ in range(40):
        step = (made(t) - owed) / max(MIN_RATE, SCALE * (x0 + t) ** 3 + state.last_max)
        t -= step
        if abs(step) < 1e-4:
            break
    t = min(flat, max(0.0, t))
    top = _cbrt((ceiling - state.last_max) / SCALE) - x0  # when the cubic reaches the ceiling
    if top < t:
        t = top + (owed - made(top)) / ceiling
    return t


def cut(state: Optional[RateState], now: float, measured: float, sent: float,
        ceiling: float = _INF, paced: bool = True, joining: bool = False) -> Tuple[Optional[RateState], float]:
    """The state after a throttle answer, at ``now``, to a request sent at ``sent``: the rate
    in use cut to BETA times it. The rate in use is the bucket's; for a prefix not paced (no
    state, or calm for CALM_SECONDS) it is ``measured``, the requests/s of the caller.

    The tokens owed at the cut stay owed, in their order, and are paid at the new rate: each
    request that reserved one before the cut goes out when the new rate has made its token
    (:func:`due_in`: ``taken`` is kept, so each reservation's number still counts its place
    through any number of cuts), and requests after the cut queue behind it; the queue follows
    the cut at once, so its answers are the next round's signal.

    One cut per round: an answer to a request sent before the last cut, or within CUT_SECONDS
    of it, says nothing new (TCP cuts once per window, not once per lost segment; the requests
    other jobs had in flight when one of them cut arrive together). Nor does an answer to a
    request that was not ``paced`` (sent before its job took up the prefix's state): that job
    now paces by the state, which already holds the cut; cutting again for each job's first
    answer would cut a node's rate once per job. Such a job, ``joining`` (its first throttle
    answer, while it did not pace by the state), adds its ``measured`` rate to the cut's
    (:func:`join`): the first cut of a node is from the node's rate, not one job's."""
    if state is not None and now - state.cut_at < CALM_SECONDS:
        if not paced or sent < state.cut_at or now - state.cut_at < CUT_SECONDS:
            return (join(state, now, measured, ceiling) if joining else state), 0.0
        in_use = min(rate_at(state, now), ceiling)
        owed = min(0.0, state.tokens + max(0.0, now - state.stamp) * in_use)
    else:
        in_use, owed = measured, 0.0
    rate = max(MIN_RATE, min(in_use, ceiling))
    owed = max(-max(MIN_RATE, BETA * rate) * MAX_WAIT, owed)  # (BETA * rate: rate_at the cut)
    return RateState(rate, now, owed, now, now, state.taken if state is not None else 0.0), 0.0


def join(state: RateState, now: float, measured: float, ceiling: float = _INF) -> RateState:
    """The state after a job that sent ``measured`` requests/s unpaced takes it up at ``now``.
    Within the round of the cut (CUT_SECONDS), that job's requests were part of the rate the
    store throttled, but not of the rate cut: a cut is made from the bucket's rate, or, for a
    prefix not yet paced (a node's first cut), from the requests/s of the one job that had the
    answer. So the rate before the cut grows by ``measured`` (up to ``ceiling``), and with it the
    bucket's (BETA times it at the cut): 100 jobs of a node, each learning of the first cut as
    its own answer comes or as it looks at the state, make the cut one of the node's rate, with
    one write each, made only once the prefix is throttled. Later, the state as it is."""
    if measured <= 0 or not 0 <= now - state.cut_at < CUT_SECONDS or state.last_max >= ceiling:
        return state
    return RateState(min(state.last_max + measured, ceiling), state.cut_at, state.tokens, state.stamp, state.epoch,
                     state.taken)


def due_in(state: Optional[RateState], ticket: float, now: float, most: float, ceiling: float = _INF) -> float:
    """Seconds from ``now`` until the token numbered ``ticket`` (:attr:`RateState.taken` as the
    request reserved it) is made, by ``state`` as it is now: after any number of cuts since the
    reservation (each made the tokens still owed at the new rate, :func:`cut`), the queue keeps
    its order and leaves at the rate now in use, with no gap before the requests booked after
    them. At most the time of ``most`` tokens (those owed at the reservation: nothing ever
    queues ahead of a reservation later, so a state that does not know the ticket, e.g. one
    another process reset, costs no more than the wait first booked); 0 for a state gone calm."""
    if state is None or now - state.cut_at >= CALM_SECONDS:
        return 0.0
    since = max(0.0, now - state.stamp)  # the tokens made since: the mean of the rates at both ends (the
    # cubic is smooth over the moments between two reservations; a little short where it is concave)
    made = state.taken + state.tokens + since * (min(rate_at(state, state.stamp), ceiling) + min(rate_at(state, now), ceiling)) / 2
    ahead = min(ticket - made, most)
    return wait_for(state, now, ahead, ceiling) if ahead > 0 else 0.0


def reserve(state: Optional[RateState], now: float, ceiling: float = _INF) -> Tuple[Optional[RateState], float]:
    """The state after one request takes a token at ``now``, and the seconds it must wait for
    it; -1.0 for a prefix not paced (no state, or calm for CALM_SECONDS, which forgets it).
    The request's ticket is the state's ``taken`` after it (:func:`due_in`).
    ``ceiling``: requests/s the rate never passes (a pool's share of the store's limit)."""
    if state is None or now - state.cut_at >= CALM_SECONDS:
        return None, -1.0
    rate = min(rate_at(state, now), ceiling)
    filled = state.tokens + max(0.0, now - state.stamp) * rate
    # a token to spare: the rate did not hold requests back since the last one, so it does not grow for that time
    idle = max(0.0, now - state.stamp) if filled >= 1.0 else 0.0
    after = RateState(state.last_max, state.cut_at, 0.0, now, min(now, max(state.cut_at, state.epoch) + idle))
    rate = min(rate_at(after, now), ceiling)  # the growth waited the idle time out
    tokens = min(max(1.0, rate * BURST_SECONDS), filled) - 1
    tokens = max(-rate * MAX_WAIT, tokens)  # a state from another process is not trusted to be sane
    after = RateState(after.last_max, after.cut_at, tokens, now, after.epoch, state.taken + 1)
    return after, (wait_for(after, now, -tokens, ceiling) if tokens < 0 else 0.0)


def prefix_key(url: Url) -> str:
    """The key a store limits ``url``'s requests by, as far as a client can tell: its endpoint
    and the prefix its scheme's row names (:mod:`transfer.schemes`: the bucket and the key's
    first ``pace_depth`` directories, as S3 and GCS partition by key prefix, so the jobs that
    each read their own directory under one prefix share its rate); the key's directory for a
    scheme with no such prefix. Only whole directories count: ``b/f7`` is ``b/``."""
    row = SCHEMES.get(url.scheme)
    if row is None or row.pace_root is None:
        return f"{url.scheme}://{url.host}{url.path.rpartition('/')[0]}/"
    root = row.pace_root
    parts = url.path.split("/", root + row.pace_depth + 1)[1:]  # the segments kept, then the rest (or the name)
    return f"{url.scheme}://{url.host}/" + "".join(d + "/" for d in parts[:root] + parts[root:-1])


class LocalStates:
    """The states of this process (a dict under a lock)."""

    def __init__(self) -> None:
        self._states: Dict[str, RateState] = {}
        self._lock = _threads.Lock()

    def update(self, key: str, change: Callable[[Optional[RateState]], Tuple[Optional[RateState], float]]) -> float:
        with self._lock:
            state, result = change(self._states.get(key))
            if state is None:
                self._states.pop(key, None)
            else:
                self._states[key] = state
            return result

    def peek(self, key: str) -> Optional[RateState]:
        return self._states.get(key)  # one dict read: atomic, and the states are frozen


class Pace:
    """The pacing of one prefix in this process. ``limited`` is the fast path's one read."""

    def __init__(self, key: str, states: States, clock: Clock, sleep: Callable[[float], None],
                 ceiling: float = _INF, trace: Optional[Trace] = None) -> None:
        self.key = key
        self._trace = trace  # :mod:`transfer.pacing_trace` (None: off)
        self.ceiling = ceiling
        self.limited = False
        self._paced_since = 0.0  # when ``limited`` last became true
        self._states = states
        self._clock = clock
        self._sleep = sleep
        self.sent = 0  # requests since ``_since``: counted without a lock (a close estimate is enough)
        self._since = self._born = clock()
        self.requests = 0  # since this pace was made
        self.throttles = 0  # throttle answers among them
        self.waited = 0.0  # seconds slept for tokens

    def achieved(self) -> float:
        """Requests answered (not throttled) per second since this pace was made."""
        return (self.requests - self.throttles) / max(MIN_WINDOW, self._clock() - self._born)

    def acquire(self, cancel: Optional[Cancel] = None) -> None:
        """Wait for this request's token (returns at once unless the prefix is paced); a wait
        of RECHECK_SECONDS or more looks at the state again as it ends and waits on if the
        prefix was cut meanwhile (:func:`due_in`)."""
        self.sent += 1
        self.requests += 1
        if not self.limited:
            if self.requests % LEARN_EVERY == 0:  # another job may have been throttled meanwhile
                self.learn()
            if self._trace is not None:
                self._trace("free", self._clock())
            return
        self._take(cancel)

    def draw(self, cancel: Optional[Cancel] = None) -> None:
        """:meth:`acquire` for a request of a pipelined pass, which sends up to its connections
        times its depth in one round trip: the same token, and a look at the shared state every
        PASS_LEARN_EVERY requests while not paced, so that a cut another job of the node made
        paces this pass within a few requests, not LEARN_EVERY."""
        self.sent += 1
        self.requests += 1
        if not self.limited:
            if self.requests % PASS_LEARN_EVERY == 0:
                self.learn()
            if not self.limited:
                if self._trace is not None:
                    self._trace("free", self._clock())
                return
        self._take(cancel)

    def _take(self, cancel: Optional[Cancel]) -> None:
        """Reserve a token of the paced prefix and wait for it (:meth:`acquire`): a wait of
        RECHECK_SECONDS or more looks at the state as it ends and, if a cut since made the
        token due later (:func:`due_in`), waits on; so a request follows every cut made while
        it slept, at no cost while it sleeps (a cut only ever makes a token due later)."""
        booked = [0.0, 0.0, 0.0]  # when, the ticket, tokens owed then

        def take(state: Optional[RateState]) -> Tuple[Optional[RateState], float]:
            booked[0] = self._clock()
            after, wait = reserve(state, booked[0], self.ceiling)
            if after is not None:
                booked[1], booked[2] = after.taken, -after.tokens
            return after, wait

        asked = self._clock() if self._trace is not None else 0.0
        wait = self._states.update(self.key, take)
        if self._trace is not None:
            self._trace("take", asked, booked[0] - asked)
        if wait <= 0:
            self.limited = wait == 0  # -1: calm again, back to the fast path
            self._traced_send(booked[0], booked[0], 0.0)
            return
        due = last = booked[0] + wait
        looks = 0  # (a cut per round at most: a few looks cover a queue of MAX_WAIT)
        while not self._pause(wait, cancel) and wait >= RECHECK_SECONDS and looks < MAX_LOOKS:
            looks += 1
            now = self._clock()  # (a sleep may have overrun its time on a loaded node)
            state = self._states.peek(self.key)  # a look: no lock to queue on
            later = min(now + due_in(state, booked[1], now, booked[2], self.ceiling), booked[0] + 2 * MAX_WAIT)
            if later <= last + 0.001:  # no cut moved it: its time has come
                break
            wait, last = later - now, later
        self._traced_send(booked[0], due, last if last > due else 0.0)

    def _traced_send(self, booked: float, due: float, later: float) -> None:
        if self._trace is not None:
            self._trace("send", self._clock(), booked, due, later)

    def _pause(self, seconds: float, cancel: Optional[Cancel]) -> bool:
        """Sleep ``seconds`` (counted in ``waited``); True if ``cancel`` was set meanwhile."""
        self.waited += seconds
        if cancel is None:
            self._sleep(seconds)
            return False
        return cancel.wait(seconds)

    def throttled(self, sent: float) -> None:
        """A throttle answer came to a request sent at ``sent`` (this module's clock). An answer
        that does not cut (:func:`cut`: not a new round) is told from a look at the state and
        takes no lock; one that may cut is decided again under it."""
        now = self._clock()
        elapsed = max(MIN_WINDOW, now - self._since)
        measured = self.sent / elapsed
        self.sent, self._since = 0, now
        self.throttles += 1
        paced = self.limited and sent >= self._paced_since
        joining = not self.limited
        self._limit(now)
        seen = self._states.peek(self.key)
        if seen is not None and cut(seen, now, measured, sent, self.ceiling, paced, joining)[0] is seen:
            if self._trace is not None:
                self._trace("503", now, sent, paced, 0, 0.0, 0.0)
            return  # not a new round (most answers of a storm): nothing to write, so no lock to queue on
        wrote = [0.0]  # the rate cut from, if this answer cut

        def change(state: Optional[RateState]) -> Tuple[Optional[RateState], float]:
            after = cut(state, now, measured, sent, self.ceiling, paced, joining)
            wrote[0] = after[0].last_max if after[0] is not None and after[0].cut_at == now else 0.0
            return after

        self._states.update(self.key, change)
        if self._trace is not None:
            self._trace("503", now, sent, paced, wrote[0] > 0, self._clock() - now, wrote[0])

    def _limit(self, now: float) -> None:
        """Pace from ``now`` on (requests sent before were not paced)."""
        if not self.limited:
            self.limited, self._paced_since = True, now

    def learn(self) -> None:
        """Take up what the store knows of this prefix (another job was throttled on it); a
        job that sent requests unpaced meanwhile adds their rate to a cut as recent as the
        round (:func:`join`)."""
        now = self._clock()
        state = self._states.peek(self.key)  # a look: no lock
        if state is None or now - state.cut_at >= CALM_SECONDS:
            self.limited = False
            return
        if not self.limited and self.sent:
            measured = self.sent / max(MIN_WINDOW, now - self._since)
            self.sent, self._since = 0, now
            if join(state, now, measured, self.ceiling) is not state:  # (most looks: no lock, no write)
                self._states.update(self.key, lambda seen: (None if seen is None else
                                                            join(seen, now, measured, self.ceiling), 0.0))
        self._limit(now)


class Pacer:
    """The paces of one process, one per prefix key, made on first use. ``clock`` is epoch
    seconds (states may be shared between processes); ``ceiling(key)``: the most requests/s
    a prefix is ever paced at (default: no bound); ``trace``: where each pace tells its events
    (:mod:`transfer.pacing_trace`; None, the default: nowhere)."""

    def __init__(self, states: Optional[States] = None, clock: Clock = time.time,
                 sleep: Callable[[float], None] = time.sleep,
                 ceiling: Optional[Callable[[str], float]] = None, trace: Optional[Trace] = None) -> None:
        self._trace = trace
        self._states: States = states if states is not None else LocalStates()
        self._ceiling = ceiling
        self._clock = clock
        self._sleep = sleep
        self._paces: Dict[str, Pace] = {}
        self._lock = _threads.Lock()

    @property
    def clock(self) -> Clock:
        return self._clock

    def pace(self, url: Url) -> Pace:
        """The pace of ``url``'s prefix (a dict lookup once made)."""
        key = prefix_key(url)
        found = self._paces.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._paces.get(key)
            if found is None:
                bound = self._ceiling(key) if self._ceiling is not None else _INF
                found = self._paces[key] = Pace(key, self._states, self._clock, self._sleep, bound, self._trace)
                found.learn()
            return found
