"""The application API on a real PostgreSQL: validation writes nothing, keys are idempotent."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

from connectors.outbox.enqueue import InvalidIntent, enqueue, enqueue_async
from connectors.outbox.migrate import migrate
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
