"""Quiet hours: the window, the recipient's timezone, the end of the hold."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest

from streams.quiet_hours import CALLING_CODE_ZONES, QuietHours, parse_window, recipient_zone

NIGHT = QuietHours.parse("21:00-08:00")
SAO_PAULO = zoneinfo.ZoneInfo("America/Sao_Paulo")  # UTC-3, no DST since 2019


def test_the_window_parses_with_optional_seconds_and_refuses_nonsense() -> None:
    assert parse_window("21:00-08:00") == (dt.time(21), dt.time(8))
    assert parse_window(" 9:05:30 - 9:06 ") == (dt.time(9, 5, 30), dt.time(9, 6))
    for bad in ("21-08", "25:00-08:00", "21:00", "08:00-08:00", ""):
        with pytest.raises(ValueError, match="quiet hours"):
            parse_window(bad)


def test_the_recipients_zone_comes_from_the_intent_else_the_longest_calling_code() -> None:
    assert recipient_zone("5511987654321") == SAO_PAULO
    assert recipient_zone("351912345678") == zoneinfo.ZoneInfo("Europe/Lisbon")  # not 35x
    assert recipient_zone("14155550100") == zoneinfo.ZoneInfo("America/New_York")
    assert recipient_zone("5511987654321", "Asia/Tokyo") == zoneinfo.ZoneInfo("Asia/Tokyo")
    assert recipient_zone("5511987654321@s.whatsapp.net") == SAO_PAULO
    assert recipient_zone("120363025246125486@g.us") is None  # a group: no one country
    assert recipient_zone("999123") is None
    for name in CALLING_CODE_ZONES.values():
        zoneinfo.ZoneInfo(name)  # every zone of the table exists


def test_a_hold_ends_at_the_windows_end_in_the_recipients_local_time() -> None:
    # 23:30 in Sao Paulo: held until 08:00 there the next morning (11:00 UTC).
    late = dt.datetime(2026, 3, 9, 23, 30, tzinfo=SAO_PAULO)
    assert NIGHT.hold_until(late, "5511987654321") == dt.datetime(2026, 3, 10, 11, tzinfo=dt.UTC)
    # 03:00: until 08:00 the same day.
    early = dt.datetime(2026, 3, 10, 3, tzinfo=SAO_PAULO)
    assert NIGHT.hold_until(early, "5511987654321") == dt.datetime(2026, 3, 10, 11, tzinfo=dt.UTC)
    # Noon in Sao Paulo is 16:00 in Lisbon: neither is quiet.
    noon = dt.datetime(2026, 3, 10, 12, tzinfo=SAO_PAULO)
    assert NIGHT.hold_until(noon, "5511987654321") is None
    assert NIGHT.hold_until(noon, "351912345678") is None
    # 22:00 in Sao Paulo is 02:00 in Lisbon: quiet there, until 08:00 Lisbon (08:00 UTC).
    evening = dt.datetime(2026, 3, 10, 22, tzinfo=SAO_PAULO)
    assert NIGHT.hold_until(evening, "351912345678") == dt.datetime(2026, 3, 11, 8, tzinfo=dt.UTC)
    # A window within one day, and one ending in under SLACK_S: not worth a hold.
    lunch = QuietHours.parse("12:00-14:00")
    assert lunch.hold_until(noon, "5511987654321") == dt.datetime(2026, 3, 10, 17, tzinfo=dt.UTC)
    ending = dt.datetime(2026, 3, 10, 7, 59, 58, tzinfo=SAO_PAULO)
    assert NIGHT.hold_until(ending, "5511987654321") is None
