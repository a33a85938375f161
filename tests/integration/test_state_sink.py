"""The state sink's write-back on a real PostgreSQL: never backwards, replays harmless."""

from __future__ import annotations

import psycopg
import pytest

from connectors.outbox.enqueue import enqueue
from connectors.sink.state_sink import Applied, apply_batch, apply_states
from streams.kernel.contract import CommandOutcome, JobStatus
from streams.kernel.state_machine import JobRef, transition

pytestmark = pytest.mark.integration


async def test_states_apply_in_version_order_whatever_the_arrival_order(outbox_db: str) -> None:
    with psycopg.connect(outbox_db) as conn:
        job_id = enqueue(
            conn, instance_id="i", to="5511987654321", text="t", idempotency_key="sink-1"
        )
    ref = JobRef(job_id, "sink-1", "i", "5511987654321")
    attempting = transition(ref, None, JobStatus.ATTEMPTING, attempts=1, attempt_seq=1)
    accepted = transition(ref, attempting, JobStatus.ACCEPTED, gateway_job_id="g-9")
    delivered = transition(ref, accepted, JobStatus.DELIVERED)
    read = transition(ref, delivered, JobStatus.READ)
    async with await psycopg.AsyncConnection.connect(outbox_db, autocommit=True) as conn:
        assert await apply_states(conn, [read]) == 1
        # Late and replayed records move nothing backwards.
        assert await apply_states(conn, [attempting, accepted, delivered, read]) == 0
        row = await (
            await conn.execute(
                "SELECT status, state_version, gateway_job_id, attempts "
                "FROM outbox_jobs WHERE id = %s",
                (job_id,),
            )
        ).fetchone()
        events = await (
            await conn.execute(
                "SELECT version, from_status, to_status FROM outbox_job_events "
                "WHERE job_id = %s ORDER BY version",
                (job_id,),
            )
        ).fetchall()
    assert row == ("READ", 4, "g-9", 1)
    assert events == [
        (1, "PENDING", "ATTEMPTING"),
        (2, "ATTEMPTING", "ACCEPTED"),
        (3, "ACCEPTED", "DELIVERED"),
        (4, "DELIVERED", "READ"),
    ]


async def test_state_for_an_unknown_job_is_ignored_not_fatal(outbox_db: str) -> None:
    ref = JobRef(999_999, "ghost", "i", "c")
    async with await psycopg.AsyncConnection.connect(outbox_db, autocommit=True) as conn:
        assert await apply_states(conn, [transition(ref, None, JobStatus.ATTEMPTING)]) == 0


async def test_events_of_a_batch_are_inserted_in_version_order_with_their_outcome(
    outbox_db: str,
) -> None:
    with psycopg.connect(outbox_db) as conn:
        job_id = enqueue(
            conn, instance_id="i", to="5511987654321", text="t", idempotency_key="sink-order"
        )
    ref = JobRef(job_id, "sink-order", "i", "5511987654321")
    attempting = transition(ref, None, JobStatus.ATTEMPTING, attempts=1, attempt_seq=1)
    dead = transition(ref, attempting, JobStatus.DEAD, reason="gave up")
    reprocessed = transition(
        ref,
        dead,
        JobStatus.DEAD,
        actor="ops:ana",
        reason="reprocess requested: outage over",
        outcome=CommandOutcome.REPROCESSED,
        command_id=41,
    )
    again = transition(ref, reprocessed, JobStatus.ATTEMPTING, attempts=1, attempt_seq=2)
    accepted = transition(ref, again, JobStatus.ACCEPTED, gateway_job_id="g-1")
    async with await psycopg.AsyncConnection.connect(outbox_db, autocommit=True) as conn:
        # A batch in reverse order (as a rebalance or a replay may hand it over).
        await apply_states(conn, [accepted, again, reprocessed, dead, attempting])
        events = await (
            await conn.execute(
                "SELECT version, to_status, outcome, command_id FROM outbox_job_events "
                "WHERE job_id = %s ORDER BY id",
                (job_id,),
            )
        ).fetchall()
    assert events == [
        (1, "ATTEMPTING", None, None),
        (2, "DEAD", None, None),
        (3, "DEAD", "reprocessed", 41),
        (4, "ATTEMPTING", None, None),
        (5, "ACCEPTED", None, None),
    ]


async def test_a_rejection_makes_a_pending_job_invalid_once_and_never_overwrites(
    outbox_db: str,
) -> None:
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        bad = enqueue(conn, instance_id="i", to="5511987654321", text="t", idempotency_key="bad-1")
        sent = enqueue(conn, instance_id="i", to="5511987654321", text="t", idempotency_key="ok-1")
    ref = JobRef(sent, "ok-1", "i", "5511987654321")
    attempting = transition(ref, None, JobStatus.ATTEMPTING, attempts=1, attempt_seq=1)
    accepted = transition(ref, attempting, JobStatus.ACCEPTED, gateway_job_id="g-2")
    reason = "payload is a JSON list, not an object"
    async with await psycopg.AsyncConnection.connect(outbox_db, autocommit=True) as conn:
        await apply_states(conn, [attempting, accepted])
        applied = await apply_batch(conn, [], [(bad, reason), (sent, "late"), (999_999, "gone")])
        assert applied == Applied(moved=0, invalid=1)
        # Replayed: nothing changes, no second event.
        assert await apply_batch(conn, [], [(bad, reason)]) == Applied(0, 0)
        # A state record for an INVALID job (a cancel the worker answered) moves nothing.
        ghost = JobRef(bad, "bad-1", "i", "5511987654321")
        cancelled = transition(ghost, None, JobStatus.CANCELLED, reason="cancel requested")
        assert await apply_states(conn, [cancelled]) == 0
        rows = await (
            await conn.execute(
                "SELECT id, status, last_error, state_version FROM outbox_jobs "
                "WHERE id = ANY(%s) ORDER BY id",
                ([bad, sent],),
            )
        ).fetchall()
        events = await (
            await conn.execute(
                "SELECT from_status, to_status, actor, reason, version FROM outbox_job_events "
                "WHERE job_id = %s ORDER BY version",
                (bad,),
            )
        ).fetchall()
    assert rows == [(bad, "INVALID", reason, 1), (sent, "ACCEPTED", None, 2)]
    assert events == [("PENDING", "INVALID", "relay", reason, 1)]
