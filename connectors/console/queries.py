"""The console's SQL: one query per page of jobs, bulk selections, the slots' lag.

Sync psycopg on a connection the caller opens (the web handlers run these in a
thread). Filters become SQL with parameters here and nowhere else, so the unit
tests can check the SQL a form produces without a database. The row types and a
job's story are :mod:`connectors.ops.jobs_sql`'s (``ListedJob``, ``fetch_history``,
the same as ``zapstream jobs show``); what ``jobs_sql.JobFilter`` lacks (priority,
purpose, search, the total in the same query) is added here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from connectors.ops.jobs_sql import ListedJob, count_jobs, matching_job_ids
from streams.kernel.contract import JobStatus

__all__ = [
    "BULK_CANCELLABLE",
    "ConsoleFilter",
    "PageOfJobs",
    "SlotLag",
    "count_matching",
    "fetch_page",
    "fetch_text",
    "matching_ids",
    "page_query",
    "slot_lags",
]

BULK_CANCELLABLE = frozenset({JobStatus.PENDING, JobStatus.RETRY_WAIT})
"""A bulk cancel only asks for jobs not handed to the gateway yet; the worker decides anyway."""


@dataclasses.dataclass(frozen=True, slots=True)
class ConsoleFilter:
    """The jobs the console's list (and a bulk action) means: every field optional.

    ``search`` is a job id (digits) or an exact idempotency key; ``since``/``until``
    bound the creation time, ``since`` inclusive.
    """

    statuses: Sequence[str] = ()
    instance: str | None = None
    priority: str | None = None
    purpose: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    search: str | None = None

    def where(self) -> tuple[sql.Composable, list[Any]]:
        """`` WHERE ...`` (or nothing) and its parameters, in order."""
        conditions: list[sql.Composable] = []
        params: list[Any] = []
        if self.statuses:
            conditions.append(sql.SQL("status = ANY(%s)"))
            params.append(list(self.statuses))
        for column, value in (
            ("instance_id", self.instance),
            ("priority", self.priority),
            ("purpose", self.purpose),
        ):
            if value is not None:
                conditions.append(sql.SQL("{} = %s").format(sql.Identifier(column)))
                params.append(value)
        if self.since is not None:
            conditions.append(sql.SQL("created_at >= %s"))
            params.append(self.since)
        if self.until is not None:
            conditions.append(sql.SQL("created_at < %s"))
            params.append(self.until)
        if self.search is not None:
            term = self.search.strip()
            if term.isdigit() and len(term) < 19:
                # A number may be a job id or a key made of digits.
                conditions.append(sql.SQL("(id = %s OR idempotency_key = %s)"))
                params.extend([int(term), term])
            else:
                conditions.append(sql.SQL("idempotency_key = %s"))
                params.append(term)
        if not conditions:
            return sql.SQL(""), params
        return sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions), params

    def with_statuses(self, allowed: frozenset[str]) -> ConsoleFilter:
        """The same filter narrowed to ``allowed`` statuses (for a bulk action)."""
        chosen = [s for s in self.statuses if s in allowed] if self.statuses else sorted(allowed)
        return dataclasses.replace(self, statuses=chosen or ["-none-"])


@dataclasses.dataclass(frozen=True, slots=True)
class PageOfJobs:
    """One page of jobs, newest first, the total that match, and the page asked for."""

    jobs: list[ListedJob]
    total: int
    page: int
    page_size: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.page_size))


_COLUMNS = (
    "j.id, j.instance_id, j.payload ->> 'to', j.status, j.attempts, j.created_at, "
    "j.last_error, j.updated_at"
)


def page_query(
    job_filter: ConsoleFilter, *, page: int, page_size: int
) -> tuple[sql.Composed, list[Any]]:
    """The one statement for a page: the count of all matches joined to the page's rows.

    The count comes from its own subquery, so a page past the end still says how
    many jobs match (the row has NULL job columns then).
    """
    if page < 1 or page_size < 1:
        raise ValueError("page and page size must be positive")
    where, params = job_filter.where()
    query = (
        sql.SQL("SELECT t.total, " + _COLUMNS + " FROM (SELECT count(*) AS total FROM outbox_jobs")
        + where
        + sql.SQL(") t LEFT JOIN LATERAL (SELECT * FROM outbox_jobs")
        + where
        + sql.SQL(" ORDER BY id DESC LIMIT %s OFFSET %s) j ON true ORDER BY j.id DESC")
    )
    return query, [*params, *params, page_size, (page - 1) * page_size]


def fetch_page(
    conn: psycopg.Connection[Any], job_filter: ConsoleFilter, *, page: int, page_size: int
) -> PageOfJobs:
    """Page ``page`` (from 1) of jobs matching ``job_filter``, newest first: one query."""
    query, params = page_query(job_filter, page=page, page_size=page_size)
    rows = conn.execute(query, params).fetchall()
    total = int(rows[0][0]) if rows else 0
    jobs = [ListedJob(*row[1:]) for row in rows if row[1] is not None]
    return PageOfJobs(jobs=jobs, total=total, page=page, page_size=page_size)


def count_matching(conn: psycopg.Connection[Any], job_filter: ConsoleFilter) -> int:
    """How many jobs match (a bulk action's preview)."""
    return count_jobs(conn, job_filter)


def matching_ids(
    conn: psycopg.Connection[Any], job_filter: ConsoleFilter, *, limit: int
) -> list[int]:
    """The ids of the first ``limit`` matching jobs, oldest first."""
    return matching_job_ids(conn, job_filter, limit=limit)


def fetch_text(conn: psycopg.Connection[Any], job_id: int) -> str | None:
    """The message's text (admins only: the caller checks the role before asking)."""
    row = conn.execute("SELECT payload ->> 'text' FROM outbox_jobs WHERE id = %s", (job_id,))
    found = row.fetchone()
    return None if found is None else found[0]


@dataclasses.dataclass(frozen=True, slots=True)
class SlotLag:
    """A logical replication slot and the WAL it holds back, in bytes."""

    slot: str
    active: bool
    lag_bytes: int | None


# The same measure as `zapstream doctor`'s slot check (connectors/ops/doctor.py), for
# every logical slot of the database rather than the relay's one.
_SLOT_LAGS = """
    SELECT slot_name, active,
           pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
    FROM pg_replication_slots WHERE slot_type = 'logical' AND database = current_database()
    ORDER BY slot_name
"""


def slot_lags(conn: psycopg.Connection[Any]) -> list[SlotLag]:
    """Every logical slot of this database with its lag in bytes."""
    return [
        SlotLag(str(name), bool(active), None if lag is None else int(lag))
        for name, active, lag in conn.execute(_SLOT_LAGS)
    ]
