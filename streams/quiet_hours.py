"""Quiet hours: bulk jobs wait while it is night where the recipient lives.

``ZAPSTREAM_WORKER_QUIET_HOURS=21:00-08:00`` (off by default) names a window of local
time. Right before it would attempt a **bulk** job (``priority = bulk``), the worker
asks :meth:`QuietHours.hold_until`: when the recipient's local time is inside the
window, the job moves to ``SCHEDULED`` with ``next_retry_at`` the window's end (never
past its ``expires_at``: it is then released at its expiry and settles EXPIRED). The
state sink writes both to ``outbox_jobs``, and the relay's scheduled release
(:mod:`connectors.cdc.scheduled_release`) brings it back like any scheduled job. So a
held job costs the worker nothing while it waits (no parked conversation, no memory):
it waits in PostgreSQL. Operational jobs are never held.

Why at the attempt, in the worker: that is the moment a message would reach the phone,
so a campaign that drains slowly into the evening stops at the window's start, which a
check at insert or in the relay could not do; and the worker already has the intent,
its clock and a durable way to change a job's state.

The recipient's timezone: the intent's ``timezone`` (payload key, an IANA name, checked
by the shared rules), else the one :data:`CALLING_CODE_ZONES` gives the number's country
calling code (longest prefix wins), else none (a group JID, an unknown code): no hold.
For a country that spans zones the table names its most populous one, documented in
docs/guides/application.md: Brazil 55 -> America/Sao_Paulo, the United States and
Canada 1 -> America/New_York, Russia 7 -> Europe/Moscow, Mexico 52 ->
America/Mexico_City, Australia 61 -> Australia/Sydney, Indonesia 62 -> Asia/Jakarta.
An application that knows better passes ``timezone``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import re
import zoneinfo

CALLING_CODE_ZONES: dict[str, str] = {
    "1": "America/New_York",
    "7": "Europe/Moscow",
    "20": "Africa/Cairo",
    "27": "Africa/Johannesburg",
    "30": "Europe/Athens",
    "31": "Europe/Amsterdam",
    "32": "Europe/Brussels",
    "33": "Europe/Paris",
    "34": "Europe/Madrid",
    "36": "Europe/Budapest",
    "39": "Europe/Rome",
    "40": "Europe/Bucharest",
    "41": "Europe/Zurich",
    "43": "Europe/Vienna",
    "44": "Europe/London",
    "45": "Europe/Copenhagen",
    "46": "Europe/Stockholm",
    "47": "Europe/Oslo",
    "48": "Europe/Warsaw",
    "49": "Europe/Berlin",
    "51": "America/Lima",
    "52": "America/Mexico_City",
    "53": "America/Havana",
    "54": "America/Argentina/Buenos_Aires",
    "55": "America/Sao_Paulo",
    "56": "America/Santiago",
    "57": "America/Bogota",
    "58": "America/Caracas",
    "60": "Asia/Kuala_Lumpur",
    "61": "Australia/Sydney",
    "62": "Asia/Jakarta",
    "63": "Asia/Manila",
    "64": "Pacific/Auckland",
    "65": "Asia/Singapore",
    "66": "Asia/Bangkok",
    "81": "Asia/Tokyo",
    "82": "Asia/Seoul",
    "84": "Asia/Ho_Chi_Minh",
    "86": "Asia/Shanghai",
    "90": "Europe/Istanbul",
    "91": "Asia/Kolkata",
    "92": "Asia/Karachi",
    "93": "Asia/Kabul",
    "94": "Asia/Colombo",
    "95": "Asia/Yangon",
    "98": "Asia/Tehran",
    "212": "Africa/Casablanca",
    "213": "Africa/Algiers",
    "216": "Africa/Tunis",
    "233": "Africa/Accra",
    "234": "Africa/Lagos",
    "244": "Africa/Luanda",
    "254": "Africa/Nairobi",
    "258": "Africa/Maputo",
    "351": "Europe/Lisbon",
    "353": "Europe/Dublin",
    "358": "Europe/Helsinki",
    "380": "Europe/Kyiv",
    "420": "Europe/Prague",
    "502": "America/Guatemala",
    "503": "America/El_Salvador",
    "504": "America/Tegucigalpa",
    "505": "America/Managua",
    "506": "America/Costa_Rica",
    "507": "America/Panama",
    "591": "America/La_Paz",
    "593": "America/Guayaquil",
    "595": "America/Asuncion",
    "598": "America/Montevideo",
    "852": "Asia/Hong_Kong",
    "880": "Asia/Dhaka",
    "886": "Asia/Taipei",
    "966": "Asia/Riyadh",
    "971": "Asia/Dubai",
    "972": "Asia/Jerusalem",
}
"""Country calling code -> a representative IANA timezone (see the module docstring)."""

_TIME = r"([01]?\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?"
_WINDOW = re.compile(rf"^\s*{_TIME}\s*-\s*{_TIME}\s*$")

SLACK_S = 5.0
"""A window ending sooner than this is not worth a hold (clocks of PostgreSQL, which
releases, and of the worker, which checks, may differ by a little)."""


def parse_window(text: str) -> tuple[dt.time, dt.time]:
    """``"21:00-08:00"`` (seconds optional: ``21:00:30``) as (start, end) local times;
    ValueError naming the format."""
    match = _WINDOW.match(text)
    if match is None:
        raise ValueError(f"quiet hours {text!r} are not HH:MM-HH:MM (e.g. 21:00-08:00)")
    h1, m1, s1, h2, m2, s2 = (int(g or 0) for g in match.groups())
    start, end = dt.time(h1, m1, s1), dt.time(h2, m2, s2)
    if start == end:
        raise ValueError(f"quiet hours {text!r} start and end at the same time")
    return start, end


@functools.lru_cache(maxsize=256)
def _zone(name: str) -> zoneinfo.ZoneInfo | None:
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None


def recipient_zone(to: str, timezone: str | None = None) -> zoneinfo.ZoneInfo | None:
    """The recipient's timezone: ``timezone`` if given, else by calling code; None: unknown."""
    if timezone:
        return _zone(timezone)
    if "@g.us" in to:
        return None  # a group has no one country
    digits = to.split("@", 1)[0]
    for length in (3, 2, 1):
        name = CALLING_CODE_ZONES.get(digits[:length])
        if name is not None:
            return _zone(name)
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class QuietHours:
    """A daily window of local time in which bulk jobs wait (may cross midnight)."""

    start: dt.time
    end: dt.time

    @classmethod
    def parse(cls, text: str) -> QuietHours:
        return cls(*parse_window(text))

    def inside(self, local: dt.time) -> bool:
        if self.start < self.end:
            return self.start <= local < self.end
        return local >= self.start or local < self.end

    def hold_until(
        self, now: dt.datetime, to: str, timezone: str | None = None
    ) -> dt.datetime | None:
        """The end of the window (UTC) if it is quiet time for ``to`` at ``now``, else None."""
        zone = recipient_zone(to, timezone)
        if zone is None:
            return None
        local = now.astimezone(zone)
        if not self.inside(local.time()):
            return None
        end_day = local.date()
        if local.time() >= self.end:
            end_day += dt.timedelta(days=1)  # before midnight in a window that crosses it
        end = dt.datetime.combine(end_day, self.end, tzinfo=zone).astimezone(dt.UTC)
        if (end - now).total_seconds() < SLACK_S:
            return None
        return end
