"""``zapstream outbox restream``: re-publish PENDING jobs the relay never streamed.

A row committed while no replication slot existed is never decoded: before
the slot was first created, or while an operator had dropped it (the relay
recreates a missing slot, at the current WAL position). The relay restreams
such a gap by itself (:mod:`connectors.cdc.slot_gap`, with the same SQL function);
this command is for what it cannot see: a schema before migration 0011, a slot
recreated by hand under the same name while no relay ran, or an operator's own
judgement. :func:`restream` copies every PENDING job older than a bound into
``outbox_replays`` (migration 0005), in job id order and in one transaction
(``zapstream_restream_pending``, migration 0011); the publication covers that
table, so the relay streams each copy as the job's own ``IntentCaptured`` (see
:func:`~connectors.cdc.outbox_rows.replay_row_to_record`).

Why this design: the relay stays the only writer to Kafka and the replays go
through the same decoding, validation and ack tracking as every row; within a
conversation the replays keep job id (commit) order. A job that did reach
Kafka but whose state the sink has not written yet is PENDING too: its replay
is dropped by the worker, which keeps every job it handled in its ``jobs``
table (settled jobs are skipped, an in-flight attempt is reconciled, never
resent blindly). Choose ``--older-than`` well above the pipeline's normal
commit-to-state latency anyway.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import psycopg

_SELECT = """
    FROM outbox_jobs j
    WHERE j.status = 'PENDING' AND j.created_at < now() - %(age)s
"""


@dataclasses.dataclass(frozen=True, slots=True)
class RestreamResult:
    """What :func:`restream` found and did."""

    pending: int
    """PENDING jobs older than the bound."""
    replayed: int
    """Rows written to ``outbox_replays`` (0 on a dry run)."""
    first_job_id: int | None
    last_job_id: int | None


def restream(
    dsn: str,
    *,
    older_than: dt.timedelta,
    reason: str = "restream: PENDING and never streamed",
    actor: str = "operator",
    dry_run: bool = False,
    limit: int | None = None,
) -> RestreamResult:
    """Copy PENDING jobs created before ``now() - older_than`` into ``outbox_replays``."""
    params: dict[str, object] = {"age": older_than, "reason": reason, "actor": actor}
    limit_sql = ""
    if limit is not None:
        limit_sql = " LIMIT %(limit)s"
        params["limit"] = limit
    with psycopg.connect(dsn) as conn, conn.transaction():
        if not dry_run:
            row = conn.execute(
                "SELECT replayed, first_job_id, last_job_id FROM zapstream_restream_pending("
                "now() - %(age)s, %(reason)s, %(actor)s, %(limit)s)",
                {**params, "limit": limit},
            ).fetchone()
            assert row is not None
            replayed = int(row[0])
            return RestreamResult(replayed, replayed, row[1], row[2])
        ids = [
            int(job_id)
            for (job_id,) in conn.execute(
                f"SELECT j.id {_SELECT} ORDER BY j.id{limit_sql} FOR UPDATE SKIP LOCKED", params
            )
        ]
        return RestreamResult(len(ids), 0, ids[0] if ids else None, ids[-1] if ids else None)
