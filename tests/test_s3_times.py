"""S3's ISO 8601 times (LastModified, ServerTime, Expiration) computed without time.strptime:
the same epoch seconds as calendar.timegm(time.strptime(...)) on every zero-padded time."""

from __future__ import annotations

import calendar
import random
import time

import pytest

from transfer.backends._s3_wire import iso8601_epoch


def _strptime_epoch(text):
    try:
        return float(calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def test_every_zero_padded_time_matches_strptime():
    rng = random.Random(24)
    for _ in range(100_000):
        epoch = rng.randrange(-30610224000, 253402300799)  # years 1000 to 9999
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + rng.choice(["Z", ".123Z", "", "+00:00"])
        assert iso8601_epoch(text) == _strptime_epoch(text) == float(epoch), text


def test_a_changed_character_is_refused_or_read_as_strptime_reads_it():
    """strptime also takes a space-padded field (" 1"); S3 never writes one, and we refuse it."""
    rng = random.Random(7)
    for _ in range(100_000):
        text = list(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rng.randrange(0, 4102444800))))
        text[rng.randrange(len(text))] = rng.choice("0123456789-T:Z xt\u0663")
        changed = "".join(text)
        ours = iso8601_epoch(changed)
        assert ours is None or ours == _strptime_epoch(changed), changed


@pytest.mark.parametrize("text", [None, "", "2026-11-24", "2026-02-29T00:00:00Z", "2026-13-01T00:00:00Z",
                                  "2026-11-31T00:00:00Z", "2026-11-24T24:00:00Z", "0000-01-01T00:00:00Z",
                                  "2026-11-24 19:00:00Z", "２026-11-24T19:00:00Z"])
def test_malformed_times_are_none(text):
    assert iso8601_epoch(text) is None


def test_leap_days_and_leap_seconds_as_timegm():
    assert iso8601_epoch("2024-02-29T12:00:00Z") == _strptime_epoch("2024-02-29T12:00:00Z")
    assert iso8601_epoch("2000-02-29T00:00:00Z") == 951782400.0
    assert iso8601_epoch("2016-12-31T23:59:60Z") == _strptime_epoch("2016-12-31T23:59:60Z") == 1483228800.0
