"""The state sink's write-back on a real PostgreSQL: never backwards, replays harmless."""

from __future__ import annotations

import psycopg
import pytest

from connectors.outbox.enqueue import enqueue
from connectors.sink.state_sink import apply_states
from streams.contract import JobStatus
from streams.state_machine import JobRef, transition

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
