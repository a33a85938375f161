"""``zapstream outbox prune``: old settled jobs become audit stubs, in batches.

What stays of a pruned job, and why (migration 0007 has the same list):

- its ``outbox_jobs`` row without the message: id, idempotency key, instance,
  status, attempts, timestamps, gateway job id and last error. The key keeps
  refusing a second enqueue of the same intent, and a redelivered intent still
  finds the job settled: pruning never lets a message be sent twice.
- its last state change (``to_status``, actor, reason, time); the earlier ones
  are deleted.
- its commands and replays (who cancelled or reprocessed it, and why), without
  their copies of the message.

The payload becomes ``{"type": ..., "pruned_at": ...}`` and the conversation key
(the recipient's digits) NULL, everywhere. A cancel or reprocess of a pruned job
is refused by the database.

Only jobs whose outcome is final and needs nobody are pruned: ACCEPTED,
DELIVERED, READ, FAILED, EXPIRED, CANCELLED, INVALID and OPTED_OUT, last changed before the
bound. DEAD, UNCERTAIN and REVIEW wait for an operator's decision and are
counted, never pruned; PENDING and in-flight jobs are not settled. The bound is
at least :data:`MIN_AGE`, the intents topic's retention, so no intent of a
pruned job can still be waiting in Kafka.

Each batch is one transaction (``FOR UPDATE SKIP LOCKED``: a job the state sink
is writing is left for the next run), so the command can run while the pipeline
runs, and stopping it midway leaves every job either whole or pruned.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import psycopg
from psycopg import sql

from streams.kernel.contract import JobStatus

MIN_AGE = dt.timedelta(days=7)
"""The intents topic's retention (``streams.kernel.contract.topic_specs``)."""

PRUNABLE = (
    JobStatus.ACCEPTED,
    JobStatus.DELIVERED,
    JobStatus.READ,
    JobStatus.FAILED,
    JobStatus.EXPIRED,
    JobStatus.CANCELLED,
    JobStatus.INVALID,
    JobStatus.OPTED_OUT,
)
UNRESOLVED = (JobStatus.DEAD, JobStatus.UNCERTAIN, JobStatus.REVIEW)
"""Settled, but an operator must decide: never pruned, counted in the result."""

_PRUNABLE_ROWS = """
    FROM outbox_jobs
    WHERE status = ANY(%(statuses)s) AND updated_at < %(before)s
      AND NOT payload ? 'pruned_at'
"""
_BATCH = "SELECT id" + _PRUNABLE_ROWS + "ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED"

_REDACT = sql.SQL("""
    UPDATE {table} SET
        payload = jsonb_build_object('type', payload -> 'type', 'pruned_at', %(now)s::text),
        conversation_key = NULL
    WHERE {column} = ANY(%(ids)s)
""")

_DELETE_EARLIER_EVENTS = """
    DELETE FROM outbox_job_events e
    WHERE e.job_id = ANY(%(ids)s)
      AND e.version < (SELECT max(version) FROM outbox_job_events l WHERE l.job_id = e.job_id)
"""


class RetentionError(ValueError):
    """The bound is shorter than :data:`MIN_AGE`; the message names the option."""


@dataclasses.dataclass(frozen=True, slots=True)
class PruneResult:
    """What :func:`prune` found and did."""

    jobs: int
    """Jobs pruned (on a dry run: that would be)."""
    events_deleted: int
    unresolved: dict[str, int]
    """DEAD, UNCERTAIN and REVIEW jobs older than the bound, kept for an operator."""


def prune(
    dsn: str,
    *,
    older_than: dt.timedelta,
    dry_run: bool = False,
    batch: int = 5000,
    now: dt.datetime | None = None,
) -> PruneResult:
    """Prune settled jobs last changed more than ``older_than`` ago (see the module)."""
    if older_than < MIN_AGE:
        raise RetentionError(
            f"--older-than must be at least {MIN_AGE.days}d (the intents topic's retention), "
            f"got {older_than}"
        )
    if batch < 1:
        raise RetentionError(f"--batch must be >= 1, got {batch}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        at = now or conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        before = at - older_than
        unresolved: dict[str, int] = dict(
            conn.execute(
                "SELECT status, count(*) FROM outbox_jobs"
                " WHERE status = ANY(%s) AND updated_at < %s GROUP BY status ORDER BY status",
                ([str(s) for s in UNRESOLVED], before),
            ).fetchall()
        )
        statuses = [str(s) for s in PRUNABLE]
        params = {"statuses": statuses, "before": before, "batch": batch, "now": at.isoformat()}
        if dry_run:
            row = conn.execute("SELECT count(*)" + _PRUNABLE_ROWS, params).fetchone()
            return PruneResult(row[0] if row else 0, 0, unresolved)
        jobs = events = 0
        while True:
            with conn.transaction():
                ids = [r[0] for r in conn.execute(_BATCH, params, prepare=False).fetchall()]
                if not ids:
                    break
                step = {**params, "ids": ids}
                events += conn.execute(_DELETE_EARLIER_EVENTS, step, prepare=False).rowcount
                for table, column in (
                    ("outbox_jobs", "id"),
                    ("outbox_commands", "job_id"),
                    ("outbox_replays", "job_id"),
                ):
                    target = {"table": sql.Identifier(table), "column": sql.Identifier(column)}
                    conn.execute(_REDACT.format(**target), step, prepare=False)
                jobs += len(ids)
        return PruneResult(jobs, events, unresolved)
