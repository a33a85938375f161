"""The pipeline as PostgreSQL sees it: jobs per status and the oldest PENDING job per instance.

Shared by the state sink's gauges (:mod:`connectors.sink.pipeline_metrics`) and
``zapstream status`` (:mod:`connectors.ops.status`), so both report the same
numbers. Both queries read indexes, never the whole table:

- :func:`job_counts` counts each status on its own through
  ``outbox_jobs_status_idx`` (``status, updated_at``): an index-only range per
  status, so its cost is the number of jobs (every status, even at 0, comes back);
- :func:`pending_groups` reads the partial index on unsettled jobs
  (``outbox_jobs_unsettled_idx``, migration 0006), so its cost follows the
  backlog, not the table's history.

Only ids, statuses, purposes and counts leave here: never a recipient, a text or a key.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg
from psycopg import sql

from streams.kernel.contract import JobStatus

__all__ = ["STATUSES", "PendingGroup", "job_counts", "pending_groups"]

STATUSES: tuple[str, ...] = tuple(s.value for s in JobStatus)
"""Every status a job can have, in the state machine's order."""

# One count per status, each with the status as a literal: the planner then knows
# how many rows it holds and counts its range of outbox_jobs_status_idx with an
# index-only scan (with a parameter it guessed a third of the table and read the
# heap: 1.1 s instead of 0.35 s on 1M jobs).
_COUNTS = sql.SQL(" UNION ALL ").join(
    sql.SQL("SELECT {s}::text, count(*) FROM outbox_jobs WHERE status = {s}").format(
        s=sql.Literal(status)
    )
    for status in STATUSES
)

# status IN (...) repeats the partial index's predicate, so the planner may use it;
# status = 'PENDING' then narrows to the jobs not yet attempted. Ages on the
# database's clock, the one created_at was written with.
_PENDING = """
    SELECT instance_id, coalesce(purpose, ''), count(*),
           extract(epoch FROM now() - min(created_at))::double precision
    FROM outbox_jobs
    WHERE status IN ('PENDING', 'RETRY_WAIT', 'ATTEMPTING') AND status = 'PENDING'
    GROUP BY instance_id, coalesce(purpose, '')
"""


@dataclasses.dataclass(frozen=True, slots=True)
class PendingGroup:
    """The PENDING jobs of one instance and purpose (``''`` for jobs without one)."""

    instance_id: str
    purpose: str
    pending: int
    oldest_age_s: float


async def job_counts(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    """How many jobs are in each status; every status is present, 0 included."""
    cur = await conn.execute(_COUNTS)
    counts = {str(status): int(count) for status, count in await cur.fetchall()}
    return {status: counts.get(status, 0) for status in STATUSES}


async def pending_groups(conn: psycopg.AsyncConnection[Any]) -> list[PendingGroup]:
    """Each (instance, purpose) with PENDING jobs, oldest first."""
    cur = await conn.execute(_PENDING)
    groups = [
        PendingGroup(str(i), str(p), int(n), max(0.0, float(age)))
        for i, p, n, age in await cur.fetchall()
    ]
    return sorted(groups, key=lambda g: (-g.oldest_age_s, g.instance_id, g.purpose))
