"""The one duration grammar (``jobs``, ``outbox restream``, ``outbox prune``, the console)."""

from __future__ import annotations

import datetime as dt

import pytest

from connectors.ops.durations import format_duration, parse_duration, parse_instant, parse_since

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        # what `jobs` read before
        ("90s", 90),
        ("15m", 900),
        ("1h30m", 5400),
        (" 2D ", 172800),
        ("1w", 604800),
        # what `outbox restream` and `outbox prune` read before
        ("0s", 0),
        ("10m", 600),
        ("2h", 7200),
        ("1.5d", 129600),
        # what neither read before, now the same everywhere
        ("1.5h", 5400),
        ("1d12h", 129600),
        ("5w", 3024000),
        ("0.5m", 30),
    ],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "text",
    ["", "soon", "1h 30m", "1x", "h1", "-1h", "10", "ten minutes", "-5m", "1.h", ".5h", "1,5h"],
)
def test_a_bad_duration_says_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match=r"not a duration.*e\.g\. 90s, 10m, 1h30m, 1\.5h, 2d, 1w"):
        parse_duration(text)


def test_a_duration_too_long_for_a_timedelta_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="too long"):
        parse_duration("99999999999999w")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (-5, "0s"), (90, "1m30s"), (7 * 86400, "7d"), (129600, "1d12h")],
)
def test_format_duration_writes_what_parse_duration_reads(seconds: int, text: str) -> None:
    assert format_duration(dt.timedelta(seconds=seconds)) == text
    if seconds >= 0:
        assert parse_duration(text) == dt.timedelta(seconds=seconds)


def test_parse_since_takes_a_duration_or_an_instant() -> None:
    assert parse_since("2h", now=NOW) == NOW - dt.timedelta(hours=2)
    assert parse_since("1.5h", now=NOW) == NOW - dt.timedelta(minutes=90)
    assert parse_since("2026-11-30T08:00", now=NOW) == dt.datetime(2026, 11, 30, 8, tzinfo=dt.UTC)
    with pytest.raises(ValueError, match="not a duration or an ISO 8601"):
        parse_since("yesterday")


def test_parse_instant_takes_utc_unless_an_offset_is_given() -> None:
    assert parse_instant("2026-01-01") == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert parse_instant("2026-01-01T10:30") == dt.datetime(2026, 1, 1, 10, 30, tzinfo=dt.UTC)
    with_offset = parse_instant("2026-01-01T10:30-03:00")
    assert with_offset == dt.datetime(2026, 1, 1, 13, 30, tzinfo=dt.UTC)
    with pytest.raises(ValueError, match="not an ISO 8601 date-time"):
        parse_instant("yesterday")
