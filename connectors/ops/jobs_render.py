"""How ``zapstream jobs`` shows jobs and their events as text.

Pure functions from the rows of :mod:`connectors.ops.jobs_sql` to strings; the
caller prints them. Recipients only ever leave here masked
(:func:`connectors.outbox.recipients.mask_recipient`), and a job's text is never
read in the first place.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from connectors.ops.jobs_sql import Job, JobEvent, JobHistory, ListedJob
from connectors.outbox.recipients import mask_recipient

__all__ = [
    "cut",
    "events_table",
    "human_age",
    "job_history_json",
    "job_history_text",
    "job_summary",
    "jobs_json",
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


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(value: str) -> str:
    """One line without control characters: a value from the database or a gateway (an
    instance id, an error, a reason) with CR/LF or ESC/OSC sequences would forge output
    lines or drive the operator's terminal. Each control character becomes ``?``."""
    return _CONTROL.sub("?", " ".join(value.split()))


def cut(value: str | None, width: int) -> str:
    """On one line, at most ``width`` characters (ending in ``...`` when cut), or ``-``."""
    if not value:
        return "-"
    flat = printable(value)
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def masked(recipient: str | None) -> str:
    """The recipient masked, or ``-`` when the job has none."""
    return mask_recipient(recipient) if recipient else "-"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, no trailing spaces, no final newline."""
    body = [[printable(cell) for cell in r] for r in rows]
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
        f"{printable(job.instance_id)}, recipient {masked(job.recipient)}, "
        f"last error: {cut(job.last_error, _REASON_WIDTH)}"
    )


# --- JSON (``--json``) and one job's history (``jobs show``) -----------------------------


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat()


def _listed(job: ListedJob, now: dt.datetime) -> dict[str, Any]:
    return {
        "id": job.id,
        "instance_id": job.instance_id,
        "recipient": masked(job.recipient),
        "status": job.status,
        "attempts": job.attempts,
        "created_at": _iso(job.created_at),
        "age_s": max(0.0, (now - job.created_at).total_seconds()),
        "last_error": job.last_error,
        "updated_at": _iso(job.updated_at),
    }


def jobs_json(
    jobs: Iterable[ListedJob], *, now: dt.datetime, page: int, limit: int, total: int
) -> str:
    """``jobs list --json``: one object with the page, the count and the jobs (masked)."""
    return json.dumps(
        {
            "page": page,
            "pages": max(1, math.ceil(total / limit)),
            "total": total,
            "jobs": [_listed(job, now) for job in jobs],
        }
    )


def _event_json(event: JobEvent) -> dict[str, Any]:
    return {
        "version": event.version,
        "from": event.from_status,
        "to": event.to_status,
        "actor": event.actor,
        "reason": event.reason,
        "at": _iso(event.at),
        "outcome": event.outcome,
        "command_id": event.command_id,
    }


def job_history_json(history: JobHistory, *, now: dt.datetime) -> str:
    """``jobs show --json``: the job (recipient masked, never the text) and its whole history."""
    job = history.job
    answers = {e.command_id: e for e in history.events if e.command_id is not None}
    return json.dumps(
        {
            "job": {
                "id": job.id,
                "instance_id": job.instance_id,
                "recipient": masked(job.recipient),
                "conversation": masked(job.conversation_key),
                "type": job.payload_type,
                "status": job.status,
                "priority": job.priority,
                "purpose": job.purpose,
                "attempts": job.attempts,
                "max_attempts": job.max_attempts,
                "version": job.state_version,
                "gateway_job_id": job.gateway_job_id,
                "last_error": job.last_error,
                "created_at": _iso(job.created_at),
                "age_s": max(0.0, (now - job.created_at).total_seconds()),
                "updated_at": _iso(job.updated_at),
                "sent_at": _iso(job.sent_at),
                "expires_at": _iso(job.expires_at),
                "due_at": _iso(job.next_retry_at) if job.status == "SCHEDULED" else None,
            },
            "attempts": [
                {
                    "number": a.number,
                    "reference": a.reference(job.id),
                    "started_at": _iso(a.started_at),
                    "outcome": a.outcome,
                    "reason": a.reason,
                    "ended_at": _iso(a.ended_at),
                }
                for a in history.attempts
            ],
            "events": [_event_json(e) for e in history.events],
            "commands": [
                {
                    "id": c.id,
                    "command": c.command,
                    "actor": c.actor,
                    "reason": c.reason,
                    "requested_at": _iso(c.created_at),
                    "outcome": answers[c.id].outcome if c.id in answers else None,
                    "answered_at": _iso(answers[c.id].at) if c.id in answers else None,
                }
                for c in history.commands
            ],
            "restreams": [
                {"id": r.id, "actor": r.actor, "reason": r.reason, "at": _iso(r.created_at)}
                for r in history.replays
            ],
            "paused_by": [
                {"kind": k, "target": t, "actor": a, "reason": r, "since": _iso(at)}
                for k, t, a, r, at in history.paused_by
            ],
        }
    )


def job_history_text(history: JobHistory, *, now: dt.datetime) -> str:
    """``jobs show``: the job's fields, attempts, events, operator actions and pauses in force."""
    job = history.job
    fields = [
        ("status", f"{job.status} (version {job.state_version})"),
        ("instance", job.instance_id),
        ("recipient", masked(job.recipient)),
        ("conversation", masked(job.conversation_key)),
        ("message", f"{job.payload_type or '-'} (text not shown)"),
        ("priority", job.priority),
        ("purpose", job.purpose or "-"),
        ("attempts", f"{job.attempts} of {job.max_attempts} (this round)"),
        ("created", f"{when(job.created_at)} ({human_age(now - job.created_at)} ago)"),
        ("updated", when(job.updated_at)),
        ("sent", when(job.sent_at)),
        ("expires", when(job.expires_at)),
        ("due", when(job.next_retry_at) if job.status == "SCHEDULED" else "-"),
        ("gateway job id", job.gateway_job_id or "-"),
        ("last error", cut(job.last_error, 200)),
    ]
    width = max(len(name) for name, _ in fields) + 1
    lines = [f"job {job.id}"]
    lines += [f"  {(name + ':').ljust(width)} {printable(value)}" for name, value in fields]
    attempts = history.attempts
    lines += ["", f"attempts ({len(attempts)}):"]
    if attempts:
        rows = [
            [
                str(a.number),
                a.reference(job.id),
                when(a.started_at),
                a.outcome or "in progress",
                cut(a.reason, _REASON_WIDTH),
                when(a.ended_at),
            ]
            for a in attempts
        ]
        headers = ("#", "REFERENCE", "STARTED (UTC)", "OUTCOME", "REASON", "ENDED (UTC)")
        lines += _indented(table(headers, rows))
    else:
        lines.append("  none")
    lines += ["", f"history ({len(history.events)} events):"]
    lines += _indented(events_table(history.events)) if history.events else ["  none recorded"]
    answers = {e.command_id: e for e in history.events if e.command_id is not None}
    lines += ["", f"operator and application commands ({len(history.commands)}):"]
    if history.commands:
        rows = []
        for c in history.commands:
            answer = answers.get(c.id)
            rows.append(
                [
                    str(c.id),
                    c.command,
                    c.actor,
                    cut(c.reason, _ERROR_WIDTH),
                    when(c.created_at),
                    f"{answer.outcome} at {when(answer.at)}" if answer else "not answered yet",
                ]
            )
        headers = ("ID", "COMMAND", "BY", "REASON", "REQUESTED (UTC)", "ANSWER")
        lines += _indented(table(headers, rows))
    else:
        lines.append("  none")
    if history.replays:
        lines += ["", f"restreams ({len(history.replays)}):"]
        rows = [
            [str(r.id), r.actor, cut(r.reason, _ERROR_WIDTH), when(r.created_at)]
            for r in history.replays
        ]
        lines += _indented(table(("ID", "BY", "REASON", "AT (UTC)"), rows))
    if history.paused_by:
        lines += ["", "paused now:"]
        lines += [
            f"  {printable(f'{kind} {target} by {actor}')} since {when(at)}: "
            f"{cut(reason, _REASON_WIDTH)}"
            for kind, target, actor, reason, at in history.paused_by
        ]
    return "\n".join(lines)


def _indented(text: str) -> list[str]:
    return [f"  {line}" for line in text.splitlines()]
