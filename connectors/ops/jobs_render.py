"""How ``zapstream jobs`` shows jobs and their events as text.

Pure functions from the rows of :mod:`connectors.ops.jobs_sql` to strings; the
caller prints them. Recipients only ever leave here masked
(:func:`connectors.outbox.recipients.mask_recipient`), and a job's text is never
read in the first place.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence

from connectors.ops.jobs_sql import Job, JobEvent, ListedJob
from connectors.outbox.recipients import mask_recipient

__all__ = [
    "cut",
    "events_table",
    "human_age",
    "job_summary",
    "jobs_table",
    "masked",
    "page_footer",
    "table",
    "when",
]

_ERROR_WIDTH = 40
_REASON_WIDTH = 60
_JOB_HEADERS = (
    "ID",
    "INSTANCE",
    "RECIPIENT",
    "STATUS",
    "ATTEMPTS",
    "AGE",
    "LAST ERROR",
    "UPDATED (UTC)",
)
_EVENT_HEADERS = ("VERSION", "TRANSITION", "ACTOR", "REASON", "AT (UTC)")


def human_age(delta: dt.timedelta) -> str:
    """``42s``, ``3m12s``, ``2h05m``, ``3d04h``: two units at most."""
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def when(value: dt.datetime | None) -> str:
    """``2026-01-31 12:00:00Z`` in UTC, or ``-``."""
    if value is None:
        return "-"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def cut(value: str | None, width: int) -> str:
    """On one line, at most ``width`` characters (ending in ``...`` when cut), or ``-``."""
    if not value:
        return "-"
    flat = " ".join(value.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def masked(recipient: str | None) -> str:
    """The recipient masked, or ``-`` when the job has none."""
    return mask_recipient(recipient) if recipient else "-"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, no trailing spaces, no final newline."""
    body = [list(r) for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(headers)]
    lines = [headers, *body]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def jobs_table(jobs: Iterable[ListedJob], *, now: dt.datetime) -> str:
    """The ``jobs list`` table; ages are counted up to ``now``."""
    return table(
        _JOB_HEADERS,
        (
            [
                str(job.id),
                job.instance_id,
                masked(job.recipient),
                job.status,
                str(job.attempts),
                human_age(now - job.created_at),
                cut(job.last_error, _ERROR_WIDTH),
                when(job.updated_at),
            ]
            for job in jobs
        ),
    )


def page_footer(*, page: int, limit: int, total: int) -> str:
    """``page 2 of 3, 5 jobs``; an empty result is page 1 of 1."""
    pages = max(1, math.ceil(total / limit))
    return f"page {page} of {pages}, {total} jobs"


def events_table(events: Iterable[JobEvent]) -> str:
    """A job's events, one line each: version, transition, actor, reason, time."""
    return table(
        _EVENT_HEADERS,
        (
            [
                f"v{event.version}",
                f"{event.from_status or '-'} -> {event.to_status}",
                event.actor,
                cut(_with_outcome(event), _REASON_WIDTH),
                when(event.at),
            ]
            for event in events
        ),
    )


def _with_outcome(event: JobEvent) -> str | None:
    """The reason, led by the command's outcome when the event answers one."""
    if event.outcome is None:
        return event.reason
    return f"[{event.outcome}] {event.reason or ''}".rstrip()


def job_summary(job: Job) -> str:
    """One line on where a job stands, shown before it is reprocessed."""
    return (
        f"job {job.id}: {job.status} after {job.attempts} attempt(s), instance "
        f"{job.instance_id}, recipient {masked(job.recipient)}, "
        f"last error: {cut(job.last_error, _REASON_WIDTH)}"
    )
