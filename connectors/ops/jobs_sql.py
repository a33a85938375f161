"""The queries behind ``zapstream jobs``, and the rows they return.

Every function takes an open psycopg connection and returns typed rows; none
prints or knows about the command line (:mod:`connectors.ops.jobs_cli` does
that, :mod:`connectors.ops.jobs_render` turns the rows into text). Commands
themselves are written by :mod:`connectors.outbox.commands`; this module only
wraps their insert so that the events written after it can be told apart.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql

__all__ = [
    "Job",
    "JobEvent",
    "JobPage",
    "ListedJob",
    "database_now",
    "fetch_events",
    "fetch_job",
    "fetch_job_page",
    "poll_events",
    "request_command",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    """One job as ``jobs cancel|reprocess`` see it; ``recipient`` is unmasked, never print it."""

    id: int
    instance_id: str
    recipient: str | None
    status: str
    attempts: int
    last_error: str | None
    expires_at: dt.datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class ListedJob:
    """One row of ``jobs list``; ``recipient`` is unmasked, never print it."""

    id: int
    instance_id: str
    recipient: str | None
    status: str
    attempts: int
    created_at: dt.datetime
    last_error: str | None
    updated_at: dt.datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class JobPage:
    """One page of jobs, newest first, and how many jobs match in all."""

    jobs: list[ListedJob]
    total: int


@dataclasses.dataclass(frozen=True, slots=True)
class JobEvent:
    """One row of ``outbox_job_events``: a transition, or a note when the status is unchanged."""

    id: int
    version: int
    from_status: str | None
    to_status: str
    actor: str
    reason: str | None
    at: dt.datetime

    @property
    def is_note(self) -> bool:
        """A same-status event: the worker's note that it did not apply a command."""
        return self.from_status == self.to_status


# payload ->> 'to' is NULL for a payload that is not an object: no error, no text.
_JOB = """
    SELECT id, instance_id, payload ->> 'to', status, attempts, last_error, expires_at
    FROM outbox_jobs WHERE id = %s
"""
_EVENTS_AFTER = """
    SELECT id, version, from_status, to_status, actor, reason, at
    FROM outbox_job_events WHERE job_id = %s AND id > %s
    ORDER BY id
"""
_HISTORY = """
    SELECT id, version, from_status, to_status, actor, reason, at
    FROM outbox_job_events WHERE job_id = %s
    ORDER BY version, id
"""
_LAST_EVENT_ID = "SELECT coalesce(max(id), 0) FROM outbox_job_events WHERE job_id = %s"


def database_now(conn: psycopg.Connection[Any]) -> dt.datetime:
    """The database's clock, the one ``created_at`` was written with."""
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    value: dt.datetime = row[0]
    return value


def fetch_job_page(
    conn: psycopg.Connection[Any],
    *,
    statuses: Sequence[str] = (),
    instance: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    limit: int,
    page: int,
) -> JobPage:
    """Page ``page`` (from 1) of ``limit`` jobs, newest first, with the count of all that match.

    ``statuses`` are status values (``"DEAD"``); ``since``/``until`` bound the
    jobs' creation time, ``since`` inclusive.
    """
    conditions: list[sql.Composable] = []
    params: list[Any] = []
    if statuses:
        conditions.append(sql.SQL("status = ANY(%s)"))
        params.append(list(statuses))
    if instance is not None:
        conditions.append(sql.SQL("instance_id = %s"))
        params.append(instance)
    if since is not None:
        conditions.append(sql.SQL("created_at >= %s"))
        params.append(since)
    if until is not None:
        conditions.append(sql.SQL("created_at < %s"))
        params.append(until)
    where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("")
    count_query = sql.SQL("SELECT count(*) FROM outbox_jobs") + where
    page_query = (
        sql.SQL(
            "SELECT id, instance_id, payload ->> 'to', status, attempts, created_at, "
            "last_error, updated_at FROM outbox_jobs"
        )
        + where
        + sql.SQL(" ORDER BY id DESC LIMIT %s OFFSET %s")
    )
    count_row = conn.execute(count_query, params).fetchone()
    total = int(count_row[0]) if count_row is not None else 0
    rows = conn.execute(page_query, [*params, limit, (page - 1) * limit]).fetchall()
    return JobPage(jobs=[ListedJob(*r) for r in rows], total=total)


def fetch_job(conn: psycopg.Connection[Any], job_id: int) -> Job | None:
    """The job with this id, or None."""
    row = conn.execute(_JOB, (job_id,)).fetchone()
    return Job(*row) if row is not None else None


def fetch_events(
    conn: psycopg.Connection[Any], job_id: int, *, after_id: int | None
) -> list[JobEvent]:
    """The job's events after event ``after_id`` in insertion order, or (None) its whole history."""
    if after_id is None:
        return [JobEvent(*r) for r in conn.execute(_HISTORY, (job_id,))]
    return [JobEvent(*r) for r in conn.execute(_EVENTS_AFTER, (job_id, after_id))]


def request_command(
    conn: psycopg.Connection[Any],
    job_id: int,
    insert: Callable[[psycopg.Connection[Any]], int],
) -> tuple[int, int]:
    """Write the command in its own transaction; return (command id, last event id before it).

    Events written after the command have higher ids than the one read here, in
    the database's own order, so the worker's clock never matters.
    """
    with conn.transaction():
        row = conn.execute(_LAST_EVENT_ID, (job_id,)).fetchone()
        baseline = int(row[0]) if row is not None else 0
        command_id = insert(conn)
    return command_id, baseline


def poll_events(
    conn: psycopg.Connection[Any],
    job_id: int,
    after_id: int,
    *,
    wait_s: float,
    poll_interval_s: float,
    settled: Callable[[list[JobEvent]], bool],
) -> list[JobEvent]:
    """Events of the job after ``after_id``, polled until ``settled`` or ``wait_s`` passed."""
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        events = fetch_events(conn, job_id, after_id=after_id)
        remaining = deadline - time.monotonic()
        if settled(events) or remaining <= 0:
            return events
        time.sleep(min(poll_interval_s, remaining))
