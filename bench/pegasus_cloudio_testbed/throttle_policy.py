"""What a rate-limiting front decides per request: its prefix, whether it passes, the answer.

A store limits requests per key prefix (S3: about 5,500 GET/HEAD and 3,500 PUT per second per
prefix; GCS: per bucket at first). `prefix_of` names a request's prefix from its target:
S3 and GCS XML path style (``/bucket/key``) and the GCS JSON API (``/storage/v1/b/B/o/O``,
``/download/...``, ``/upload/...?name=O``); a bucket-level listing counts against the prefix it
lists. `PrefixLimiter` keeps one `TokenBucket` per prefix and counts requests and throttled
answers. `throttle_answer` builds the store-shaped refusal: S3's ``503 SlowDown`` XML or GCS's
``429``/``503`` JSON ``rateLimitExceeded``, with an optional ``Retry-After``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

from pegasus_cloudio_testbed.faults import SLOW_DOWN_BODY, Fault, status_response
from pegasus_cloudio_testbed.httpframe import RequestHead

__all__ = ["SHAPES", "PrefixLimiter", "TokenBucket", "prefix_of", "throttle_answer"]

SHAPES = ("s3", "gcs", "azure")
_GCS_JSON_ROOTS = ("storage", "download", "upload")

# --------------------------------------------------------------------------- the bucket


class TokenBucket:
    """``rate`` tokens per second up to ``burst``; starts full. Not thread-safe (the
    limiter holds its lock). Times are `time.monotonic` seconds, passed in for tests."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"token bucket needs rate > 0 and burst >= 1 (rate={rate}, burst={burst})")
        self.rate, self.burst = float(rate), float(burst)
        self.tokens, self._stamp = float(burst), now

    def take(self, now: float) -> bool:
        """Spend one token if there is one; a refused request spends nothing."""
        if now > self._stamp:
            self.tokens = min(self.burst, self.tokens + (now - self._stamp) * self.rate)
            self._stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class _Tally:
    requests: int = 0
    throttled: int = 0


class PrefixLimiter:
    """One `TokenBucket` per prefix, made on first use, and the counts `stats` reports."""

    def __init__(self, rate: float, burst: float,
                 clock: Callable[[], float] = time.monotonic, trace: bool = False) -> None:
        TokenBucket(rate, burst, 0.0)  # validate now, not on the first request
        self.rate, self.burst, self._clock = rate, burst, clock
        self._arrivals: Optional[List[Tuple[float, bool]]] = [] if trace else None
        self._lock = threading.Lock()
        self._buckets: Dict[str, TokenBucket] = {}
        self._tallies: Dict[str, _Tally] = {}
        self._start: Optional[float] = None  # the first request's time: the timeline's zero
        self._seconds: List[int] = []  # throttled answers in each second from it

    def admit(self, prefix: str) -> bool:
        """Count a request on ``prefix``; True if it may pass to the store."""
        with self._lock:
            now = self._clock()
            if self._start is None:
                self._start = now
            bucket = self._buckets.get(prefix)
            if bucket is None:
                bucket = self._buckets[prefix] = TokenBucket(self.rate, self.burst, now)
                self._tallies[prefix] = _Tally()
            passed = bucket.take(now)
            if self._arrivals is not None:
                self._arrivals.append((time.time(), passed))
            tally = self._tallies[prefix]
            tally.requests += 1
            if not passed:
                tally.throttled += 1
                self._count_second(now)
            return passed

    def _count_second(self, now: float) -> None:
        second = int(now - (self._start or now))
        if second < 86400:
            self._seconds.extend([0] * (second + 1 - len(self._seconds)))
            self._seconds[second] += 1

    def stats(self) -> Dict[str, object]:
        """``{"requests", "throttled", "prefixes": {prefix: {"requests", "throttled"}},
        "throttled_by_second"}``: the last, throttled answers in each second from the first request."""
        with self._lock:
            prefixes = {p: {"requests": t.requests, "throttled": t.throttled}
                        for p, t in self._tallies.items()}
            seconds = list(self._seconds)
        return {"requests": sum(p["requests"] for p in prefixes.values()),
                "throttled": sum(p["throttled"] for p in prefixes.values()),
                "prefixes": prefixes, "throttled_by_second": seconds}

    def arrivals(self) -> List[Tuple[float, bool]]:
        """With ``trace``: each request's arrival (epoch seconds, the clients' clock) and whether it passed."""
        with self._lock:
            return list(self._arrivals or [])

    def reset(self) -> None:
        """Zero the counts (the buckets keep their tokens)."""
        with self._lock:
            self._tallies = {p: _Tally() for p in self._tallies}
            self._start, self._seconds = None, []

# --------------------------------------------------------------------------- prefixes


def prefix_of(target: str, depth: int = 1) -> str:
    """The prefix a request target is limited under: ``bucket/`` plus the first ``depth``
    directories of the key (``"b/run1/"`` for ``/b/run1/f7`` at depth 1). Only whole
    directories count, so ``/b/f7`` and a listing of ``prefix=ru`` are both ``"b/"``.
    Targets that name no bucket (``/``, ``/batch/...``) are ``"/"``."""
    bucket, key = _bucket_and_key(target)
    if not bucket:
        return "/"
    dirs = key.split("/")[:-1][:max(0, depth)]
    return bucket + "/" + "".join(d + "/" for d in dirs)


def _bucket_and_key(target: str) -> Tuple[str, str]:
    parts = urlsplit(target)  # also takes the absolute form a proxy client may send
    query = parse_qs(parts.query)
    segments = parts.path.split("/")[1:]
    if parts.path.startswith("/batch/storage/v1"):  # GCS batches name their objects inside
        return "", ""
    if len(segments) >= 4 and segments[0] in _GCS_JSON_ROOTS:
        return _gcs_json(segments, query)
    bucket = unquote(segments[0]) if segments else ""
    key = unquote("/".join(segments[1:]))
    return bucket, key or _first(query, "prefix")


def _gcs_json(segments: List[str], query: Dict[str, List[str]]) -> Tuple[str, str]:
    """``[download|upload/]storage/v1/b/BUCKET[/o[/OBJECT]]``: OBJECT is one %-encoded segment."""
    rest = segments[1:] if segments[0] != "storage" else segments
    if len(rest) < 4 or rest[:3] != ["storage", "v1", "b"]:
        return "", ""
    bucket = unquote(rest[3])
    if len(rest) >= 6 and rest[4] == "o" and rest[5]:
        return bucket, unquote(rest[5])
    return bucket, _first(query, "name") or _first(query, "prefix")


def _first(query: Dict[str, List[str]], name: str) -> str:
    values = query.get(name)
    return str(values[0]) if values else ""

# --------------------------------------------------------------------------- answers


_SERVER_BUSY = (b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code><Message>Ingress is over '
                b"the account limit.</Message></Error>")


def _gcs_body(code: int) -> bytes:
    message = "The rate of requests to this bucket exceeds the rate limit. Please reduce your request rate."
    return json.dumps({"error": {"code": code, "message": message, "errors": [
        {"message": message, "domain": "usageLimits", "reason": "rateLimitExceeded"}]}}).encode()


def throttle_answer(shape: str, code: int, retry_after: Optional[float],
                    head: RequestHead, close: bool) -> bytes:
    """The whole refusal of one request, as the store of ``shape`` words it."""
    headers = {"Content-Type": "application/json; charset=UTF-8" if shape == "gcs" else "application/xml"}
    if shape == "azure":  # Azure Storage names the code in a header too (a HEAD's answer has no body)
        headers["x-ms-error-code"] = "ServerBusy"
    if retry_after is not None:
        headers["Retry-After"] = f"{retry_after:g}"
    body = {"s3": SLOW_DOWN_BODY, "azure": _SERVER_BUSY}.get(shape) or _gcs_body(code)
    return status_response(Fault.status(code, body, headers), head, close)
