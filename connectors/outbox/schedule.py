"""Reschedule a job not released yet: the application's API beside ``enqueue(send_at=...)``.

::

    with psycopg.connect(dsn) as conn, conn.transaction():
        reschedule(conn, job_id, send_at=dt.datetime(2026, 3, 9, 10, tzinfo=SAO_PAULO))

A scheduled job waits ``SCHEDULED`` in ``outbox_jobs`` until its ``next_retry_at``
(migration 0008); until the relay releases it, moving it is one UPDATE of that
column, which this module makes (in the caller's transaction, never committing).
A job already released (PENDING and on), cancelled, or never scheduled is refused
with :class:`NotRescheduled` naming its status, and nothing is written; the
caller's transaction stays usable (the refusal is decided in Python, not raised
by PostgreSQL). The SQL equivalent is ``SELECT zapstream_reschedule(id, time)``,
or ``UPDATE outbox_jobs SET next_retry_at = ... WHERE id = ... AND status = 'SCHEDULED'``.

A time in the past releases the job at the relay's next release tick.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg

from connectors.outbox.rules import RuleViolation, check_send_at
from streams.kernel.contract import JobStatus

RELEASE_ACTOR = "scheduler"
"""The ``outbox_replays.actor`` of a scheduled job's release (connectors.cdc.scheduled_release)."""


class NotRescheduled(ValueError):
    """The job cannot be rescheduled (unknown, already released, or the time is invalid)."""


_UPDATE = """
    UPDATE outbox_jobs SET next_retry_at = %(send_at)s, updated_at = now()
    WHERE id = %(job_id)s AND status = 'SCHEDULED'
      AND (expires_at IS NULL OR expires_at > %(send_at)s)
    RETURNING id
"""
_STATE = "SELECT status, expires_at FROM outbox_jobs WHERE id = %(job_id)s"


def _params(job_id: int, send_at: dt.datetime) -> dict[str, Any]:
    try:
        checked = check_send_at(send_at)
    except RuleViolation as exc:
        raise NotRescheduled(str(exc)) from exc
    if checked is None:
        raise NotRescheduled("send_at is required")
    return {"job_id": job_id, "send_at": checked}


def _refusal(job_id: int, state: tuple[Any, ...] | None, send_at: dt.datetime) -> NotRescheduled:
    if state is None:
        return NotRescheduled(f"no outbox job with id {job_id}")
    status, expires_at = state
    if status != JobStatus.SCHEDULED:
        return NotRescheduled(
            f"job {job_id} is {status}, not SCHEDULED: only a job not released yet can be "
            "rescheduled (cancel it and enqueue a new one)"
        )
    return NotRescheduled(
        f"job {job_id} expires at {expires_at.isoformat()}: send_at {send_at.isoformat()} "
        "is not before it"
    )


def reschedule(conn: psycopg.Connection[Any], job_id: int, send_at: dt.datetime) -> dt.datetime:
    """Move SCHEDULED job ``job_id`` to ``send_at`` (timezone-aware); return the new time."""
    params = _params(job_id, send_at)
    with conn.cursor() as cur:
        cur.execute(_UPDATE, params, prepare=False)
        if cur.fetchone() is not None:
            return send_at
        cur.execute(_STATE, params, prepare=False)
        raise _refusal(job_id, cur.fetchone(), send_at)


async def reschedule_async(
    conn: psycopg.AsyncConnection[Any], job_id: int, send_at: dt.datetime
) -> dt.datetime:
    """The async flavour of :func:`reschedule`."""
    params = _params(job_id, send_at)
    async with conn.cursor() as cur:
        await cur.execute(_UPDATE, params, prepare=False)
        if await cur.fetchone() is not None:
            return send_at
        await cur.execute(_STATE, params, prepare=False)
        raise _refusal(job_id, await cur.fetchone(), send_at)
