"""ReplicationStream against a real PostgreSQL (15 or 18, ``DEVSTACK_POSTGRES``) started
in a temp dir for this module."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest

from connectors.cdc.lsn import Lsn
from connectors.cdc.pgoutput import Begin, Commit, Insert, PgOutputDecoder, PgOutputMessage, Update
from connectors.cdc.replication_messages import XLogData
from connectors.cdc.replication_stream import (
    ReplicationStream,
    ReplicationStreamClosed,
    SlotInUse,
    SlotNotFound,
)
from devtools.stack.devstack import PostgresCluster

pytestmark = pytest.mark.integration

DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def postgres_dsn() -> Iterator[str]:
    """A throwaway wal_level=logical cluster of the version DEVSTACK_POSTGRES chooses."""
    with PostgresCluster() as cluster:
        yield cluster.dsn()


async def execute(dsn: str, *statements: str) -> None:
    """Run statements in one transaction (or, for one statement, autocommit-like)."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for statement in statements:
            await conn.execute(statement)


async def setup_table(dsn: str, name: str) -> None:
    """Table, insert-only publication and pgoutput slot, all named ``name``."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f"CREATE TABLE {name} (id BIGSERIAL PRIMARY KEY, payload JSONB)")
        await conn.execute(f"CREATE PUBLICATION {name} FOR TABLE {name} WITH (publish = 'insert')")
        await conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))


async def insert_tx(dsn: str, table: str, *payloads: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for payload in payloads:
            await conn.execute(
                f"INSERT INTO {table} (payload) VALUES (%s)",
                (payload,),
            )


Transaction = tuple[Begin, list[PgOutputMessage], Commit]


async def read_transactions(
    stream: ReplicationStream, decoder: PgOutputDecoder, count: int
) -> list[Transaction]:
    """Read until ``count`` whole transactions arrived, or fail at the deadline."""
    transactions: list[Transaction] = []
    current: tuple[Begin, list[PgOutputMessage]] | None = None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while len(transactions) < count:
        assert loop.time() < deadline, f"only {len(transactions)}/{count} transactions arrived"
        message = await stream.read(timeout_s=0.5)
        if not isinstance(message, XLogData):
            continue
        decoded = decoder.decode(message.payload)
        if isinstance(decoded, Begin):
            assert current is None, "Begin inside a transaction"
            current = (decoded, [])
        elif isinstance(decoded, Commit):
            assert current is not None, "Commit without Begin"
            transactions.append((current[0], current[1], decoded))
            current = None
        else:
            assert current is not None, f"{decoded!r} outside a transaction"
            current[1].append(decoded)
    return transactions


def inserted_payloads(transaction: Transaction) -> list[str | None]:
    rows = [m for m in transaction[1] if isinstance(m, Insert)]
    return [row.new["payload"] for row in rows]


async def confirmed_flush(dsn: str, slot: str) -> tuple[Lsn | None, bool]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT confirmed_flush_lsn::text, active FROM pg_replication_slots"
            " WHERE slot_name = %s",
            (slot,),
        )
        row = await cursor.fetchone()
    assert row is not None, f"slot {slot} missing"
    return (None if row[0] is None else Lsn.parse(row[0])), bool(row[1])


async def test_resumes_after_the_confirmed_transaction(postgres_dsn: str) -> None:
    dsn, name = postgres_dsn, "resume"
    await setup_table(dsn, name)
    await insert_tx(dsn, name, '{"tx": 1, "n": 1}', '{"tx": 1, "n": 2}')
    await insert_tx(dsn, name, '{"tx": 2, "text": "olá ✓"}')
    await insert_tx(dsn, name, '{"tx": 3, "n": 1}', '{"tx": 3, "n": 2}')

    async with ReplicationStream(dsn, slot=name, publication=name) as stream:
        await stream.start()
        assert stream.identity is not None
        assert stream.identity.dbname == "postgres"
        first = await read_transactions(stream, PgOutputDecoder(), 3)
        assert [inserted_payloads(t) for t in first] == [
            ['{"n": 1, "tx": 1}', '{"n": 2, "tx": 1}'],
            ['{"tx": 2, "text": "olá ✓"}'],
            ['{"n": 1, "tx": 3}', '{"n": 2, "tx": 3}'],
        ]
        second_end = first[1][2].end_lsn
        await stream.send_status(flush=second_end)
        with pytest.raises(ValueError, match="backwards"):
            await stream.send_status(flush=first[0][2].end_lsn)

    # Wait (by polling) until the server has released the slot and holds our position.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while (state := await confirmed_flush(dsn, name)) != (second_end, False):
        assert loop.time() < deadline, f"slot state {state}, expected {second_end} inactive"
        await asyncio.sleep(0.05)

    async with ReplicationStream(dsn, slot=name, publication=name) as stream:
        await stream.start(Lsn.ZERO)
        (redelivered,) = await read_transactions(stream, PgOutputDecoder(), 1)
        # Had transaction 2 come again it would have arrived first (commit order).
        assert redelivered[0].xid == first[2][0].xid
        assert redelivered[2].end_lsn == first[2][2].end_lsn
        assert inserted_payloads(redelivered) == inserted_payloads(first[2])


async def test_second_consumer_of_an_active_slot_gets_slot_in_use(postgres_dsn: str) -> None:
    dsn, name = postgres_dsn, "busy"
    await setup_table(dsn, name)
    async with ReplicationStream(dsn, slot=name, publication=name) as first:
        await first.start()
        second = ReplicationStream(dsn, slot=name, publication=name)
        with pytest.raises(SlotInUse, match="active for PID") as caught:
            await second.start()
        assert caught.value.sqlstate == "55006"
        assert caught.value.retriable is True
        await second.close()
        # The first consumer is unaffected.
        await insert_tx(dsn, name, '{"still": "streaming"}')
        (transaction,) = await read_transactions(first, PgOutputDecoder(), 1)
        assert inserted_payloads(transaction) == ['{"still": "streaming"}']


async def test_missing_slot_is_reported(postgres_dsn: str) -> None:
    async with ReplicationStream(postgres_dsn, slot="no_such_slot", publication="p") as stream:
        with pytest.raises(SlotNotFound, match="does not exist") as caught:
            await stream.start()
    assert caught.value.retriable is False


async def test_missing_publication_ends_the_stream_for_good(postgres_dsn: str) -> None:
    dsn, name = postgres_dsn, "no_publication"
    await setup_table(dsn, name)
    await insert_tx(dsn, name, '{"n": 1}')
    async with ReplicationStream(dsn, slot=name, publication="absent") as stream:
        await stream.start()  # pgoutput only looks the publication up at the first change
        with pytest.raises(ReplicationStreamClosed, match='publication "absent"') as caught:
            await read_transactions(stream, PgOutputDecoder(), 1)
    assert caught.value.sqlstate == "42704"
    assert caught.value.retriable is False


async def test_connects_by_host_name_with_a_key_value_dsn(postgres_dsn: str) -> None:
    dsn, name = postgres_dsn, "by_name"
    await setup_table(dsn, name)
    port = psycopg.conninfo.conninfo_to_dict(dsn)["port"]
    # "localhost" may resolve to ::1 first, where nothing listens: libpq must fall back.
    key_value = f"host=localhost port={port} user=postgres dbname=postgres"
    async with ReplicationStream(key_value, slot=name, publication=name) as stream:
        await stream.start()
        await insert_tx(dsn, name, '{"via": "localhost"}')
        (transaction,) = await read_transactions(stream, PgOutputDecoder(), 1)
    assert inserted_payloads(transaction) == ['{"via": "localhost"}']


async def test_updates_are_not_published(postgres_dsn: str) -> None:
    dsn, name = postgres_dsn, "insert_only"
    await setup_table(dsn, name)
    await insert_tx(dsn, name, '{"n": 1}')
    await execute(dsn, f"UPDATE {name} SET payload = '{{\"n\": 99}}'")
    await insert_tx(dsn, name, '{"n": 2}')
    async with ReplicationStream(dsn, slot=name, publication=name) as stream:
        await stream.start()
        transactions = await read_transactions(stream, PgOutputDecoder(), 2)
    # PostgreSQL 15 skips the now-empty UPDATE transaction altogether.
    assert [inserted_payloads(t) for t in transactions] == [['{"n": 1}'], ['{"n": 2}']]
    changes = [m for t in transactions for m in t[1]]
    assert not any(isinstance(m, Update) for m in changes)


async def test_large_transaction_arrives_whole_and_in_order(postgres_dsn: str) -> None:
    dsn, name = postgres_dsn, "bulk"
    rows = 20_000
    await setup_table(dsn, name)
    await execute(
        dsn,
        f"INSERT INTO {name} (payload)"
        f" SELECT jsonb_build_object('n', n) FROM generate_series(1, {rows}) AS n",
    )
    async with ReplicationStream(dsn, slot=name, publication=name) as stream:
        await stream.start()
        (transaction,) = await read_transactions(stream, PgOutputDecoder(), 1)
    ids = [int(m.new["id"] or 0) for m in transaction[1] if isinstance(m, Insert)]
    assert ids == list(range(1, rows + 1))


async def test_read_times_out_with_none_and_reports_a_dropped_connection(
    postgres_dsn: str,
) -> None:
    dsn, name = postgres_dsn, "dropped"
    await setup_table(dsn, name)
    async with ReplicationStream(dsn, slot=name, publication=name) as stream:
        await stream.start()
        while (message := await stream.read(timeout_s=0.2)) is not None:
            assert not isinstance(message, XLogData), "nothing was written"
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                " WHERE slot_name = %s",
                (name,),
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        with pytest.raises(ReplicationStreamClosed) as caught:
            while loop.time() < deadline:
                await stream.read(timeout_s=0.5)
        assert caught.value.retriable is True, caught.value
        # Once closed, it stays closed.
        with pytest.raises(ReplicationStreamClosed):
            await stream.read(timeout_s=0.1)
    await stream.close()  # idempotent
