"""The application API on a real PostgreSQL: validation writes nothing, keys are idempotent."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

from connectors.cdc.scheduled_release import release_due
from connectors.outbox.enqueue import InvalidIntent, enqueue, enqueue_async
from connectors.outbox.migrate import migrate
from connectors.outbox.schedule import NotRescheduled, reschedule, reschedule_async
from tests.integration.support import count_rows

pytestmark = pytest.mark.integration

GOOD = {"instance_id": "shop-1", "to": "+55 11 98765-4321", "text": "hello"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"text": ""}, "text is empty"),
        ({"text": "   "}, "text is empty"),
        ({"text": "x" * 4097}, "limit is 4096"),
        ({"to": "12345"}, "not an international phone number"),
        ({"to": "someone@example.com"}, "not a WhatsApp JID"),
        ({"to": ""}, "recipient is missing"),
        ({"idempotency_key": ""}, "idempotency_key is required"),
        ({"priority": "urgent"}, "unknown priority"),
        ({"instance_id": ""}, "instance_id is required"),
        ({"expires_at": dt.datetime(2030, 1, 1)}, "timezone-aware"),
        ({"send_at": dt.datetime(2030, 1, 1)}, "send_at must be timezone-aware"),
        (
            {
                "send_at": dt.datetime(2030, 1, 2, tzinfo=dt.UTC),
                "expires_at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
            },
            "send_at must be before expires_at",
        ),
        ({"timezone": "Mars/Olympus"}, "not an IANA timezone"),
    ],
)
def test_invalid_intent_raises_and_writes_nothing(
    outbox_db: str, overrides: dict[str, object], message: str
) -> None:
    before = count_rows(outbox_db, "SELECT count(*) FROM outbox_jobs")
    kwargs: dict[str, object] = {**GOOD, "idempotency_key": f"bad-{message}", **overrides}
    with psycopg.connect(outbox_db) as conn:
        with pytest.raises(InvalidIntent, match=message):
            enqueue(conn, **kwargs)  # type: ignore[arg-type]
        conn.commit()
    assert count_rows(outbox_db, "SELECT count(*) FROM outbox_jobs") == before


def test_text_of_exactly_4096_characters_is_accepted(outbox_db: str) -> None:
    with psycopg.connect(outbox_db) as conn:
        job_id = enqueue(conn, **{**GOOD, "text": "y" * 4096}, idempotency_key="max-len")
    assert count_rows(outbox_db, "SELECT count(*) FROM outbox_jobs WHERE id = %s", (job_id,)) == 1


def test_same_key_twice_returns_existing_job_without_second_row(outbox_db: str) -> None:
    with psycopg.connect(outbox_db) as conn:
        first = enqueue(conn, **GOOD, idempotency_key="order-7")
        conn.commit()
        second = enqueue(conn, **GOOD, idempotency_key="order-7")
        conn.commit()
    assert first == second
    assert (
        count_rows(outbox_db, "SELECT count(*) FROM outbox_jobs WHERE idempotency_key = 'order-7'")
        == 1
    )


def test_enqueue_joins_the_callers_transaction(outbox_db: str) -> None:
    with psycopg.connect(outbox_db) as conn:
        enqueue(conn, **GOOD, idempotency_key="rolled-back")
        conn.rollback()
    assert (
        count_rows(
            outbox_db, "SELECT count(*) FROM outbox_jobs WHERE idempotency_key = 'rolled-back'"
        )
        == 0
    )


async def test_async_flavour_validates_and_is_idempotent(outbox_db: str) -> None:
    async with await psycopg.AsyncConnection.connect(outbox_db) as conn:
        with pytest.raises(InvalidIntent):
            await enqueue_async(conn, **{**GOOD, "text": ""}, idempotency_key="async-bad")
        first = await enqueue_async(conn, **GOOD, idempotency_key="async-1")
        again = await enqueue_async(conn, **GOOD, idempotency_key="async-1")
        await conn.commit()
    assert first == again
    assert (
        count_rows(
            outbox_db, "SELECT count(*) FROM outbox_jobs WHERE idempotency_key LIKE 'async-%%'"
        )
        == 1
    )


def test_plain_sql_insert_gets_defaults_and_derived_conversation(outbox_db: str) -> None:
    with psycopg.connect(outbox_db) as conn:
        conn.execute(
            "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) VALUES (%s, %s, %s)",
            ("shop-1", '{"type":"text","to":"+55 11 91234-5678","text":"plain"}', "plain-1"),
        )
        row = conn.execute(
            "SELECT status, attempts, max_attempts, conversation_key, priority, state_version "
            "FROM outbox_jobs WHERE idempotency_key = 'plain-1'"
        ).fetchone()
    assert row == ("PENDING", 0, 5, "5511912345678", "operational", 0)


def test_migrate_is_idempotent(outbox_db: str) -> None:
    assert migrate(outbox_db) == []
    assert count_rows(outbox_db, "SELECT count(*) FROM schema_migrations") >= 1


# --- scheduled sends (migration 0008) ----------------------------------------------------------


def _status(dsn: str, job_id: int) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT status FROM outbox_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def test_a_row_due_later_is_scheduled_and_one_due_now_or_unset_is_pending(outbox_db: str) -> None:
    with psycopg.connect(outbox_db) as conn:
        later, past, unset = (
            int(row[0])
            for row in conn.execute(
                "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key, next_retry_at) "
                "VALUES ('i', '{}', 'sql-later', now() + interval '1 hour'), "
                "('i', '{}', 'sql-past', now() - interval '1 second'), "
                "('i', '{}', 'sql-unset', NULL) RETURNING id"
            ).fetchall()
        )
        api = enqueue(
            conn,
            **GOOD,
            idempotency_key="api-later",
            send_at=dt.datetime.now(dt.UTC) + dt.timedelta(days=1),
            timezone="America/Sao_Paulo",
        )
        conn.commit()
    assert [_status(outbox_db, j) for j in (later, past, unset, api)] == [
        "SCHEDULED",
        "PENDING",
        "PENDING",
        "SCHEDULED",
    ]
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        row = conn.execute("SELECT payload FROM outbox_jobs WHERE id = %s", (api,)).fetchone()
    assert row is not None and row[0]["timezone"] == "America/Sao_Paulo"


async def test_reschedule_moves_a_scheduled_job_and_refuses_a_released_one(outbox_db: str) -> None:
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with psycopg.connect(outbox_db) as conn:
        job = enqueue(conn, **GOOD, idempotency_key="resched-1", send_at=soon)
        now_job = enqueue(conn, **GOOD, idempotency_key="resched-now")
        conn.commit()
        later = soon + dt.timedelta(hours=1)
        assert reschedule(conn, job, later) == later
        with pytest.raises(NotRescheduled, match="PENDING, not SCHEDULED"):
            reschedule(conn, now_job, later)
        with pytest.raises(NotRescheduled, match="no outbox job"):
            reschedule(conn, 10**12, later)
        with pytest.raises(NotRescheduled, match="timezone-aware"):
            reschedule(conn, job, dt.datetime(2030, 1, 1))
        conn.commit()  # the refusals left the transaction usable
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="not SCHEDULED"):
            conn.execute("SELECT zapstream_reschedule(%s, now())", (now_job,))
        conn.rollback()
    async with await psycopg.AsyncConnection.connect(outbox_db) as aconn:
        assert await reschedule_async(aconn, job, soon) == soon
        await aconn.commit()
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        row = conn.execute("SELECT next_retry_at FROM outbox_jobs WHERE id = %s", (job,)).fetchone()
        assert row is not None and row[0] == soon
        # The article's "send it now" would leave it PENDING with nothing streamed: refused.
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="zapstream_reschedule"):
            conn.execute("UPDATE outbox_jobs SET status = 'PENDING' WHERE id = %s", (job,))


async def test_the_release_takes_due_jobs_in_due_order_in_batches_never_a_cancelled_one(
    outbox_db: str,
) -> None:
    with psycopg.connect(outbox_db) as conn:
        # Due in 1..5 s, inserted out of order; one of them cancelled before it is due.
        ids = {
            offset: enqueue(
                conn,
                **GOOD,
                idempotency_key=f"rel-{offset}",
                send_at=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=offset),
            )
            for offset in (3, 1, 5, 2, 4)
        }
        conn.execute("SELECT zapstream_cancel('rel-4', 'the visit was moved')")
        conn.commit()
        # Move them all into the past, keeping their order: they are due now.
        conn.execute(
            "UPDATE outbox_jobs SET next_retry_at = next_retry_at - interval '1 minute' "
            "WHERE idempotency_key LIKE 'rel-%%'"
        )
        conn.commit()
    async with await psycopg.AsyncConnection.connect(outbox_db, autocommit=True) as aconn:
        assert await release_due(aconn, batch=2) == 2
        assert await release_due(aconn, batch=2) == 2  # rel-3 and rel-5: rel-4 is skipped
        assert await release_due(aconn, batch=2) == 0
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        released = [
            int(row[0])
            for row in conn.execute(
                "SELECT job_id FROM outbox_replays WHERE actor = 'scheduler' AND "
                "idempotency_key LIKE 'rel-%' ORDER BY id"
            )
        ]
    assert released == [ids[1], ids[2], ids[3], ids[5]]
    assert [_status(outbox_db, ids[o]) for o in (1, 2, 3, 4, 5)] == [
        "PENDING",
        "PENDING",
        "PENDING",
        "SCHEDULED",  # cancelled: the worker settles it CANCELLED; never released
        "PENDING",
    ]


def test_zapstream_jobs_reschedule_moves_a_scheduled_job_and_refuses_a_released_one(
    outbox_db: str,
) -> None:
    import io

    from connectors.ops.jobs_cli import EXIT_DONE, EXIT_REFUSED, reschedule_job

    with psycopg.connect(outbox_db) as conn:
        later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=3)
        job = enqueue(conn, **GOOD, idempotency_key="cli-resched", send_at=later)
        now_job = enqueue(conn, **GOOD, idempotency_key="cli-resched-now")
        conn.commit()
    out = io.StringIO()
    assert reschedule_job(outbox_db, job, later + dt.timedelta(hours=1), out=out) == EXIT_DONE
    assert f"job {job} rescheduled: due" in out.getvalue()
    out = io.StringIO()
    assert reschedule_job(outbox_db, now_job, later, out=out) == EXIT_REFUSED
    assert "not rescheduled" in out.getvalue() and "PENDING" in out.getvalue()


async def test_the_release_brakes_an_instance_with_two_batches_not_yet_attempted(
    outbox_db: str,
) -> None:
    """A crowd due at once enters the stream as fast as the worker attempts it: an instance
    with two batches released and still PENDING gets no more, the others go on."""
    past = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
    with psycopg.connect(outbox_db) as conn:
        crowd = [
            enqueue(
                conn,
                **{**GOOD, "instance_id": "brake-a"},
                idempotency_key=f"brake-a-{n}",
                send_at=past,
                priority="bulk",
            )
            for n in range(7)
        ]
        other = [
            enqueue(
                conn,
                **{**GOOD, "instance_id": "brake-b"},
                idempotency_key=f"brake-b-{n}",
                send_at=past + dt.timedelta(seconds=1),
            )
            for n in range(2)
        ]
        conn.commit()
        conn.execute(
            "UPDATE outbox_jobs SET next_retry_at = next_retry_at - interval '1 minute' "
            "WHERE idempotency_key LIKE 'brake-%%'"
        )
        conn.commit()
    async with await psycopg.AsyncConnection.connect(outbox_db, autocommit=True) as aconn:
        assert await release_due(aconn, batch=2) == 2  # brake-a 0, 1
        assert await release_due(aconn, batch=2) == 2  # brake-a 2, 3: two batches waiting
        assert await release_due(aconn, batch=2) == 2  # brake-a braked: brake-b's two
        assert await release_due(aconn, batch=2) == 0
        assert [_status(outbox_db, j) for j in crowd].count("PENDING") == 4
        assert {_status(outbox_db, j) for j in other} == {"PENDING"}
        # The worker attempts two of them (the sink's write: a new state_version).
        with psycopg.connect(outbox_db, autocommit=True) as conn:
            conn.execute(
                "UPDATE outbox_jobs SET status = 'ATTEMPTING', state_version = state_version + 1 "
                "WHERE id = ANY(%s)",
                (crowd[:2],),
            )
        assert await release_due(aconn, batch=2) == 2  # brake-a 4, 5
        assert await release_due(aconn, batch=2) == 0
    assert [_status(outbox_db, j) for j in crowd] == [
        *["ATTEMPTING"] * 2,
        *["PENDING"] * 4,
        "SCHEDULED",
    ]
