"""The one way operators write a duration or a point in time, for every command and the console.

A duration is one or more ``<number><unit>`` parts with no space between them:
``90s``, ``15m``, ``1h30m``, ``1.5h``, ``2d``, ``1w``, ``1d12h``. Units are
``s``, ``m``, ``h``, ``d``, ``w`` (case does not matter); a number may have a
fraction. ``zapstream jobs`` (``--last``, ``--since``), ``outbox restream`` and
``outbox prune`` (``--older-than``) and the console's period filter all parse
with :func:`parse_duration`, so what one accepts the others accept.

An instant is an ISO 8601 date or date-time (:func:`parse_instant`); without an
offset it is UTC. :func:`parse_since` takes either: a duration back from now, or
an instant.
"""

from __future__ import annotations

import datetime as dt
import re

__all__ = ["DURATION_EXAMPLES", "format_duration", "parse_duration", "parse_instant", "parse_since"]

DURATION_EXAMPLES = "90s, 10m, 1h30m, 1.5h, 2d, 1w"
"""Shown in every error about a duration, so the fix is in the message."""

_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])", re.ASCII)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> dt.timedelta:
    """``90s``, ``15m``, ``1h30m``, ``1.5h``, ``2d``, ``1w`` as a timedelta, else ValueError."""
    compact = text.strip().lower()
    parts = _PART.findall(compact)
    # Every character must belong to a part: "1h 30m", "10", "-5m" and "h1" are refused
    # rather than read as something the operator did not write.
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(f"not a duration: {text!r} (e.g. {DURATION_EXAMPLES})")
    try:
        return dt.timedelta(seconds=sum(float(n) * _UNIT_S[u] for n, u in parts))
    except OverflowError:
        raise ValueError(
            f"not a duration: {text!r} is too long (e.g. {DURATION_EXAMPLES})"
        ) from None


def format_duration(value: dt.timedelta) -> str:
    """A duration the way :func:`parse_duration` reads it: ``7d``, ``1d12h``, ``90s``, ``0s``."""
    seconds = int(value.total_seconds())
    if seconds <= 0:
        return "0s"
    parts = []
    for unit in ("d", "h", "m", "s"):
        count, seconds = divmod(seconds, _UNIT_S[unit])
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def parse_instant(text: str) -> dt.datetime:
    """An ISO 8601 date or date-time; without an offset it is taken as UTC."""
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"not an ISO 8601 date-time: {text!r}") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def parse_since(text: str, *, now: dt.datetime | None = None) -> dt.datetime:
    """A duration back from now (``2h``, ``90m``) or an ISO 8601 date-time."""
    try:
        delta = parse_duration(text)
    except ValueError:
        try:
            return parse_instant(text)
        except ValueError:
            raise ValueError(
                f"not a duration or an ISO 8601 date-time: {text!r} "
                f"(e.g. 2h, 1.5d, 2026-01-31T12:00)"
            ) from None
    return (now or dt.datetime.now(dt.UTC)) - delta
