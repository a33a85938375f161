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

from connectors.ops.job_filter import JobFilter

__all__ = [
    "Attempt",
    "Job",
    "JobCommand",
    "JobDetail",
    "JobEvent",
    "JobHistory",
    "JobReplay",
    "ListedJob",
    "PageOfJobs",
    "attempts_of",
    "count_jobs",
    "database_now",
    "fetch_events",
    "fetch_events_of",
    "fetch_history",
    "fetch_job",
    "fetch_page",
    "fetch_statuses",
    "matching_job_ids",
    "page_query",
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
class PageOfJobs:
    """One page of jobs, newest first, how many jobs match in all, and the page asked for."""

    jobs: list[ListedJob]
    total: int
    page: int
    page_size: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.page_size))


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
    """How the worker answered a command (a ``CommandOutcome``), or None."""
    command_id: int | None = None
    """The ``outbox_commands`` row this event answers, or None."""

    @property
    def is_note(self) -> bool:
        """A same-status event: it records something (a command's answer) without a move."""
        return self.from_status == self.to_status


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


_LISTED = (
    "j.id, j.instance_id, j.payload ->> 'to', j.status, j.attempts, j.created_at, "
    "j.last_error, j.updated_at"
)


def page_query(
    job_filter: JobFilter, *, page: int, page_size: int
) -> tuple[sql.Composed, list[Any]]:
    """The one statement for a page: the count of all matches joined to the page's rows.

    The count comes from its own subquery, so a page past the end still says how
    many jobs match (the row has NULL job columns then).
    """
    if page < 1 or page_size < 1:
        raise ValueError("page and page size must be positive")
    where, params = job_filter.where()
    query = (
        sql.SQL("SELECT t.total, " + _LISTED + " FROM (SELECT count(*) AS total FROM outbox_jobs")
        + where
        + sql.SQL(") t LEFT JOIN LATERAL (SELECT * FROM outbox_jobs")
        + where
        + sql.SQL(" ORDER BY id DESC LIMIT %s OFFSET %s) j ON true ORDER BY j.id DESC")
    )
    return query, [*params, *params, page_size, (page - 1) * page_size]


def fetch_page(
    conn: psycopg.Connection[Any], job_filter: JobFilter, *, page: int, page_size: int
) -> PageOfJobs:
    """Page ``page`` (from 1) of jobs matching ``job_filter``, newest first: one query."""
    query, params = page_query(job_filter, page=page, page_size=page_size)
    rows = conn.execute(query, params).fetchall()
    total = int(rows[0][0]) if rows else 0
    jobs = [ListedJob(*row[1:]) for row in rows if row[1] is not None]
    return PageOfJobs(jobs=jobs, total=total, page=page, page_size=page_size)


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


_HISTORIES = """
    SELECT job_id, id, version, from_status, to_status, actor, reason, at, outcome, command_id
    FROM outbox_job_events WHERE job_id = ANY(%s)
    ORDER BY job_id, version, id
"""


def fetch_events_of(
    conn: psycopg.Connection[Any], job_ids: Sequence[int]
) -> dict[int, list[JobEvent]]:
    """The histories of several jobs in one query (a bulk action's plan), in version order."""
    histories: dict[int, list[JobEvent]] = {job_id: [] for job_id in job_ids}
    for job_id, *row in conn.execute(_HISTORIES, (list(job_ids),)):
        histories[int(job_id)].append(JobEvent(*row))
    return histories


def fetch_statuses(conn: psycopg.Connection[Any], job_ids: Sequence[int]) -> dict[int, str]:
    """The current status of each of ``job_ids`` that exists."""
    rows = conn.execute("SELECT id, status FROM outbox_jobs WHERE id = ANY(%s)", (list(job_ids),))
    return {int(job_id): str(status) for job_id, status in rows}


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


# --- one job's whole story (``jobs show``) ---------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class JobDetail:
    """Every column of a job an operator may see; ``recipient`` and ``conversation_key`` are
    unmasked (never print them as they are), and the text is never read."""

    id: int
    instance_id: str
    recipient: str | None
    conversation_key: str | None
    payload_type: str | None
    status: str
    priority: str
    purpose: str | None
    attempts: int
    max_attempts: int
    state_version: int
    gateway_job_id: str | None
    last_error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    sent_at: dt.datetime | None
    expires_at: dt.datetime | None
    next_retry_at: dt.datetime | None = None
    """A SCHEDULED job's due time (``send_at``, or the end of quiet hours)."""


@dataclasses.dataclass(frozen=True, slots=True)
class JobCommand:
    """A cancel or reprocess asked for the job (``outbox_commands``), with who and why."""

    id: int
    command: str
    actor: str
    reason: str
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class JobReplay:
    """A restream of the job (``outbox_replays``, ``zapstream outbox restream``)."""

    id: int
    actor: str
    reason: str
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """One gateway attempt, derived from the events: a move into ATTEMPTING and what followed."""

    number: int
    """Counts every attempt ever made, across reprocessing, like the worker's attempt ids."""
    started_at: dt.datetime
    outcome: str | None
    """The status the attempt ended in; None while it is still in progress."""
    reason: str | None
    ended_at: dt.datetime | None

    def reference(self, job_id: int) -> str:
        """The attempt id the gateway saw (``Idempotency-Key``, reference): ``<job>-<n>``."""
        return f"{job_id}-{self.number}"


@dataclasses.dataclass(frozen=True, slots=True)
class JobHistory:
    """What ``jobs show`` prints: the job, its events, commands, restreams and active pauses."""

    job: JobDetail
    events: list[JobEvent]
    commands: list[JobCommand]
    replays: list[JobReplay]
    paused_by: list[tuple[str, str, str, str, dt.datetime]]
    """Pauses in force on the job's instance or campaign: (kind, target, actor, reason, since)."""

    @property
    def attempts(self) -> list[Attempt]:
        return attempts_of(self.events)


_DETAIL = """
    SELECT id, instance_id, payload ->> 'to', conversation_key, payload ->> 'type', status,
           priority, purpose, attempts, max_attempts, state_version, gateway_job_id,
           last_error, created_at, updated_at, sent_at, expires_at, next_retry_at
    FROM outbox_jobs
"""
_COMMANDS = """
    SELECT id, command, actor, reason, created_at FROM outbox_commands
    WHERE job_id = %s ORDER BY created_at, id
"""
_REPLAYS = """
    SELECT id, actor, reason, created_at FROM outbox_replays
    WHERE job_id = %s ORDER BY created_at, id
"""
_PAUSED_FOR = """
    SELECT kind, target, actor, reason, at FROM zapstream_controls
    WHERE paused AND ((kind = 'instance' AND target = %s) OR (kind = 'campaign' AND target = %s))
    ORDER BY kind, target
"""


def attempts_of(events: Sequence[JobEvent]) -> list[Attempt]:
    """The job's attempts from its events, in order.

    An attempt starts with a move into ATTEMPTING from another status (an
    ATTEMPTING -> ATTEMPTING event is a note on the attempt in progress, such as
    a reconciliation that will ask again) and ends with the next move out of it.
    """
    attempts: list[Attempt] = []
    open_at: dt.datetime | None = None
    for event in events:
        if event.to_status == "ATTEMPTING" and event.from_status != "ATTEMPTING":
            open_at = event.at
            attempts.append(Attempt(len(attempts) + 1, event.at, None, None, None))
        elif open_at is not None and event.to_status != "ATTEMPTING":
            last = attempts[-1]
            attempts[-1] = dataclasses.replace(
                last, outcome=event.to_status, reason=event.reason, ended_at=event.at
            )
            open_at = None
    return attempts


def fetch_history(
    conn: psycopg.Connection[Any], *, job_id: int | None = None, key: str | None = None
) -> JobHistory | None:
    """The job with this id (or idempotency key) and everything that happened to it, or None."""
    if (job_id is None) == (key is None):
        raise ValueError("give a job id or an idempotency key")
    if job_id is not None:
        row = conn.execute(_DETAIL + " WHERE id = %s", (job_id,)).fetchone()
    else:
        row = conn.execute(_DETAIL + " WHERE idempotency_key = %s", (key,)).fetchone()
    if row is None:
        return None
    job = JobDetail(*row)
    return JobHistory(
        job=job,
        events=fetch_events(conn, job.id),
        commands=[JobCommand(*r) for r in conn.execute(_COMMANDS, (job.id,))],
        replays=[JobReplay(*r) for r in conn.execute(_REPLAYS, (job.id,))],
        paused_by=[
            (str(k), str(t), str(a), str(r), at)
            for k, t, a, r, at in conn.execute(_PAUSED_FOR, (job.instance_id, job.purpose))
        ],
    )
