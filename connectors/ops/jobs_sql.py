"""The queries behind ``zapstream jobs``, and the rows they return.

Every function takes an open psycopg connection and returns typed rows; none
prints or knows about the command line (:mod:`connectors.ops.jobs_cli` does
that, :mod:`connectors.ops.jobs_render` turns the rows into text). Commands
themselves are written by :mod:`connectors.outbox.commands`; the worker's answer
to one is the event carrying its ``command_id`` (migration 0004).
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
    "JobFilter",
    "JobPage",
    "ListedJob",
    "count_jobs",
    "database_now",
    "fetch_events",
    "fetch_job",
    "fetch_job_page",
    "matching_job_ids",
    "poll_events",
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
    outcome: str | None = None
    """How the worker answered a command (:class:`streams.contract.CommandOutcome`), or None."""
    command_id: int | None = None
    """The ``outbox_commands`` row this event answers, or None."""

    @property
    def is_note(self) -> bool:
        """A same-status event: it records something (a command's answer) without a move."""
        return self.from_status == self.to_status


@dataclasses.dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs ``jobs list`` and a bulk ``jobs reprocess`` mean.

    ``statuses`` are status values (``"DEAD"``); ``since``/``until`` bound the
    jobs' creation time, ``since`` inclusive. An empty filter matches every job.
    """

    statuses: Sequence[str] = ()
    instance: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None

    def where(self) -> tuple[sql.Composable, list[Any]]:
        """`` WHERE ...`` (or nothing) and its parameters."""
        conditions: list[sql.Composable] = []
        params: list[Any] = []
        if self.statuses:
            conditions.append(sql.SQL("status = ANY(%s)"))
            params.append(list(self.statuses))
        if self.instance is not None:
            conditions.append(sql.SQL("instance_id = %s"))
            params.append(self.instance)
        if self.since is not None:
            conditions.append(sql.SQL("created_at >= %s"))
            params.append(self.since)
        if self.until is not None:
            conditions.append(sql.SQL("created_at < %s"))
            params.append(self.until)
        if not conditions:
            return sql.SQL(""), params
        return sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions), params


# payload ->> 'to' is NULL for a payload that is not an object: no error, no text.
_JOB = """
    SELECT id, instance_id, payload ->> 'to', status, attempts, last_error, expires_at
    FROM outbox_jobs WHERE id = %s
"""
# A job's events in the order they happened: by version, the worker's own count
# (ids follow the order the sink inserted them in, which a replay may change).
_HISTORY = """
    SELECT id, version, from_status, to_status, actor, reason, at, outcome, command_id
    FROM outbox_job_events WHERE job_id = %s
    ORDER BY version, id
"""


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
    where, params = JobFilter(statuses, instance, since, until).where()
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


def count_jobs(conn: psycopg.Connection[Any], job_filter: JobFilter) -> int:
    """How many jobs match ``job_filter``."""
    where, params = job_filter.where()
    row = conn.execute(sql.SQL("SELECT count(*) FROM outbox_jobs") + where, params).fetchone()
    return int(row[0]) if row is not None else 0


def matching_job_ids(
    conn: psycopg.Connection[Any], job_filter: JobFilter, *, limit: int
) -> list[int]:
    """The ids of the first ``limit`` jobs that match, oldest first."""
    where, params = job_filter.where()
    query = sql.SQL("SELECT id FROM outbox_jobs") + where + sql.SQL(" ORDER BY id LIMIT %s")
    return [int(r[0]) for r in conn.execute(query, [*params, limit])]


def fetch_events(conn: psycopg.Connection[Any], job_id: int) -> list[JobEvent]:
    """The job's whole history, in version order."""
    return [JobEvent(*r) for r in conn.execute(_HISTORY, (job_id,))]


def poll_events(
    conn: psycopg.Connection[Any],
    job_id: int,
    *,
    wait_s: float,
    poll_interval_s: float,
    settled: Callable[[list[JobEvent]], bool],
) -> list[JobEvent]:
    """The job's history, polled until ``settled`` says so or ``wait_s`` passed."""
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        events = fetch_events(conn, job_id)
        remaining = deadline - time.monotonic()
        if settled(events) or remaining <= 0:
            return events
        time.sleep(min(poll_interval_s, remaining))
